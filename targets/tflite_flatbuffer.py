"""What a .tflite file holds, read from its flatbuffer: op counts, how much of it is really
quantized, and the notes the report shows about it (works for files the interpreter cannot prepare)."""

from __future__ import annotations

from .tflite_conversion import MAX_CALIBRATION_SAMPLES
from .tflite_provenance import OnnxInterface


def op_inventory(content: bytes) -> dict[str, int]:
    """TFLite op counts read from the flatbuffer (works for files the interpreter cannot prepare)."""
    from ai_edge_litert import schema_py_generated as schema

    names = {code: name for name, code in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    model = schema.Model.GetRootAsModel(content, 0)
    codes = []
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        custom = code.CustomCode()
        codes.append(custom.decode() if builtin == schema.BuiltinOperator.CUSTOM and custom else names.get(builtin, str(builtin)))
    counts: dict[str, int] = {}
    for s in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(s)
        for o in range(subgraph.OperatorsLength()):
            name = codes[subgraph.Operators(o).OpcodeIndex()]
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def variant_notes(variant: str, recipe: str, counted: dict | None = None) -> list[str]:
    """What the file is, stated from what it holds (`counted`), not from the recipe's name."""
    if variant == "int8" and counted is not None and not counted["quantized_weights"]:
        return [f"int8 in name only: the quantizer left all {counted['float_weights']} weight tensors float "
                "(TF's dynamic-range quantization skips small tensors)"]
    if recipe == "full":
        return [f"full-integer int8 (weights and activations), float32 I/O, calibrated on up to "
                f"{MAX_CALIBRATION_SAMPLES} observations"]
    return {
        "fp32": [],
        "fp16": ["fp16 weights dequantized to float32 at load; compute and I/O in float32"],
        "int8": ["dynamic-range int8: int8 weights, activations quantized per row at run time, float32 I/O"],
    }[variant]


WEIGHT_OPS = {"FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "BATCH_MATMUL", "TRANSPOSE_CONV", "UNIDIRECTIONAL_SEQUENCE_LSTM"}


def quantization(content: bytes) -> dict[str, int]:
    """Weight ops whose weights are 8-bit, and constant weight tensors (rank >= 2) by type. No op scales activations
    per call (`per_call_ops`, see matrix/run/variants.quantization): full-integer files use the calibrated scales,
    and dynamic-range ops quantize each row on its own (measured: row 0 alone and in a batch of 64 rows 20x larger
    equal within 2.4e-7, XNNPACK and builtin kernels; ORT's dynamic int8 moved it 0.14)."""
    from ai_edge_litert import schema_py_generated as schema

    integer = {schema.TensorType.INT8, schema.TensorType.UINT8, schema.TensorType.INT4}
    names = {code: name for name, code in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    model = schema.Model.GetRootAsModel(content, 0)
    opcodes = [names.get(max(model.OperatorCodes(i).BuiltinCode(), model.OperatorCodes(i).DeprecatedBuiltinCode()))
               for i in range(model.OperatorCodesLength())]
    counted = {"quantized_ops": 0, "float_ops": 0, "quantized_weights": 0, "float_weights": 0, "per_call_ops": 0}
    for s in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(s)
        constant = {
            t for t in range(subgraph.TensorsLength())
            if _holds_data(model.Buffers(subgraph.Tensors(t).Buffer())) and subgraph.Tensors(t).ShapeLength() >= 2
        }
        for t in constant:
            counted["quantized_weights" if subgraph.Tensors(t).Type() in integer else "float_weights"] += 1
        for o in range(subgraph.OperatorsLength()):
            op = subgraph.Operators(o)
            if opcodes[op.OpcodeIndex()] in WEIGHT_OPS and op.InputsLength() > 1:
                weight = op.Inputs(1)
                quantized = weight in constant and subgraph.Tensors(weight).Type() in integer
                counted["quantized_ops" if quantized else "float_ops"] += 1
    return counted


def _holds_data(buffer) -> bool:
    return buffer is not None and (buffer.DataLength() > 0 or buffer.Offset() > 1)


def flex_notes(inventory: dict[str, int]) -> list[str]:
    flex = sorted(op for op in inventory if op.startswith("Flex"))
    if not flex:
        return []
    return [f"Select TF (Flex) ops {', '.join(flex)}: the LiteRT interpreter has no Flex delegate and cannot run them"]


def layout_notes(interface: OnnxInterface, inventory: dict[str, int]) -> list[str]:
    """Say so when the converter changed a layout (inputs kept NCHW still compute in NHWC)."""
    notes = []
    image_inputs = [name for name, dims in interface.onnx_inputs.items() if 3 <= len(dims) <= 5]
    if image_inputs and inventory.get("TRANSPOSE"):
        notes.append(f"inputs {', '.join(image_inputs)} kept NCHW; onnx2tf computes in NHWC and inserted "
                     f"{inventory['TRANSPOSE']} TRANSPOSE op(s)")
    return notes
