"""Verdict rules and tolerance lookup on fixed cells: no runtime, only the rules."""

from __future__ import annotations

import math

import pytest

from matrix.errors import InputError
from matrix.results import ArtifactInfo, Backend, Cell, CellError, ContractCheck, OutputParity, Placement
from matrix.judge.rules import DEFAULT_RTOL, DEFAULT_TOLERANCE, Context, Tolerance, Tolerances, verdict


def verdict_of(cell: Cell, atol: float, min_agreement: float = 0.99) -> tuple[str, list[str]]:
    """The verdict under an absolute tolerance alone (rtol 0), as these rules were first stated."""
    return verdict(cell, Context(tolerance=Tolerance(atol), min_agreement=min_agreement))


def _cell(**fields) -> Cell:
    return Cell(host="h", target="ort-cpu", variant=fields.pop("variant", "fp32"), verdict="", **fields)


def _drift(value: float, output: str = "action") -> OutputParity:
    return OutputParity(output=output, kind="continuous", max_abs=value, mean_abs=value, p99_abs=value, max_rel=value)


def _discrete(agreement: float, flips: int, near_ties: int = 0) -> OutputParity:
    return OutputParity(output="action", kind="discrete", max_abs=1, mean_abs=0, p99_abs=0, max_rel=1,
                        agreement=agreement, flips=flips, near_ties=near_ties)


# --- Tolerances ------------------------------------------------------------------------------------

def test_defaults_depend_on_the_precision_and_unknown_precisions_get_fp32s():
    tolerances = Tolerances()
    assert [tolerances.get("ort-cpu", v) for v in ("fp32", "fp16", "int8")] == [
        Tolerance(1e-4, 1e-5), Tolerance(2e-2, 1e-3), Tolerance(2.5e-1, 1e-2)]
    assert tolerances.get("ort-cpu", "bf16") == Tolerance(DEFAULT_TOLERANCE["fp32"], DEFAULT_RTOL["fp32"])


def test_lookup_order_is_exact_then_target_wildcard_then_variant_wildcard_then_default():
    tolerances = Tolerances.parse(["ort-cpu:int8=0.3", "ort-cpu:*=0.01", "*:int8=0.5", "*:fp16=0.05"])
    assert tolerances.get("ort-cpu", "int8").atol == 0.3  # exact key beats both wildcards
    assert tolerances.get("ort-cpu", "fp16").atol == 0.01  # target:* beats *:variant
    assert tolerances.get("tflite", "int8").atol == 0.5
    assert tolerances.get("tflite", "fp16").atol == 0.05
    assert tolerances.get("tflite", "fp32").atol == DEFAULT_TOLERANCE["fp32"]


def test_bare_keys_mean_a_precision_or_a_target():
    tolerances = Tolerances.parse(["fp16=0.07", "tflite=1e-3"])
    assert tolerances.overrides == {"*:fp16": 0.07, "tflite:*": 1e-3}
    assert tolerances.get("ort-node", "fp16").atol == 0.07
    assert tolerances.get("tflite", "fp32").atol == 1e-3


def test_command_line_overrides_the_config_file_for_the_same_key():
    tolerances = Tolerances.parse(["ort-cpu:int8=0.3"], base={"ort-cpu:int8": 0.9, "fp16": 0.04})
    assert tolerances.get("ort-cpu", "int8").atol == 0.3
    assert tolerances.get("ort-cpu", "fp16").atol == 0.04


@pytest.mark.parametrize("spec", ["ort-cpu:int8", "ort-cpu:int8=x", "=", "fp16=", "fp16=1e-3=2"])
def test_malformed_tolerances_are_input_errors(spec):
    with pytest.raises(InputError, match="TARGET:VARIANT=VALUE"):
        Tolerances.parse([spec])


# --- verdict_of ----------------------------------------------------------------------------------------

def test_drift_below_half_the_tolerance_passes_between_half_and_full_warns_above_fails():
    assert verdict_of(_cell(parity=[_drift(4e-5)]), 1e-4) == ("PASS", [])
    verdict, reasons = verdict_of(_cell(parity=[_drift(6e-5)]), 1e-4)
    assert verdict == "WARN" and "above half the tolerance" in reasons[0]
    verdict, reasons = verdict_of(_cell(parity=[_drift(2e-4)]), 1e-4)
    assert verdict == "FAIL" and reasons == ["action: drift 0.0002 (max rel 0.0002) above tolerance atol 0.0001"]


def test_infinite_drift_fails_and_an_infinite_tolerance_never_fails_on_drift():
    assert verdict_of(_cell(parity=[_drift(math.inf)]), 1e-4)[0] == "FAIL"
    assert verdict_of(_cell(parity=[_drift(5.0)]), math.inf)[0] == "PASS"


