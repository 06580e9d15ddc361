"""The grid line a run prints before its first cell counts each axis in words a person reads aloud."""

from __future__ import annotations

import pytest
from rich.console import Console

from matrix.inputs import examples
from matrix.run.orchestrate import RunConfig, _print_grid


@pytest.mark.parametrize("targets, variants, size, line", [
    (["ort-cpu"], ["fp32"], 1, "grid: 1 configuration: 1 target; 1 variant"),
    (["ort-cpu", "tract"], ["fp32", "fp16"], 4, "grid: 4 configurations: 2 targets; 2 variants"),
])
def test_the_grid_line_says_one_in_the_singular(load_policy, tmp_path, targets, variants, size, line):
    """It said '1 targets; 1 variants' for the commonest run of all, one target at one variant."""
    console = Console(record=True, width=200)
    _print_grid(RunConfig(load_policy(examples.continuous_mlp()), targets, variants, tmp_path), size, console)
    assert console.export_text().splitlines()[0] == line
