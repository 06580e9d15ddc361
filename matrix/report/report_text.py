"""How the report names and colours a cell, and how untrusted text enters Markdown: shared by report.py
and its sections (report_behaviour.py), which it imports."""

from __future__ import annotations

from ..errors import printable
from ..results import Cell

COLOURS = {"PASS": "#2e9e5b", "WARN": "#e0a100", "FAIL": "#d64545", "SKIP": "#9aa0a6", "CONVERTED": "#4a7bd0"}


def cell_label(cell: Cell, multi_host: bool) -> str:
    """A chart's name for a cell: 'ort-cpu fp32 · student.onnx', the host first when several are merged."""
    label = f"{cell.target} {cell.variant}" + (f" · {cell.configuration.axes}" if cell.configuration.axes else "")
    return f"{cell.host} · {label}" if multi_host else label


def md(text: str) -> str:
    """Untrusted text in Markdown prose: every markup character escaped, line breaks and HTML neutralised."""
    text = printable(" ".join(str(text).split()))
    for char in "\\`*_[]<>|#~!&":
        text = text.replace(char, f"\\{char}")
    return text
