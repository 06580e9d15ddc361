"""The HTML report, opened in real headless Chromium the way a person opens it."""

import onnx
import pytest
from conftest import run_cli
from playwright.sync_api import sync_playwright

from matrix.examples import path as example

HOSTILE_NODE = '<img src=x onerror="window.__pwned=1">'
HOSTILE_META = "</style><script>window.__pwned=2</script>"
BROWSER_FLAGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def page():
    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(args=BROWSER_FLAGS)
        except Exception:  # no Playwright-managed browser here: the system Chromium
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=BROWSER_FLAGS)
        yield browser.new_page()
        browser.close()


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
    for chart in ("#drift-chart svg", "#latency-chart svg"):
        box = page.locator(chart).bounding_box()
        assert box and box["width"] > 200 and box["height"] > 50, chart
        assert page.locator(f"{chart} path").count() > 10  # bars, axes and outlined text were drawn


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
