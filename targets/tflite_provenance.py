"""TFLite -> ONNX provenance: which ONNX node each LiteRT op came from, and where it ran.

Pure functions on plain data (LiteRT's op and tensor details, the ONNX
interface, the layers onnx2tf built per node), so they are unit-tested on
details recorded from real conversions (tests/fixtures/litert_ops.json);
tflite_session.py reads those details from the interpreter and calls these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .base import PlacementRow

XNNPACK = "XNNPACK"
BUILTIN = "builtin kernels"


@dataclass(frozen=True)
class OnnxInterface:
    """The ONNX side of a converted file: names and dims of its inputs and outputs (dims: int, a symbolic
    name or None), the node producing each output, and the nodes in graph order."""

    onnx_inputs: dict[str, list]
    onnx_outputs: dict[str, list]
    output_producers: dict[str, str]
    node_order: list[str]


@dataclass(frozen=True)
class Provenance:
    """What ties a .tflite file back to its ONNX model: its interface, and the Keras layers onnx2tf
    built for each ONNX node (keyed by the ONNX node names, respelling undone)."""

    interface: OnnxInterface
    layers: dict[str, list[str]]

    @classmethod
    def from_converter(cls, interface: OnnxInterface, recorded_layers: dict[str, list[str]]) -> Provenance:
        return cls(interface, original_node_names(recorded_layers, interface.node_order))


@dataclass(frozen=True)
class OpDetails:
    """LiteRT's op details (`Interpreter._get_ops_details()`) with the ops a DELEGATE node took, found once."""

    ops: list[dict]
    delegated: frozenset[int]

    @classmethod
    def of(cls, ops: list[dict]) -> OpDetails:
        return cls(ops, frozenset(delegated_ops(ops)))

    def kernels(self) -> list[dict]:
        """The model's own ops (the DELEGATE nodes LiteRT appends are not ops of the model)."""
        return [op for op in self.ops if op["op_name"] != "DELEGATE"]

    def where(self, op: dict) -> str:
        return XNNPACK if op["index"] in self.delegated else BUILTIN


def tf_spellings(onnx_name: str) -> list[str]:
    """How onnx2tf may respell an ONNX name: ':' becomes '__', and when it writes signatures
    or int8 files a leading '/' becomes 'wa/' (SavedModel refuses both)."""
    plain = onnx_name.replace(":", "__")
    return list(dict.fromkeys([onnx_name, plain, re.sub("^/", "wa/", plain)]))


def map_signature(signature: dict[str, int], onnx_names: list[str], renamed_prefix: str | None) -> dict[str, int]:
    """ONNX name -> tensor index. Signature keys are the ONNX names as onnx2tf spells them,
    except that TF's full-integer converter renames outputs output_0, output_1, ... in the
    model's output order, and a file without a signature is read in order (`unsigned`):
    then, and only then, the position decides."""
    found = {name: next((s for s in tf_spellings(name) if s in signature), None) for name in onnx_names}
    if all(found.values()) and len(signature) == len(onnx_names):
        return {name: signature[key] for name, key in found.items()}
    positional = {f"{renamed_prefix}{i}": name for i, name in enumerate(onnx_names)} if renamed_prefix else {}
    if positional and set(signature) == set(positional):
        return {positional[key]: index for key, index in signature.items()}
    raise RuntimeError(f"cannot map the .tflite signature {sorted(signature)} to the ONNX names {onnx_names}")


def original_node_names(layers: dict[str, list[str]], node_order: list[str]) -> dict[str, list[str]]:
    """Key the recorded layers by the ONNX node names, undoing onnx2tf's respelling."""
    original = {spelling: name for name in node_order for spelling in tf_spellings(name)}
    return {original.get(name, name): names for name, names in layers.items()}


