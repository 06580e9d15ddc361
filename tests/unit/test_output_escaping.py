"""Outputs safe for every consumer, on a saved real shard whose fields carry hostile text (a host label
or a shard's fields arrive from other machines): spreadsheets, junit readers, Markdown renderers."""

from __future__ import annotations

import csv
import xml.etree.ElementTree as ET

from saved import FIXTURES

from matrix import results as schema
from matrix.report.report import write_all

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
