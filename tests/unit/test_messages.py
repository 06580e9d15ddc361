"""Known runtime messages -> cause and nodes, on a line onnxruntime-web really printed
(tests/fixtures/ort_web_logs.json) and on the table's own rules."""

from __future__ import annotations

from saved import fixture_json
from web_fixtures import softsign_mlp

from matrix.inputs import examples
from matrix import messages


def test_a_recorded_webgpu_kernel_line_names_its_op_and_node():
    entry = next(r for r in fixture_json("ort_web_logs.json") if (r["target"], r["policy"]) == ("ort-web-webgpu", "softsign_mlp"))
    line = next(line for line in entry["log"] if "kernel not found" in line)
    assert messages.explain("ort-web-webgpu", line, softsign_mlp()) == (
        "cause: onnxruntime-web's WebGPU EP has no kernel for Softsign; node: soft0")


def test_a_message_is_only_explained_for_the_targets_it_comes_from():
    webgl = "cannot resolve operator 'ArgMax' with opsets: ai.onnx v17"
    assert messages.explain("ort-web-webgl", webgl, examples.discrete_mlp()).endswith("; node: greedy")
    assert messages.explain("ort-web-wasm", webgl, examples.discrete_mlp()) is None
    assert messages.explain("ort-web-webgl", "an unknown failure", examples.discrete_mlp()) is None


def test_the_first_matching_entry_wins_and_nodes_are_listed_once():
    flex = "Node number 2 (FlexSoftsign) failed to prepare. Select TensorFlow op(s) are not supported"
    line = messages.explain("tflite", flex, softsign_mlp())
    assert line.startswith("cause: onnx2tf lowered Softsign to a TensorFlow (Flex) op") and line.endswith("; node: soft0")


def test_every_known_message_states_a_target_a_pattern_and_a_cause():
    for known in messages.KNOWN:
        assert known.targets and known.pattern.pattern and known.cause
        assert set(known.pattern.groupindex) >= {field for field in ("op", "version") if "{" + field + "}" in known.cause}


def test_a_parameter_torch_shares_through_an_identity_is_named_as_onnx2torchs_cause():
    """torch's exporter writes one initializer for parameters with equal values (SB3's zero-initialised CNN biases)
    and an Identity for each repeat; onnx2torch's Conv looks the bias up among initializers and raises a bare
    KeyError (seen: SB3 CnnPolicy on uint8 pixels, untrained)."""
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np

    zeros = numpy_helper.from_array(np.zeros(4, np.float32), "cnn.2.bias")
    weight = numpy_helper.from_array(np.ones((4, 4, 1, 1), np.float32), "cnn.4.weight")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["cnn.2.bias"], ["cnn.4.bias"], name="Identity_2"),
         helper.make_node("Conv", ["obs", "cnn.4.weight", "cnn.4.bias"], ["out"], name="/cnn/cnn.4/Conv")], "g",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4, 2, 2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 4, 2, 2])], [zeros, weight])
    line = messages.explain("coreml", "prepare: RuntimeError: KeyError: 'cnn.4.bias'", helper.make_model(graph))
    assert line == ("cause: onnx2torch reads a layer's weights from initializers only, and cnn.4.bias is computed by "
                    "a node (torch's exporter writes an Identity where parameters are equal): simplifying the graph "
                    "folds it (--assist's simplify); nodes: Identity_2, /cnn/cnn.4/Conv")
    for other in ("KeyError: 'not_in_the_graph'", "KeyError: 'cnn.4.weight'"):  # unknown, or an initializer
        assert messages.explain("coreml", other, helper.make_model(graph)) is None


def test_an_ir_version_the_runtime_predates_says_whether_lowering_it_is_enough():
    """Seen from onnxruntime-web 1.30 on an opset 28 export saved by onnx 1.23: opset 28 itself needs IR 14."""
    said = "Unsupported model IR version: 14, max supported IR version: 13"
    proto = examples.continuous_mlp()
    proto.opset_import[0].version = 28
    assert messages.explain("ort-web-wasm", said, proto) == (
        "cause: this onnxruntime reads ONNX files up to IR version 13 and the model is saved at IR 14, and its opsets "
        "(ai.onnx 28) need IR 14: convert it to a lower opset (onnx.version_converter) and save it at that opset's IR")
    assert messages.explain("tflite", said, proto) is None
