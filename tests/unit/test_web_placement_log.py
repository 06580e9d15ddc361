"""Placement read from onnxruntime-web's verbose log: real logs recorded in headless Chromium
(tests/fixtures/ort_web_logs.json, re-recorded by tests/fixtures/record_ort_web_logs.py)."""

from __future__ import annotations

import pytest
from saved import fixture_json

from targets import REGISTRY
from targets.web_support import PlacementRow, placement_from_log, placement_rows

JS, CPU = "JsExecutionProvider", "CPUExecutionProvider"
WEBGPU_LABEL = REGISTRY["ort-web-webgpu"].where_label
PROBE = {"present": True, "isFallbackAdapter": True, "vendor": "google", "architecture": "swiftshader", "description": ""}


def recorded(target: str, policy: str) -> tuple[list[str], list[tuple[str, str]]]:
    entry = next(r for r in fixture_json("ort_web_logs.json") if r["target"] == target and r["policy"] == policy)
    return entry["log"], [tuple(node) for node in entry["nodes"]]


def test_a_node_without_a_webgpu_kernel_is_listed_on_the_cpu_ep():
    log, nodes = recorded("ort-web-webgpu", "softsign_mlp")
    placed = placement_from_log(log, nodes)
    assert placed[CPU] == [("Softsign", "soft0")]
    assert placed[JS] == [("Gemm", "fc0"), ("Gemm", "head"), ("Tanh", "squash"),
                          ("MemcpyFromHost", "Memcpy"), ("MemcpyToHost", "Memcpy_token_0")]


def test_all_nodes_on_one_ep_is_logged_without_names():
    for target, policy, ep in [("ort-web-webgpu", "softsign_only", CPU), ("ort-web-webgpu", "discrete_mlp", JS),
                               ("ort-web-wasm", "softsign_mlp", CPU)]:
        log, nodes = recorded(target, policy)
        assert placement_from_log(log, nodes) == {ep: []}, (target, policy)


def test_rows_mark_the_cpu_node_as_fallback_and_keep_ort_inserted_nodes():
    log, nodes = recorded("ort-web-webgpu", "softsign_mlp")
    rows = placement_rows(nodes, placement_from_log(log, nodes), JS, WEBGPU_LABEL)
    assert rows == [PlacementRow("fc0", "Gemm", WEBGPU_LABEL, False), PlacementRow("soft0", "Softsign", CPU, True),
                    PlacementRow("head", "Gemm", WEBGPU_LABEL, False), PlacementRow("squash", "Tanh", WEBGPU_LABEL, False)]


def test_an_ort_created_node_on_another_ep_gets_its_own_fallback_row():
    placed = {CPU: [("Cast", "InsertedCast_0")], JS: [("Gemm", "fc0")]}
    rows = placement_rows([("Gemm", "fc0")], placed, JS, WEBGPU_LABEL)
    assert rows[-1] == PlacementRow("InsertedCast_0", "Cast", CPU, True)


def test_log_prefixes_and_repeats_do_not_matter():
    lines = ["2026-01-01 00:00:00.1 [V:onnxruntime:, session_state.cc:1 V]  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 1",
             "2026-01-01 00:00:00.2 [V:onnxruntime:, session_state.cc:2 V]   Round (r)",
             "2026-01-01 00:00:00.3 [V:onnxruntime:, session_state.cc:2 V]   Round (r)",  # a repeat, later timestamp
             "unrelated line", "  Sign (not a placement line: the block ended)"]
    assert placement_from_log(["\n".join(lines)], [("Round", "r"), ("Sign", "s")]) == {CPU: [("Round", "r")]}


@pytest.mark.parametrize("policy, actual, fallback", [("softsign_mlp", "webgpu", 1), ("discrete_mlp", "webgpu", 0)])
def test_webgpu_backend_is_read_from_the_rows(policy, actual, fallback):
    log, nodes = recorded("ort-web-webgpu", policy)
    placed = placement_from_log(log, nodes)
    rows = (placement_rows(nodes, placed, JS, WEBGPU_LABEL) if placed.get(JS)
            else [PlacementRow(name, op, WEBGPU_LABEL, False) for op, name in nodes])
    info = REGISTRY["ort-web-webgpu"].verify_backend(PROBE, log, True, rows)
    assert (info.requested, info.actual, info.emulated) == ("webgpu", actual, True)
    assert ("no WebGPU kernel for 1 node(s)" in info.detail) == bool(fallback)


def test_a_webgpu_session_whose_every_node_ran_on_the_cpu_ep_is_a_total_fallback_not_a_missing_backend():
    """The adapter and the EP were there: the placement rows carry the fallback (judged by matrix/judge/rules.fallback)."""
    log, nodes = recorded("ort-web-webgpu", "softsign_only")
    rows = [PlacementRow(name, op, CPU, True) for op, name in nodes]
    info = REGISTRY["ort-web-webgpu"].verify_backend(PROBE, log, True, rows)
    assert (info.requested, info.actual) == ("webgpu", "webgpu")
    assert info.detail.endswith(f"ORT placed no node on {JS}; all ran on {CPU}")


def test_no_placement_logged_is_unknown_not_assumed():
    rows = [PlacementRow("fc0", "Gemm", "not logged", False)]
    assert REGISTRY["ort-web-webgpu"].verify_backend(PROBE, [], True, rows).actual == "unknown"
    absent = {"present": False, "reason": "no adapter"}
    assert REGISTRY["ort-web-webgpu"].verify_backend(absent, [], False, []).actual == "none"


def test_a_node_name_cannot_forge_a_placement_line():
    """ORT prints a node's name verbatim: a name holding a line break and a header of ORT's own read as two
    nodes on two EPs, a node that ran on the CPU as placed on WebGPU. Read with the model's names, it is one node."""
    forged = "odd)\nNode(s) placed on [JsExecutionProvider]. Number of nodes: 1\n  Round (round2"
    inline = f"x Node(s) placed on [{JS}]. Number of nodes: 1"
    nodes = [("Tanh", "tanh"), ("Round", forged), ("Round", "round2"), ("Round", inline), ("Tanh", "tanh2")]
    text = (f"[V:onnxruntime:, session_state.cc:1383 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [{CPU}]. "
            f"Number of nodes: 3\n  Round ({forged})\n  Round (round2)\n  Round ({inline})\n"
            f"[V:onnxruntime:, session_state.cc:1383 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [{JS}]. "
            "Number of nodes: 2\n  Tanh (tanh)\n  Tanh (tanh2)")
    for log in ([text], text.split("\n")):  # a message per entry (node), a physical line per entry (the page)
        assert placement_from_log(log, nodes) == {CPU: [("Round", forged), ("Round", "round2"), ("Round", inline)],
                                                  JS: [("Tanh", "tanh"), ("Tanh", "tanh2")]}