def channel_first_permutation(expected: list, got: list) -> tuple | None:
    """onnx2tf may leave a rank-3+ output channel-last: the permutation back to the ONNX dims
    `expected`, or None when `got` (the file's shape signature, -1 for dynamic) already matches."""
    rank = len(got)
    if rank < 3 or len(expected) != rank or _dims_match(expected, got):
        return None
    channel_first = (0, rank - 1, *range(1, rank - 1))
    return channel_first if _dims_match(expected, [got[axis] for axis in channel_first]) else None


def _dims_match(expected: list, got: list) -> bool:
    return all(not isinstance(e, int) or e == g or g == -1 for e, g in zip(expected, got))


def delegated_ops(ops: list[dict]) -> set[int]:
    """Indices of the ops a DELEGATE node replaced.

    The op list keeps the original nodes and appends one DELEGATE node per
    delegated partition, whose inputs/outputs are the partition's boundary
    tensors. Walking back from its outputs to its inputs finds the ops inside.
    """
    producer = {int(t): op for op in ops if op["op_name"] != "DELEGATE" for t in op["outputs"]}
    inside: set[int] = set()
    for delegate in (op for op in ops if op["op_name"] == "DELEGATE"):
        boundary = {int(t) for t in delegate["inputs"]}
        pending = [int(t) for t in delegate["outputs"]]
        while pending:
            op = producer.get(pending.pop())
            if op is None or op["index"] in inside:
                continue
            inside.add(op["index"])
            pending += [int(t) for t in op["inputs"] if int(t) >= 0 and int(t) not in boundary]
    return inside


def placement_rows(details: OpDetails, names: dict[int, str], provenance: Provenance, outputs: dict[str, int],
                   requested: str) -> list[PlacementRow]:
    """One row per (ONNX node, TFLite op, where it ran), from LiteRT's op details alone. An op no
    ONNX node can be found for keeps its own name."""
    to_node = onnx_node_lookup(provenance, outputs, details.kernels())
    order = {node: i for i, node in enumerate(provenance.interface.node_order)}
    rows: dict[tuple, PlacementRow] = {}
    for op in details.kernels():
        where = details.where(op)
        fallback = requested == XNNPACK and where != XNNPACK
        nodes = sorted(ops_onnx_nodes(op, names, to_node), key=lambda node: order.get(node, len(order))) or [f"{op['op_name']}#{op['index']}"]
        for node in nodes:
            rows.setdefault((node, op["op_name"], where), PlacementRow(node, op["op_name"], where, fallback))
    return list(rows.values())


def onnx_node_lookup(provenance: Provenance, outputs: dict[str, int], kernels: list[dict]) -> dict:
    """Keras layer name -> ONNX node, plus output tensors -> the ONNX node producing them.

    Output tensors carry the signature's name, not the layer's, so they are tied
    to the ONNX node producing that output; a converter-inserted DEQUANTIZE or
    QUANTIZE in front of an output is skipped to reach the op that computes it.
    """
    lookup = {layer: node for node, layers in provenance.layers.items() for layer in layers}
    producer = {int(t): op for op in kernels for t in op["outputs"]}
    for name, tensor in outputs.items():
        while producer.get(tensor, {}).get("op_name") in ("DEQUANTIZE", "QUANTIZE"):
            tensor = int(producer[tensor]["inputs"][0])
        lookup[tensor] = provenance.interface.output_producers[name]
    return lookup


def ops_onnx_nodes(op: dict, names: dict[int, str], to_node: dict) -> list[str]:
    """ONNX nodes behind one TFLite op, read from its output tensor names.

    A fused op's output is named after every TF op folded into it
    ("model/tf.nn.relu/Relu;model/tf.math.add/Add;model/tf.nn.convolution/..."),
    the second path component being the Keras layer onnx2tf built for an ONNX node.
    """
    nodes = []
    for tensor in (int(t) for t in op["outputs"]):
        if tensor in to_node:
            nodes.append(to_node[tensor])
        for part in names.get(tensor, "").split(";"):
            pieces = part.split("/")
            if len(pieces) >= 2 and pieces[1] in to_node:
                nodes.append(to_node[pieces[1]])
    return list(dict.fromkeys(nodes))
