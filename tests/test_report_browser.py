"""The HTML report, opened in real headless Chromium the way a person opens it."""

import onnx
import pytest
from conftest import chromium_page, run_cli

from matrix import results as schema
from matrix.inputs.examples import path as example

pytestmark = [pytest.mark.slow, pytest.mark.browser]

HOSTILE_NODE = '<img src=x onerror="window.__pwned=1">'
HOSTILE_META = "</style><script>window.__pwned=2</script>"


@pytest.fixture(scope="module")
def page():
    with chromium_page() as opened:
        yield opened


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    model = onnx.load(str(example("continuous_mlp")))
    model.graph.node[0].name = HOSTILE_NODE
    model.graph.node[1].name = "<script>window.__pwned=3</script>"
    model.doc_string = HOSTILE_META
    model.metadata_props.add(key="notes", value=HOSTILE_META)
    onnx.save(model, folder / "hostile.onnx")
    done = run_cli("run", folder / "hostile.onnx", "--targets", "ort-cpu", "--iters", "5", "--out", folder / "report")
    assert done.returncode == 0, done.stderr
    return folder / "report" / "index.html"


def test_report_shows_verdict_grid_and_charts(page, hostile_report):
    page.goto(hostile_report.as_uri())
    grid = page.locator("table.grid")
    assert grid.count() == 1
    assert grid.locator(".badge.PASS").count() == 3  # ort-cpu x fp32/fp16/int8
    for chart, marks in (("#drift-chart svg", 3), ("#latency-chart svg", 3 * 2)):  # an output / two batch sizes per cell
        box = page.locator(chart).bounding_box()
        assert box and box["width"] > 200 and box["height"] > 50, chart
        assert page.locator(f"{chart} .mark").count() == marks, chart
        assert page.locator(f"{chart} .mark title").first.text_content().count("e") >= 1  # exact numbers on hover


def test_model_strings_are_text_never_markup(page, hostile_report):
    page.goto(hostile_report.as_uri())
    assert page.evaluate("window.__pwned") is None
    assert page.locator("img[src=x]").count() == 0 and page.locator("main script").count() == 0
    text = page.locator("#placement").inner_text()
    assert HOSTILE_NODE in text and "<script>window.__pwned=3</script>" in text
    assert HOSTILE_META in page.locator("#environment").inner_text()


def test_report_needs_no_network(page, hostile_report):
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(hostile_report.as_uri())
    assert [url for url in requests if not url.startswith("file://")] == []


# --- filters, sorting and links (the report's own script, admitted by the page's CSP) ------------


@pytest.fixture(scope="module")
def mixed_report(tmp_path_factory):
    """Real cells of every kind: PASS (ort-cpu), FAIL (tract's fp16 Gemm), SKIP (ORT's CoreML EP off macOS)
    and, where Chromium has a WebGPU adapter, fallbacks (onnxruntime-web puts int8 ops on its CPU EP)."""
    folder = tmp_path_factory.mktemp("mixed")
    done = run_cli("run", example("continuous_mlp"), "--targets", "ort-cpu,tract,ort-coreml,ort-web-webgpu",
                   "--iters", "5", "--warmup", "1", "--out", folder)
    assert done.returncode in (0, 1), done.stderr
    return folder / "index.html"


@pytest.fixture()
def report_page(page, mixed_report):
    errors = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(mixed_report.as_uri())
    page.wait_for_selector("#filters:not([hidden])")  # the script ran: CSP admitted it
    yield page
    assert errors == []  # no CSP refusal, no script error


def _visible(page, selector: str, value: str = "e.dataset.verdict") -> list:
    """`value` of every element matching `selector` that a person can see."""
    return page.eval_on_selector_all(selector, f"els => els.filter(e => e.checkVisibility({{visibilityProperty: true}}))"
                                               f".map(e => {value})")


def test_hide_skip_hides_every_skip_and_nothing_else(report_page):
    cells = "table.grid td.cell[data-verdict] .badge"
    before = _visible(report_page, cells, "e.textContent")
    assert "SKIP" in before and "PASS" in before
    report_page.check("#hide-skip")
    after = _visible(report_page, cells, "e.textContent")
    assert "SKIP" not in after and sorted(after) == sorted(v for v in before if v != "SKIP")
    assert "SKIP" not in _visible(report_page, "#details-table tbody tr")
    assert report_page.locator("table.grid tr", has_text="ort-coreml").is_hidden()  # a row of SKIPs only goes
    report_page.uncheck("#hide-skip")
    assert "SKIP" in _visible(report_page, "#details-table tbody tr")


