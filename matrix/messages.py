"""Known runtime and converter messages -> their cause in plain words, with the nodes involved.

A runtime's words are often not actionable ("Invalid input shape of C"), and
some name no node. Each entry below is a message seen from a real runtime or
converter (see shared ENVIRONMENT notes and the tests); `explain` turns a FAIL
message into one extra reason that states the cause, the preparation that
removes it where one exists, and the nodes of the model it concerns: the node
the runtime named, else the nodes matching what it complained about.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import onnx

NodeFinder = Callable[[onnx.ModelProto, "re.Match[str]"], list[str]]


def _by_op(group: str) -> NodeFinder:
    return lambda proto, match: [_name(n) for n in proto.graph.node if n.op_type == match.group(group)]


def _gemm_rank0_bias(proto: onnx.ModelProto, match) -> list[str]:
    ranks = {t.name: len(t.dims) for t in proto.graph.initializer}
    return [_name(n) for n in proto.graph.node if n.op_type == "Gemm" and len(n.input) > 2 and ranks.get(n.input[2]) == 0]


def _gemm_without_bias(proto: onnx.ModelProto, match) -> list[str]:
    return [_name(n) for n in proto.graph.node if n.op_type == "Gemm" and (len(n.input) < 3 or not n.input[2])]


def _reshape_allowzero(proto: onnx.ModelProto, match) -> list[str]:
    return [_name(n) for n in proto.graph.node if n.op_type == "Reshape"
            and any(a.name == "allowzero" and a.i == 1 for a in n.attribute)]


def _expand(proto: onnx.ModelProto, match) -> list[str]:
    return [_name(n) for n in proto.graph.node if n.op_type == "Expand"]


def _named(group: str) -> NodeFinder:
    return lambda proto, match: [match.group(group)]


def _flex_candidates(proto: onnx.ModelProto, match) -> list[str]:
    return [_name(n) for n in proto.graph.node if n.op_type in ("Softsign", "Softplus", "Erf", "Mod")]


def _computed_weight(proto: onnx.ModelProto, match) -> list[str]:
    """The node computing the tensor a converter looked up among initializers, then the nodes reading it."""
    tensor = match.group("tensor")
    if tensor in {t.name for t in proto.graph.initializer}:
        return []
    makers = [_name(n) for n in proto.graph.node if tensor in n.output]
    return makers + [_name(n) for n in proto.graph.node if tensor in n.input] if makers else []


def _ir_fix(proto: onnx.ModelProto, match) -> dict[str, str]:
    """The IR the model's opsets need, and so whether lowering its ir_version is enough."""
    needed = onnx.helper.find_min_ir_version_for(list(proto.opset_import), ignore_unknown=True)
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in proto.opset_import)
    if needed <= int(match.group("max")):
        return {"fix": f"while its opsets ({opsets}) need only IR {needed}: set the model's ir_version to {needed} before saving"}
    return {"fix": f"and its opsets ({opsets}) need IR {needed}: convert it to a lower opset (onnx.version_converter) "
                   "and save it at that opset's IR"}


@dataclass(frozen=True)
class KnownMessage:
    targets: tuple[str, ...]  # target-name prefixes this message comes from
    pattern: re.Pattern
    cause: str  # str.format with the pattern's named groups
    nodes: NodeFinder
    needs_nodes: bool = False  # a pattern this general is this cause only where the model has such nodes
    facts: Callable[[onnx.ModelProto, "re.Match[str]"], dict[str, str]] | None = None  # more fields for `cause`, read from the model
    preparation: str = ""  # the graph preparation the cause names, which --assist tries first (matrix/assist/preparations.py)


