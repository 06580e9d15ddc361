"""Where the unit tier's saved fixtures live (tests/fixtures/), and how a test reads one."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def fixture_json(name: str):
    return json.loads((FIXTURES / name).read_text())
