"""The report's writers without a browser: summary.md as a Markdown renderer shows it,
the charts' SVG, the latency honesty rules and the script the page's CSP admits."""

import base64
import hashlib
import re
from html.parser import HTMLParser

import pytest
from conftest import run_cli
from markdown_it import MarkdownIt

from matrix.report import report
from matrix import results as schema
from matrix.inputs.examples import path as example

pytestmark = [pytest.mark.slow]

HOSTILE_HOST = "ci `runner` <img src=x onerror=alert(1)> *bold* | #1 [link](http://x)"


@pytest.fixture(scope="module")
def hostile_host_run(tmp_path_factory):
    """continuous_mlp (underscores in its name) on ort-cpu and tract, under a host label full of markup."""
    out = tmp_path_factory.mktemp("summary")
    done = run_cli("run", example("continuous_mlp"), "--targets", "ort-cpu,tract", "--precisions", "fp32,fp16",
                   "--iters", "20", "--warmup", "2", "--host-label", HOSTILE_HOST, "--out", out)
    assert done.returncode in (0, 1), done.stderr  # tract's fp16 FAILs: its Gemm rejects the fp16 variant
    return out


class _Elements(HTMLParser):
    """Tags and the text inside each heading and code element, as a browser would read them."""

    def __init__(self):
        super().__init__()
        self.tags, self.text, self.open = [], {}, []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.open.append(tag)
        self.text.setdefault(tag, []).append("")

    def handle_endtag(self, tag):
        if tag in self.open:
            self.open.remove(tag)

    def handle_data(self, data):
        for tag in self.open:
            self.text[tag][-1] += data


def _rendered(markdown: str) -> _Elements:
    parser = _Elements()
    parser.feed(MarkdownIt("commonmark").enable("table").render(markdown))
    return parser


def test_summary_heading_shows_the_model_name_verbatim_in_code(hostile_host_run):
    elements = _rendered((hostile_host_run / "summary.md").read_text())
    assert elements.text["h2"][0] == "policy-matrix: continuous_mlp.onnx"
    assert "continuous_mlp.onnx" in elements.text["code"]  # no literal backslash inside the code span


@pytest.mark.parametrize("name", ["plain.onnx", "a_b*c.onnx", "one`tick.onnx", "``two``.onnx", "`edge`", "x|y<b>.onnx"])
def test_code_spans_survive_any_backticks(name):
    elements = _rendered(f"## {report._md_code(name)}\n")
    assert elements.text["code"] == [name] and "b" not in elements.tags


def test_summary_escapes_the_host_label_and_shows_p50_per_cell(hostile_host_run):
    summary = (hostile_host_run / "summary.md").read_text()
    elements = _rendered(summary)
    assert "img" not in elements.tags and "a" not in elements.tags and "em" not in elements.tags
    assert HOSTILE_HOST in elements.text["h3"]
    results = schema.load(hostile_host_run / "results.json")
    grid = summary[summary.index("| target | fp32"):]  # the verdict grid under the host's heading (the ship table comes first)
    rows = [line for line in grid.splitlines() if line.startswith("| ")]
    for cell in results.cells:
        if cell.latency:
            (row,) = [r for r in rows if r.startswith(f"| {cell.target} |")]
            assert f"p50 {report._duration(cell.latency[0].p50_us)}" in row
    table_cells = [len(row.strip("|").split(" | ")) for row in rows]
    assert len(set(table_cells)) == 1  # the host label's pipe did not add a column anywhere


def test_report_script_is_admitted_by_its_csp_hash_only(hostile_host_run):
    html = (hostile_host_run / "index.html").read_text()
    (policy,) = re.findall(r'Content-Security-Policy" content="([^"]+)"', html)
    (script,) = re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in policy and "unsafe-inline" not in policy.split("script-src")[1]


def test_charts_are_dot_plots_with_exact_numbers_and_failed_cells(hostile_host_run):
    results = schema.load(hostile_host_run / "results.json")
    drift = str(report.drift_chart(results))
    latency = str(report.latency_chart(results))
    assert "<rect x=" not in drift.replace('<rect x="0"', "")  # no bars: only row stripes and dots
    for cell in results.cells:
        for parity in cell.parity:
            assert f"max |Δ| {parity.max_abs:.3e}" in drift
        for stats in cell.latency:
            assert f"batch {stats.batch}: p50 {stats.p50_us:.2f} µs" in latency
    failed = [c for c in results.cells if c.verdict == "FAIL" and not c.parity]
    assert failed, "tract fp16 was expected to fail before any output"
    for chart in (drift, latency):
        assert chart.count("no numbers") == len(failed)
    shapes = {b: s for b, s in zip(sorted({s.batch for c in results.cells for s in c.latency}), ("circle", "rect"))}
    assert all(re.search(f'<{shape} [^>]*class="mark"', latency) for shape in shapes.values())  # a shape per batch


def test_noisy_rule_and_per_sample_throughput(hostile_host_run):
    results = schema.load(hostile_host_run / "results.json")
    stats = results.cells[0].latency[-1]
    calm = stats.model_copy(update={"p99_us": stats.p50_us * report.NOISY_P99_OVER_P50})
    spiky = stats.model_copy(update={"p99_us": stats.p50_us * report.NOISY_P99_OVER_P50 * 1.01})
    assert not report.noisy(calm) and report.noisy(spiky)
    html = (hostile_host_run / "index.html").read_text()
    assert f"{stats.p50_us / stats.batch:.3f}" in html


def test_chart_text_is_escaped():
    from matrix.report import charts

    hostile = "<img src=x onerror=alert(1)>"
    svg = str(charts.dot_plot([charts.Row(hostile, [charts.Mark(1e-3, hostile, "#000")], note=hostile, href="#a\"b")],
                              hostile, lambda v: hostile))
    assert "<img" not in svg and svg.count("&lt;img") == 5 + 2  # label, title, note, axis title and its aria-label + two decade labels
    assert 'href="#a&#34;b"' in svg


def test_an_infinite_value_or_tolerance_sits_on_the_right_edge():
    """NaN outputs give an infinite drift and `--tolerance X=inf` an infinite tick: the axis spans the
    finite values and the infinite ones are drawn at its end, never a crash."""
    from matrix.report import charts

    rows = [charts.Row("a", [charts.Mark(float("inf"), "inf drift", "#000")], tick=float("inf")),
            charts.Row("b", [charts.Mark(1e-4, "finite", "#000")], tick=1e-3)]
    svg = str(charts.dot_plot(rows, "drift", lambda v: f"{v:g}"))
    assert "nan" not in svg.lower() and "inf drift" in svg
    assert ">0.0001<" in svg and ">0.001<" in svg  # decades come from the finite values