def test_discrete_flips_warn_above_the_minimum_agreement_and_fail_below_it():
    verdict, reasons = verdict_of(_cell(parity=[_discrete(0.995, flips=1)]), 1e-4, min_agreement=0.99)
    assert verdict == "WARN" and "1 action flips" in reasons[0]
    verdict, reasons = verdict_of(_cell(parity=[_discrete(0.9, flips=10)]), 1e-4, min_agreement=0.99)
    assert verdict == "FAIL" and "below the minimum agreement 99%" in reasons[0]


def test_near_ties_alone_do_not_count_and_discrete_outputs_ignore_drift():
    assert verdict_of(_cell(parity=[_discrete(0.9, flips=0, near_ties=10)]), 1e-4)[0] == "PASS"


def test_a_broken_contract_fails_and_a_not_applicable_check_does_not():
    contract = [ContractCheck(name="finite outputs", ok=False, detail="NaN or Inf in ['action']"),
                ContractCheck(name="action bounds", ok=None, detail="not stated")]
    verdict, reasons = verdict_of(_cell(parity=[_drift(0)], contract=contract), 1e-4)
    assert verdict == "FAIL" and reasons == ["contract: finite outputs: NaN or Inf in ['action']"]


def test_a_session_on_another_backend_fails_whatever_the_drift():
    backend = Backend(requested="webgpu", actual="wasm", detail="ORT placed no node on JsExecutionProvider")
    verdict, reasons = verdict_of(_cell(parity=[_drift(0)], backend=backend), 1e-4)
    assert verdict == "FAIL" and reasons[0].startswith("requested webgpu but ran on wasm: the requested backend is not there.")


def test_fallback_nodes_warn_and_name_where_they_ran():
    placement = [Placement(node="a", op_type="Round", where="CPUExecutionProvider", fallback=True),
                 Placement(node="b", op_type="Gemm", where="JsExecutionProvider", fallback=False),
                 Placement(node="c", op_type="Sign", where="CPUExecutionProvider", fallback=True)]
    assert verdict_of(_cell(parity=[_drift(0)], placement=placement), 1e-4) == ("WARN", ["2 nodes of 3 fell back to CPUExecutionProvider"])


def test_an_error_before_parity_fails_with_the_stage_and_message_alone():
    cell = _cell(error=CellError(stage="open", message="kernel not found"), parity=[])
    assert verdict_of(cell, 1e-4) == ("FAIL", ["open: kernel not found"])


def test_a_late_placement_error_warns_and_keeps_the_measured_parity():
    cell = _cell(error=CellError(stage="placement", message="profiler crashed"), parity=[_drift(0)])
    verdict, reasons = verdict_of(cell, 1e-4)
    assert verdict == "WARN" and reasons == ["placement: profiler crashed (parity and contract measured before)"]
    cell = _cell(error=CellError(stage="latency", message="timed out"), parity=[_drift(0)])
    assert verdict_of(cell, 1e-4)[0] == "FAIL"


def test_a_conversion_only_cell_is_converted_and_lists_the_workarounds_applied():
    artifact = ArtifactInfo(size_bytes=1, conversion_s=1, notes=["workaround: broadcast_to -> expand", "fp16 compute"])
    verdict, reasons = verdict_of(_cell(predicts=False, artifact=artifact), 1e-4)
    assert verdict == "CONVERTED" and reasons[1:] == ["workaround: broadcast_to -> expand"]


def test_int8_with_nothing_quantized_warns_and_a_counted_int8_does_not():
    empty = ArtifactInfo(size_bytes=1, conversion_s=0, quantization={"quantized_ops": 0, "float_ops": 3, "quantized_weights": 0})
    verdict, reasons = verdict_of(_cell(variant="int8", artifact=empty, parity=[_drift(0)]), 0.25)
    assert verdict == "WARN" and reasons == ["int8 artifact has nothing quantized (3 weight ops stayed float)"]
    counted = empty.model_copy(update={"quantization": {"quantized_ops": 3, "float_ops": 0}})
    assert verdict_of(_cell(variant="int8", artifact=counted, parity=[_drift(0)]), 0.25)[0] == "PASS"
    assert verdict_of(_cell(variant="fp32", artifact=empty, parity=[_drift(0)]), 1e-4)[0] == "PASS"


def test_failures_come_before_warnings_in_the_reasons():
    placement = [Placement(node="a", op_type="Round", where="CPU", fallback=True),
                 Placement(node="b", op_type="Gemm", where="GPU", fallback=False)]
    verdict, reasons = verdict_of(_cell(parity=[_drift(1.0), _drift(6e-5, "value")], placement=placement), 1e-4)
    assert verdict == "FAIL"  # then warnings in the registry's order: drift before the fallback rule
    assert reasons[0].startswith("action: drift") and "value: drift" in reasons[1] and "fell back" in reasons[2]
