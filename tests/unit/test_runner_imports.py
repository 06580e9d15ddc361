"""The runner imports what it needs after its reference job beside its first cells: as untimed work, so no cell's
cold start or latency is timed while it imports (matrix.run.orchestrate._import_untimed)."""

from __future__ import annotations

import importlib
import threading

from matrix.run import cells, orchestrate
from matrix.run.protocol import TIMED, UNTIMED


def test_a_timed_stage_waits_for_the_runners_imports_and_untimed_ones_do_not(monkeypatch):
    importing, imported = threading.Event(), threading.Event()

    def slow_import(name: str) -> None:
        importing.set()
        imported.wait(60)

    monkeypatch.setattr(importlib, "import_module", slow_import)
    gate = cells.StageGate()
    loading = orchestrate._import_untimed(gate, ("a.module",))
    assert importing.wait(60)
    gate.acquire(UNTIMED)  # a cell's session opening, beside the imports
    gate.release(UNTIMED)
    timed = threading.Thread(target=gate.acquire, args=(TIMED,), daemon=True)
    timed.start()
    timed.join(0.2)
    assert timed.is_alive(), "a latency was granted while the runner imported"
    imported.set()
    timed.join(60)
    loading.join(60)
    assert not timed.is_alive() and not loading.is_alive()
