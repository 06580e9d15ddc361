"""Runtime releases side by side (issue 14): one real run of a bundled policy with ort-cpu, ort-web-wasm
and ort-node each at the default and at a pinned older release, plus a release that does not exist.

The releases are installed for real (pip / npm into the shared cache, once); the run is shared by
every assert below (module scope), so the suite pays for it once.
"""

from __future__ import annotations

import csv
import json
import re

import onnxruntime
import pytest
from conftest import load_results, run_cli

from matrix.inputs.examples import path as example

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PINNED = {"ort-cpu@1.20.1": "onnxruntime 1.20.1", "ort-web-wasm@1.22.0": "onnxruntime-web 1.22.0",
          "ort-node@1.20.1": "onnxruntime-node 1.20.1"}
BOGUS = "ort-cpu@99.0.0"  # above the floor, so pip is asked (ort-cpu@0.0.99 stops at the floor: tests/unit)
TARGETS = ["ort-cpu@1.20.1", "ort-cpu", BOGUS, "ort-web-wasm@1.22.0", "ort-web-wasm", "ort-node@1.20.1", "ort-node"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("versions")
    done = run_cli("run", example("continuous_mlp"), "--targets", ",".join(TARGETS), "--precisions", "fp32",
                   "--iters", "20", "--warmup", "2", "--out", out, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return out, {cell["target"]: cell for cell in load_results(out)["cells"]}


def test_every_release_is_its_own_cell_in_the_order_given(run):
    _, cells = run
    assert list(cells) == TARGETS


@pytest.mark.parametrize("label", PINNED)
def test_a_pinned_release_runs_and_reports_its_exact_version(run, label):
    _, cells = run
    cell = cells[label]
    assert cell["verdict"] == "PASS", cell["reasons"]
    assert cell["runtime_version"].startswith(PINNED[label] + ("," if "web" in label or "node" in label else ""))
    assert cell["latency"] and cell["placement"]


def test_the_default_release_runs_beside_it(run):
    _, cells = run
    assert cells["ort-cpu"]["runtime_version"] == f"onnxruntime {onnxruntime.__version__}" != cells["ort-cpu@1.20.1"]["runtime_version"]
    for default, pinned in (("ort-web-wasm", "ort-web-wasm@1.22.0"), ("ort-node", "ort-node@1.20.1")):
        assert cells[default]["verdict"] == "PASS"
        assert cells[default]["runtime_version"].split(",")[0] != cells[pinned]["runtime_version"].split(",")[0]


def test_the_runtimes_themselves_say_which_release_they_loaded(run):
    """Not only the package folder: the page's ORT and node's ORT report their own version."""
    _, cells = run
    assert "onnxruntime-web 1.22.0 in the page" in cells["ort-web-wasm@1.22.0"]["backend"]["detail"]
    assert "onnxruntime-web 1.22.0" not in cells["ort-web-wasm"]["backend"]["detail"]
    assert cells["ort-node@1.20.1"]["backend"]["detail"].startswith("onnxruntime-node 1.20.1,")


def test_an_old_onnxruntime_still_reports_where_its_nodes_ran(run):
    """onnxruntime 1.20 has no assignment record: placement comes from its profile of one call."""
    _, cells = run
    rows = cells["ort-cpu@1.20.1"]["placement"]
    assert rows and {row["where"] for row in rows} == {"CPUExecutionProvider"} and not any(row["fallback"] for row in rows)


def test_a_release_that_does_not_exist_is_a_skip_with_the_installers_words(run):
    _, cells = run
    cell = cells[BOGUS]
    assert cell["verdict"] == "SKIP"
    assert cell["reasons"] == ["pip cannot install onnxruntime==99.0.0 here: ERROR: No matching distribution found for onnxruntime==99.0.0"]
    assert cell["runtime_version"] == "onnxruntime 99.0.0 (requested)"


def test_the_label_is_the_target_in_every_output(run):
    out, _ = run
    assert [row["target"] for row in csv.DictReader((out / "results.csv").open())] == TARGETS
    summary = (out / "summary.md").read_text()
    assert all(f"| {label} |" in summary for label in TARGETS)
    journal = [json.loads(line)["target"] for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(journal) == sorted(TARGETS)  # the journal is written as cells finish; targets run side by side


def test_the_report_compares_each_target_across_releases(run):
    out, _ = run
    html = (out / "index.html").read_text()
    section = html[html.index('<section id="versions">'):]
    section = section[:section.index("</section>")]
    for label in ("ort-cpu@1.20.1", "ort-web-wasm@1.22.0", "ort-node@1.20.1", BOGUS):
        assert label in section
    ratios = re.findall(r"\d+\.\d\d×(?:</b>)?<br><span class=\"note\">\((\d+\.\d\d)–(\d+\.\d\d)\)</span></td>", section)
    assert len(ratios) >= 2 * 3  # a p50 ratio per batch for each release that ran, each with its noise band
    assert all(float(low) <= float(high) for low, high in ratios)