def test_only_fail_and_only_fallback(report_page):
    report_page.check("input[name=show][value=fail]")
    shown = _visible(report_page, "[data-verdict]")
    assert shown and set(shown) == {"FAIL"}
    assert "of" in report_page.locator("#filter-count").text_content()
    report_page.check("input[name=show][value=fallback]")
    with_fallback = report_page.locator("[data-fallback='1']")
    if with_fallback.count() == 0:
        pytest.skip("no cell fell back here (no WebGPU adapter in this Chromium)")
    shown = _visible(report_page, "[data-verdict]", "e.dataset.fallback")
    assert shown and set(shown) == {"1"}
    node_rows = _visible(report_page, "tr[data-node-fallback]", "e.dataset.nodeFallback")
    assert node_rows and set(node_rows) == {"1"}


def test_tables_sort_by_the_clicked_column(report_page):
    header = report_page.locator("#parity-table thead th", has_text="max_abs")
    column = "els => els.map(r => parseFloat(r.children[%d].textContent))" % header.evaluate(
        "h => Array.from(h.parentElement.children).indexOf(h)")
    header.click()
    values = report_page.eval_on_selector_all("#parity-table tbody tr", column)
    assert values == sorted(values) and values[0] < values[-1]
    header.click()
    assert report_page.eval_on_selector_all("#parity-table tbody tr", column) == sorted(values, reverse=True)


def test_a_verdict_cell_leads_to_its_details(report_page):
    failed = report_page.locator("table.grid td.cell[data-verdict=FAIL] a").first
    failed.click()
    target = report_page.locator(":target")
    assert target.get_attribute("data-verdict") == "FAIL"
    assert target.evaluate("row => row.closest('table').id") == "details-table"
    box, bar = target.bounding_box(), report_page.locator("#filters").bounding_box()
    assert bar["y"] + bar["height"] <= box["y"] < report_page.viewport_size["height"]  # in view, not under the sticky bar


def test_web_latency_shows_the_page_timer_step(report_page, mixed_report):
    web = [c for c in schema.load(mixed_report.parent / "results.json").cells if c.target.startswith("ort-web") and c.latency]
    if not web:
        pytest.skip("no ort-web cell was timed here")
    # Cross-origin isolated, Chromium's performance.now() steps in 5 us (100 us without isolation).
    assert all(0 < c.backend.timer_resolution_us <= 5 for c in web)
    row = report_page.locator("#latency-table tbody tr", has_text=web[0].target).first
    header = report_page.locator("#latency-table thead th", has_text="timer step")
    column = header.evaluate("h => Array.from(h.parentElement.children).indexOf(h)")
    assert float(row.locator("td").nth(column).text_content()) == web[0].backend.timer_resolution_us


def test_fallback_matrix_marks_exactly_the_nodes_that_left_the_device(report_page, mixed_report):
    cells = [c for c in schema.load(mixed_report.parent / "results.json").cells if c.placement]
    columns = report_page.locator("table.placement thead th.col")
    assert columns.count() == len(cells)
    red = report_page.eval_on_selector_all(
        "table.placement tbody tr", "rows => rows.flatMap(r => Array.from(r.querySelectorAll('td.dot')).map("
        "(td, i) => td.querySelector('.fell-back') ? [r.querySelector('td.node').textContent, i] : null).filter(x => x))")
    expected = [[row.node, column] for column, cell in enumerate(cells) for row in cell.placement if row.fallback]
    assert sorted(map(tuple, red)) == sorted(map(tuple, expected))
    width = report_page.locator("table.placement").bounding_box()["width"]
    assert width < 600 + 30 * len(cells)  # node and op names, then a square per cell (not a device name per cell)


# --- the decision at a glance -------------------------------------------------------------------


@pytest.fixture(scope="module")
def settings_grid_report(tmp_path_factory):
    """A grid with two runtime settings and two precisions: a decision with a runner-up and rejected configurations."""
    folder = tmp_path_factory.mktemp("grid")
    done = run_cli("run", example("continuous_mlp"), "--targets", "ort-cpu,tract", "--variants", "fp32,int8",
                   "--settings", "ort-cpu:threads=1,2", "--iters", "20", "--warmup", "2", "--out", folder)
    assert done.returncode in (0, 1), done.stderr
    return folder


