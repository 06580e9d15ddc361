"""results.json has a published JSON Schema (checked in, current), and latency.csv is long-format."""

from __future__ import annotations

import json

import jsonschema
import pandas as pd
import pytest
from conftest import load_results

from matrix import results as schema
from matrix import results_schema

pytestmark = [pytest.mark.slow]


def test_the_checked_in_schema_is_what_the_models_generate():
    assert results_schema.SCHEMA_FILE.read_text() == results_schema.text(), "run: python -m matrix.results_schema"


def test_a_real_run_validates_against_the_schema(ort_cpu_runs):
    schema = json.loads(results_schema.SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    for out in ort_cpu_runs.values():
        jsonschema.validate(load_results(out), schema)


def test_an_infinite_drift_is_written_validated_and_read_back(ort_cpu_runs, tmp_path):
    """NaN outputs make a cell's drift inf: it must survive results.json, not turn into null."""
    results = schema.load(ort_cpu_runs["continuous_mlp"] / "results.json")
    results.cells[0].parity[0].max_abs = float("inf")
    results.save(tmp_path / "results.json")
    jsonschema.validate(json.loads((tmp_path / "results.json").read_text()), json.loads(results_schema.SCHEMA_FILE.read_text()))
    assert schema.load(tmp_path / "results.json").cells[0].parity[0].max_abs == float("inf")


@pytest.mark.parametrize("break_it", [
    lambda data: data.pop("cells"),
    lambda data: data["cells"][0].update(verdict=3),
    lambda data: data["cells"][0]["latency"][0].update(p50_us="fast"),
])
def test_a_broken_results_file_does_not_validate(ort_cpu_runs, break_it):
    data = load_results(ort_cpu_runs["continuous_mlp"])
    break_it(data)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, json.loads(results_schema.SCHEMA_FILE.read_text()))


def test_latency_csv_has_one_row_per_cell_and_batch(ort_cpu_runs):
    out = ort_cpu_runs["continuous_mlp"]
    cells = load_results(out)["cells"]
    long = pd.read_csv(out / "latency.csv")
    assert len(long) == sum(len(cell["latency"]) for cell in cells) > 0
    assert (long["p50_low_us"] <= long["p50_us"]).all() and (long["p50_us"] <= long["p50_high_us"]).all()  # the noise band
    wide = long.pivot_table(index=["host", "target", "variant"], columns="batch", values="p50_us")
    for cell in cells:
        for stats in cell["latency"]:
            assert wide.loc[(cell["host"], cell["target"], cell["variant"]), stats["batch"]] == pytest.approx(stats["p50_us"])
