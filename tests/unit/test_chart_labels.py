"""A chart row's label fits left of the plot whatever its letters: a host label of CJK letters or emoji (a full em
each, twice a Latin letter) was cut by character count and, in Chromium with a CJK font, ran 77 px off the left edge."""

from __future__ import annotations

import re
import unicodedata

import pytest

from matrix.report import charts


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(char) in "WF" else 1 for char in text)


@pytest.mark.parametrize("host", ["東京データセンター第三ラック上段のビルドマシン🚀🚀", "🚀" * 40, "東" * 40,
                                  "ＡＢＣ東京" * 5 + "-linux-runner-x86-64-large", "ci-linux-x86-64-large-runner-number-17"],
                         ids=["cjk-and-emoji", "emoji", "cjk", "fullwidth-and-latin", "latin"])
def test_a_long_label_keeps_its_start_and_end_within_the_label_column(host):
    label = f"{host} · ort-cpu fp32"
    svg = str(charts.dot_plot([charts.Row(label, [charts.Mark(1e-3, "t", "#000")])], "drift", str))
    (shown,) = re.findall(r'text-anchor="end" fill="#1d2330">([^<]*)</text>', svg)
    assert _width(shown) <= charts.LABEL_CHARS, shown
    assert shown.startswith(host[0]) and shown.endswith(" · ort-cpu fp32") and "…" in shown
    assert f"<title>{label}</title>" in svg  # the whole label on hover


def test_a_short_wide_label_is_shown_whole():
    svg = str(charts.dot_plot([charts.Row("東京 · ort-cpu fp32", [charts.Mark(1e-3, "t", "#000")])], "drift", str))
    assert ">東京 · ort-cpu fp32</text>" in svg and "…" not in svg
