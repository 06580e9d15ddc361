"""A version-1 results.json (saved from a real run before the vocabulary changed) still reads:
compare and merge against an old baseline keep working, in version 2's names."""

from __future__ import annotations

import json

import pytest

from saved import FIXTURES, fixture_json
from matrix import results as schema
from matrix.decide.compare import compare
from matrix.errors import InputError
from matrix.decide.merge import merge

V1 = "results_v1_continuous_mlp.json"


def test_a_version_1_file_reads_in_version_2_names():
    raw = fixture_json(V1)
    assert raw["schema_version"] == 1 and "precisions" in raw["settings"]
    loaded = schema.load(FIXTURES / V1)
    assert loaded.schema_version == schema.SCHEMA_VERSION == 2
    assert loaded.run_options["variants"] == raw["settings"]["precisions"] and "precisions" not in loaded.run_options
    old = [p["vs_baseline_max_abs"] for cell in raw["cells"] for p in cell["parity"]]
    assert [p.vs_dev_runtime_max_abs for cell in loaded.cells for p in cell.parity] == old
    assert any(value for value in old)  # the fixture carries a non-zero value, so a dropped field would show
    assert loaded.interrupted is None


def test_a_version_1_interruption_becomes_the_typed_record(tmp_path):
    raw = fixture_json(V1)
    raw["settings"].update(interrupted_after_cells=1, interrupted_by="SIGTERM")
    (tmp_path / "results.json").write_text(json.dumps(raw))
    loaded = schema.load(tmp_path / "results.json")
    assert loaded.interrupted == schema.Interruption(after_cells=1, signal="SIGTERM")
    assert not {"interrupted_after_cells", "interrupted_by"} & set(loaded.run_options)


def test_compare_and_merge_take_a_version_1_baseline(tmp_path):
    old = schema.load(FIXTURES / V1)
    current = old.model_copy(deep=True)
    current.hosts[0].label = "other-host"
    for cell in current.cells:
        cell.host = "other-host"
    current.save(tmp_path / "results.json")
    assert json.loads((tmp_path / "results.json").read_text())["schema_version"] == 2
    assert compare(old, schema.load(FIXTURES / V1)) == []
    worse = schema.load(FIXTURES / V1)
    worse.cells[0].verdict = "FAIL"
    assert [r.kind for r in compare(old, worse)] == ["verdict"]
    merged = merge([FIXTURES / V1, tmp_path / "results.json"])
    assert {h.label for h in merged.hosts} == {old.hosts[0].label, "other-host"}
    assert len(merged.cells) == 2 * len(old.cells)


def test_a_newer_schema_is_refused_by_name(tmp_path):
    raw = fixture_json(V1)
    raw["schema_version"] = 3
    (tmp_path / "results.json").write_text(json.dumps(raw))
    with pytest.raises(InputError, match="schema version 3"):
        schema.load(tmp_path / "results.json")


def test_a_version_1_journal_line_keeps_its_development_runtime_drift():
    cell = fixture_json(V1)["cells"][0]
    upgraded = schema.Cell.model_validate(schema.upgrade_v1_cell(cell))
    assert upgraded.parity[0].vs_dev_runtime_max_abs == cell["parity"][0]["vs_baseline_max_abs"]


def test_a_run_recorded_before_the_rename_resumes_with_its_finished_cells(tmp_path):
    from matrix.run.orchestrate import RUN_FILE, resume_state

    old = fixture_json(V1)
    sha = old["model"]["sha256"]
    recorded = {"run_id": "r1", "model_sha256": sha, "settings": {"targets": ["ort-cpu"], "precisions": ["fp32", "fp16"]}}
    (tmp_path / RUN_FILE).write_text(json.dumps(recorded))
    (tmp_path / "results.jsonl").write_text("".join(json.dumps({"run_id": "r1", "model_sha256": sha, **cell}) + "\n"
                                                    for cell in old["cells"]))
    identity = {"model_sha256": sha, "settings": {"targets": ["ort-cpu"], "variants": ["fp32", "fp16"]}}
    run_id, finished = resume_state(tmp_path, identity)
    assert run_id == "r1" and len(finished) == len(old["cells"])
    drifts = sorted(p.vs_dev_runtime_max_abs for cell in finished.values() for p in cell.parity)
    assert drifts == sorted(p["vs_baseline_max_abs"] for cell in old["cells"] for p in cell["parity"])
    with pytest.raises(InputError, match="variants"):
        resume_state(tmp_path, {**identity, "settings": {**identity["settings"], "variants": ["int8"]}})


def test_an_interrupted_run_says_so_in_the_report_and_the_summary():
    from matrix.report.report import render_html, summary_markdown

    results = schema.load(FIXTURES / V1)
    assert "interrupted" not in summary_markdown(results) and "interrupted (" not in render_html(results)
    results.interrupted = schema.Interruption(after_cells=1, signal="SIGINT")
    line = "interrupted (SIGINT) after 1 cells: this report holds the finished cells only"
    assert line in summary_markdown(results) and line in render_html(results)
