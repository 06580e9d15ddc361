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