KNOWN: tuple[KnownMessage, ...] = (
    KnownMessage(("ort-web-webgl",), re.compile(r"cannot resolve operator '(?P<op>\w+)'"),
                 "onnxruntime-web's WebGL backend has no {op} kernel and no CPU fallback, so the session fails "
                 "(--assist's preparations remove such ops: simplification folds shape ops, Min/Max -> Clip, the ArgMax head cut)", _by_op("op")),
    KnownMessage(("ort-web-webgl",), re.compile(r"Invalid input shape of C"),
                 "WebGL's Gemm cannot broadcast this bias (input C): a rank-0 bias, as jax2onnx exports it, "
                 "needs rank 1 (the gemm-bias-rank1 rewrite)", _gemm_rank0_bias),
    KnownMessage(("ort-web-webgl",), re.compile(r"Uniform beta not found"),
                 "WebGL's Gemm shader declares no bias uniform for a Gemm without input C (an onnxruntime-web bug); "
                 "give the Gemm an explicit zero bias (the gemm-zero-bias rewrite)", _gemm_without_bias),
    KnownMessage(("coreml",), re.compile(r'"allowzero=1" is not implemented'),
                 "onnx2torch cannot convert Reshape with allowzero=1 (the reshape-allowzero rewrite sets 0 "
                 "when the shape has no zero)", _reshape_allowzero),
    KnownMessage(("coreml",), re.compile(r"onnx2torch has no (?P<op>\w+) converter at any opset"),
                 "onnx2torch (the CoreML route's ONNX reader) has no {op} converter at all: no opset conversion "
                 "makes this graph convert", _by_op("op")),
    KnownMessage(("coreml",), re.compile(r"onnx2torch has no (?P<op>\w+) converter for schema version (?P<version>\d+), "
                                         r"only for (?P<versions>\d+(?:, \d+)*)"),
                 "onnx2torch converts {op} only at schema versions {versions}, not {version}", _by_op("op")),
    KnownMessage(("coreml",), re.compile(r"KeyError: '(?P<tensor>[^']+)'"),
                 "onnx2torch reads a layer's weights from initializers only, and {tensor} is computed by a node "
                 "(torch's exporter writes an Identity where parameters are equal): simplifying the graph folds it "
                 "(--assist's simplify)", _computed_weight, needs_nodes=True),
    KnownMessage(("coreml",), re.compile(r"broadcast_to"),
                 "coremltools has no broadcast_to, which torch's expand from a dead shape subgraph becomes: "
                 "simplify the graph at a fixed batch", _expand),
    KnownMessage(("tflite",), re.compile(r"\(Flex(?P<op>\w+)\) failed to prepare"),
                 "onnx2tf lowered {op} to a TensorFlow (Flex) op and LiteRT has no Flex delegate "
                 "(rewrite the op, e.g. the softsign rewrite: x / (1 + |x|))", _by_op("op")),
    KnownMessage(("tflite",), re.compile(r"Select TensorFlow op|Flex\w*\b|FlexDelegate"),
                 "onnx2tf lowered an op to TensorFlow (Flex) ops and LiteRT has no Flex delegate "
                 "(rewrite the op, e.g. Softsign -> x / (1 + |x|))", _flex_candidates),
    KnownMessage(("ort-web-webgpu",), re.compile(r"Op type: (?P<op>\w+) node name: (?P<node>\S+)"),
                 "onnxruntime-web's WebGPU EP has no kernel for {op}", _named("node")),
    KnownMessage(("tract",), re.compile(r'Translating node #\d+ "(?P<node>[^"]+)" Gemm ToTypedTranslator.*'
                                        r"expected \S*F16 got \S*F32", re.DOTALL),
                 "tract expands an fp16 Gemm into ops whose output it types F32, and cannot open the file (tract's "
                 "own); a MatMul + Add computes the same and runs (the gemm-matmul rewrite)", _named("node"),
                 preparation="gemm-matmul"),
    KnownMessage(("ort",), re.compile(r"Unsupported model IR version: (?P<ir>\d+), max supported IR version: (?P<max>\d+)"),
                 "this onnxruntime reads ONNX files up to IR version {max} and the model is saved at IR {ir}, {fix}",
                 lambda proto, match: [], facts=_ir_fix),
    KnownMessage(("ort",), re.compile(r"running (?P<op>\w+) node\. Name:'(?P<node>[^']*)'"),
                 "onnxruntime failed inside a {op} node", _named("node")),
)


def explain(target: str, message: str, proto: onnx.ModelProto) -> str | None:
    """One reason line: the cause and the nodes it concerns, or None for an unknown message."""
    found = _known(target, message, proto)
    if found is None:
        return None
    known, match, nodes = found
    cause = known.cause.format(**match.groupdict(), **(known.facts(proto, match) if known.facts else {}))
    return f"cause: {cause}" + (f"; node{'s' if len(nodes) > 1 else ''}: {', '.join(nodes)}" if nodes else "")


def preparation_for(target: str, message: str, proto: onnx.ModelProto) -> str | None:
    """The graph preparation the message's known cause names, if it names one."""
    found = _known(target, message, proto)
    return (found[0].preparation or None) if found else None


def _known(target: str, message: str, proto: onnx.ModelProto) -> tuple[KnownMessage, re.Match, list[str]] | None:
    """The first entry of KNOWN that explains `message` from `target`, its match and the nodes it concerns."""
    for known in KNOWN:
        if not target.startswith(known.targets):
            continue
        match = known.pattern.search(message)
        if match is None:
            continue
        nodes = list(dict.fromkeys(known.nodes(proto, match)))
        if known.needs_nodes and not nodes:
            continue
        return known, match, nodes
    return None


def _name(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type} -> {node.output[0]}"

