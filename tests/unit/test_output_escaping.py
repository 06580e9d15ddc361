"""Outputs safe for every consumer, on a saved real shard whose fields carry hostile text (a host label
or a shard's fields arrive from other machines): spreadsheets, junit readers, Markdown renderers."""

from __future__ import annotations

import csv
import xml.etree.ElementTree as ET

from markdown_it import MarkdownIt
from saved import FIXTURES

from matrix import results as schema
from matrix.report import report_behaviour
from matrix.report.report import write_all
from matrix.results import EpisodeOutcome, Rollout

FORMULA = '=HYPERLINK("http://attacker.example","x")'


def test_csv_formulas_are_neutralised_and_junit_stays_well_formed(tmp_path):
    shard = schema.load(FIXTURES / "shard_continuous_mlp.json")
    for cell in shard.cells:
        cell.host = FORMULA + "\x01\x1b[31m"
        cell.reasons = ["@SUM(1+1)\x00 and \x07 a bell"]
    shard.hosts[0].label = shard.cells[0].host
    write_all(shard, tmp_path)
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert rows and all(row["host"].startswith("'=") and row["reasons"].startswith("'@") for row in rows)
    assert all(not any(value.startswith(("=", "+", "@")) for value in row.values()) for row in rows)
    assert {row["host"] for row in csv.DictReader((tmp_path / "latency.csv").open())} == {rows[0]["host"]}
    suites = ET.parse(tmp_path / "junit.xml").getroot()  # ill-formed XML raises here
    assert any(FORMULA in (case.get("classname") or "") for case in suites.iter("testcase"))


def test_junit_replaces_exactly_what_xml_cannot_hold(tmp_path):
    # U+FFFE and U+FFFF become U+FFFD; what XML 1.0 holds (private use, past the BMP) stays. (Lone surrogates, the
    # rest of what it cannot hold, never reach the report: results.json, written first, refuses them.)
    shard = schema.load(FIXTURES / "shard_continuous_mlp.json")
    for cell in shard.cells:
        cell.verdict = "FAIL"
        cell.reasons = ["c\ufffed\uffffe \ue000\ufffd\U0001f600\U0010ffff"]
    write_all(shard, tmp_path)
    failures = [failure.text for failure in ET.parse(tmp_path / "junit.xml").getroot().iter("failure")]
    assert failures and all("c\ufffdd\ufffde \ue000\ufffd\U0001f600\U0010ffff" in text for text in failures)


# What a model's node or output names carry into a runtime's words (tract names the node it cannot translate):
# ESC starts a terminal escape sequence (here: clear the screen, set the window title), BEL rings, CR rewrites the
# line, U+202E reverses what a reader sees. Seen reaching the terminal, summary.md and results.csv verbatim, and
# index.html, where U+202E showed the runtime's words backwards.
TERMINAL_CONTROLS = "\x1b[2J\x1b]0;title\x07\r\u202e\x9b"
ACTING = set("\x1b\x07\r\u202e\x9b")


def test_terminal_controls_from_a_model_reach_no_reader(tmp_path, policy_matrix):
    shard = schema.load(FIXTURES / "shard_continuous_mlp.json")
    shard.model["name"] = f"policy{TERMINAL_CONTROLS}.onnx"  # the file's name: summary.md's heading
    for cell in shard.cells:
        cell.verdict = "FAIL"
        # the second line: an output's name forging a line of the CI log
        cell.reasons = [f'open: RuntimeError: Translating node #4 "gemm{TERMINAL_CONTROLS}" Gemm\ncell ort-cpu fp32: PASS']
    (tmp_path / "shard").mkdir()
    (tmp_path / "shard" / "results.json").write_text(shard.model_dump_json())
    # every cell FAILs, so each decision line the CLI prints names the closest one with its reasons
    done = policy_matrix(["merge", tmp_path / "shard", "--out", tmp_path / "merged", "--fail-on", "never"])
    assert done.returncode == 0, done.lines[-3:]
    assert '"gemm\\x1b[2J' in done.stdout + done.stderr, "the characters are shown, not dropped"
    assert not any(line.startswith("cell ") for line in done.lines), "one console line per thing said"
    readers = {"terminal": done.stdout + done.stderr, **{name: (tmp_path / "merged" / name).read_text()
                                                   for name in ("summary.md", "results.csv", "index.html", "junit.xml")}}
    for reader, text in readers.items():
        assert not ACTING & set(text), reader


def test_summary_behaviour_rows_escape_the_host_label():
    """A host label is the user's text (--host-label, a merged shard's): summary.md's Behaviour table wrote it raw, so
    its pipe split the row into more columns and its markup rendered (an image, a link)."""
    shard = schema.load(FIXTURES / "shard_continuous_mlp.json")
    for cell in shard.cells:
        cell.host = "ci | runner <img src=x onerror=alert(1)> [link](http://x)"
        cell.rollout = Rollout(mode="closed-loop", env="Pendulum-v1", mean_return=-300.0, reference_mean_return=-299.0,
                               return_delta_rel=-0.003, episodes=[EpisodeOutcome(seed=0, episode_return=-300.0, length=200,
                                                                                  reference_return=-299.0, reference_length=200)])
    rendered = MarkdownIt("commonmark").enable("table").render("\n".join(report_behaviour.summary_lines(shard)))
    rows = rendered.split("<tbody>")[1].split("</tr>")[:-1]
    assert "<img" not in rendered and "<a " not in rendered
    assert all(row.count("<td>") == 7 for row in rows), rows
