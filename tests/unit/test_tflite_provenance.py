"""TFLite -> ONNX provenance on LiteRT op details recorded from real onnx2tf conversions
(tests/fixtures/litert_ops.json, re-recorded by tests/fixtures/record_litert_ops.py): which
ONNX node each TFLite op came from, where it ran, and the names onnx2tf respelled."""

from __future__ import annotations

import pytest
from saved import fixture_json

from targets.tflite_provenance import (
    BUILTIN, XNNPACK, OnnxInterface, OpDetails, Provenance, channel_first_permutation, delegated_ops, map_signature,
    original_node_names, placement_rows, tf_spellings,
)

NODES = ["/policy/Gemm_0", "/policy/Tanh_1", "/policy/Gemm_2", "/policy/Tanh_3", "/policy/Gemm_4", "/policy/Min_5", "/policy/Max_6"]


def recorded(target: str, variant: str, policy: str = "minmax_clip_mlp") -> dict:
    return next(r for r in fixture_json("litert_ops.json")
                if (r["target"], r["variant"], r["policy"]) == (target, variant, policy))


def rows_of(entry: dict, requested: str):
    """Placement as the session builds it, from the recorded details."""
    provenance = Provenance.from_converter(OnnxInterface(**entry["onnx_interface"]), entry["layers"])
    signature = entry["signature"] or entry["unsigned"]
    outputs = map_signature(signature["outputs"], list(provenance.interface.onnx_outputs), "output_")
    names = {int(index): name for index, name in entry["tensors"].items()}
    return placement_rows(OpDetails.of(entry["ops"]), names, provenance, outputs, requested)


def test_respellings_cover_colons_and_a_leading_slash():
    assert tf_spellings("/policy/Max:6") == ["/policy/Max:6", "/policy/Max__6", "wa/policy/Max__6"]
    assert tf_spellings("obs") == ["obs"]


def test_recorded_layers_map_back_to_the_onnx_node_names():
    for entry in (recorded("tflite-int8-full", "int8"), recorded("tflite", "fp32", "colon_names_mlp")):
        assert any(name not in entry["onnx_interface"]["node_order"] for name in entry["layers"])  # really respelled
        mapped = original_node_names(entry["layers"], entry["onnx_interface"]["node_order"])
        assert list(mapped) == entry["onnx_interface"]["node_order"]


def test_signatures_map_by_name_by_renamed_position_or_unsigned_by_order():
    plain = recorded("tflite", "fp32")
    assert map_signature(plain["signature"]["outputs"], ["action"], "output_") == {"action": 20}
    full = recorded("tflite-int8-full", "int8")  # TF's full-integer converter renames outputs output_0, ...
    assert full["signature"]["outputs"] == {"output_0": 22}
    assert map_signature(full["signature"]["outputs"], ["action"], "output_") == {"action": 22}
    colon = recorded("tflite", "fp32", "colon_names_mlp")  # no SavedModel signature: read in order
    assert colon["signature"] is None
    assert map_signature(colon["unsigned"]["inputs"], ["/obs:0"], "input_") == {"/obs:0": 0}
    with pytest.raises(RuntimeError, match="cannot map the .tflite signature"):
        map_signature({"x": 0, "y": 1}, ["action"], None)


def test_a_respelled_signature_name_maps_to_its_onnx_name():
    assert map_signature({"wa/obs__0": 0}, ["/obs:0"], "input_") == {"/obs:0": 0}


def test_xnnpack_took_every_op_of_the_float_model():
    entry = recorded("tflite", "fp32")
    assert delegated_ops(entry["ops"]) == set(range(10))
    rows = rows_of(entry, XNNPACK)
    assert {row.where for row in rows} == {XNNPACK} and not any(row.fallback for row in rows)
    assert list(dict.fromkeys(row.node for row in rows)) == NODES  # every ONNX node, in graph order
    gemm = [(row.op_type) for row in rows if row.node == "/policy/Gemm_0"]
    assert gemm == ["RESHAPE", "FULLY_CONNECTED"]  # the flatten and the fused matmul + add
    assert [row.node for row in rows if row.op_type == "MAXIMUM"] == ["/policy/Max_6"]  # the output, by producer


def test_builtin_kernels_requested_are_no_fallback():
    entry = recorded("tflite-noxnn", "fp32")
    assert delegated_ops(entry["ops"]) == set()
    rows = rows_of(entry, BUILTIN)
    assert {row.where for row in rows} == {BUILTIN} and not any(row.fallback for row in rows)
    assert list(dict.fromkeys(row.node for row in rows)) == NODES


def test_full_integer_ops_outside_xnnpack_are_fallbacks_and_converter_ops_keep_their_own_name():
    entry = recorded("tflite-int8-full", "int8")
    rows = rows_of(entry, XNNPACK)
    fell_back = {(row.node, row.op_type) for row in rows if row.fallback}
    assert fell_back == {("/policy/Min_5", "MINIMUM"), ("/policy/Max_6", "MAXIMUM")}
    assert all(row.where == BUILTIN for row in rows if row.fallback)
    assert ("QUANTIZE#0", "QUANTIZE", XNNPACK) in {(row.node, row.op_type, row.where) for row in rows}
    # the output's DEQUANTIZE is skipped to reach the op that computes it
    assert [row.node for row in rows if row.op_type == "DEQUANTIZE"] == ["DEQUANTIZE#11"]


def test_names_with_colons_still_find_their_nodes():
    entry = recorded("tflite", "fp32", "colon_names_mlp")
    rows = rows_of(entry, XNNPACK)
    assert list(dict.fromkeys(row.node for row in rows)) == [n.replace("_", ":") for n in NODES]


def test_the_delegate_partition_is_found_once_and_delegate_nodes_are_no_ops_of_the_model():
    details = OpDetails.of(recorded("tflite-int8-full", "int8")["ops"])
    kernels = details.kernels()
    assert kernels and all(op["op_name"] != "DELEGATE" for op in kernels)
    assert len(kernels) < len(details.ops)  # LiteRT appended its DELEGATE node(s)
    builtin = {op["op_name"] for op in kernels if details.where(op) == BUILTIN}
    assert builtin == {"MINIMUM", "MAXIMUM"}  # the ops XNNPACK left to LiteRT's own kernels
    assert {details.where(op) for op in kernels if op["index"] in details.delegated} == {XNNPACK}


def test_a_channel_last_output_is_permuted_back_and_a_matching_one_is_left_alone():
    assert channel_first_permutation(["N", 3, 8, 8], [-1, 8, 8, 3]) == (0, 3, 1, 2)
    assert channel_first_permutation(["N", 3, 8, 8], [-1, 3, 8, 8]) is None
    assert channel_first_permutation(["N", 4], [-1, 4]) is None  # rank 2: no layout to undo
    assert channel_first_permutation(["N", 3, 5, 7], [-1, 9, 9, 9]) is None  # no permutation explains it