def test_the_ship_table_comes_first_and_fits_1280_pixels(page, settings_grid_report):
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto((settings_grid_report / "index.html").as_uri())
    first = page.eval_on_selector("main", "m => m.querySelector('section').id")
    assert first == "decision" and page.locator("#decision table").first.get_attribute("id") == "ship-table"
    rows = page.locator("#ship-table tr.ship-row")
    assert rows.count() == 2 and "ort-cpu" in rows.first.inner_text()
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280  # nothing scrolls sideways
    clipped = page.eval_on_selector_all("table", "ts => ts.filter(t => t.checkVisibility() && "
                                                 "t.scrollWidth > t.parentElement.clientWidth + 1).map(t => t.id || t.className)")
    assert clipped == []
    assert not page.locator("#decision-detail").evaluate("d => d.open")  # the evidence waits behind one click
    page.locator("#decision-detail summary").click()
    outcomes = page.locator("#decision-detail table.decision-rules tbody tr")
    assert outcomes.count() >= 4  # every ort-cpu configuration, each with the rule that placed it
    summary = (settings_grid_report / "summary.md").read_text()
    assert summary.index("| target | ships |") < summary.index("| target | fp32 |")  # first table of the job summary


def test_the_ship_tables_return_interval_stays_in_its_column(page, tmp_path):
    """Under --env the Δ return column holds the mean and its paired interval ('+0.00438 [-0.00753, +0.0163]'),
    which ran over the p50 / p99 beside it: the column's cells were unwrapped in a fixed-layout table."""
    import rollout_policies

    model = rollout_policies.pendulum(tmp_path / "pendulum.onnx")
    done = run_cli("run", model, "--targets", "ort-cpu", "--variants", "fp32,int8", "--env", "Pendulum-v1", "--episodes", "3",
                   "--iters", "5", "--warmup", "1", "--out", tmp_path / "report")
    assert done.returncode == 0, done.stderr
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto((tmp_path / "report" / "index.html").as_uri())
    delta = page.locator("#ship-table tr.ship-row td").nth(3)
    assert "[" in delta.inner_text()  # the interval is there
    assert delta.evaluate("td => td.scrollWidth <= td.clientWidth"), delta.inner_text()


def test_a_long_chart_label_stays_inside_the_chart_and_whole_on_hover(page):
    """A row label is right-aligned at the plot's edge: a nightly host label of 90 characters ran off the SVG's
    left edge, and '…hosted-pool-number-seven · ort-cpu fp32' no longer said which host it was."""
    from matrix.report import charts

    long = "a-very-long-host-label-for-the-nightly-runner-macos-14-arm64-self-hosted-pool-number-seven · ort-cpu fp16"
    rows = [charts.Row(label, [charts.Mark(1e-3, "x", "#000")], href="#c") for label in (long, "linux · ort-cpu fp32")]
    page.set_content(f"<body style='margin:0'>{charts.dot_plot(rows, 'drift', str)}</body>")
    labels = page.eval_on_selector_all("svg a text", "ts => ts.map(t => [t.getBBox().x, t.textContent])")
    assert all(x >= 0 for x, _ in labels), labels
    assert labels[0][1].startswith("a-very-long") and labels[0][1].endswith("ort-cpu fp16")  # host and cell both shown
    assert labels[1][1] == "linux · ort-cpu fp32"  # a label that fits is left whole
    assert page.eval_on_selector("svg a title", "t => t.textContent") == long


def test_a_label_of_wide_letters_is_fitted_by_the_page_and_whole_on_hover(page, hostile_report, tmp_path):
    """The server fits labels by an estimate of letter widths: a merged host label of 40 capital W's still ran 69 px
    off the dot plots' left edge. The report's script measures each label in the page's font and shortens it."""
    from matrix.report import report

    merged = schema.load(hostile_report.parent / "results.json")
    wide = "W" * 40
    merged.hosts.append(merged.hosts[0].model_copy(update={"label": wide}))
    merged.cells += [cell.model_copy(update={"host": wide}) for cell in merged.cells]
    (tmp_path / "index.html").write_text(report.render_html(merged))
    page.goto((tmp_path / "index.html").as_uri())
    labels = page.eval_on_selector_all("svg.dotplot a", "links => links.map(a => [a.querySelector('text').getBBox().x, "
                                                        "a.querySelector('text').textContent, a.querySelector('title')?.textContent])")
    assert len(labels) == 2 * 2 * 3  # two charts, two hosts, three variants
    assert all(x >= 0 for x, _, _ in labels), labels
    for _, shown, whole in (label for label in labels if label[1].startswith("W")):
        assert "…" in shown and shown.endswith("ort-cpu " + whole.rsplit(" ", 1)[1]) and whole.startswith(f"{wide} · ")
