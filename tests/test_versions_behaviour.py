"""The Versions table with `--env`: each release's return delta from a real closed-loop run of two onnxruntime
releases (the pinned one installed for real, once, into the shared cache), and the p50 ratio's noise band."""

from __future__ import annotations

import re

import pytest
import rollout_policies
from conftest import load_results, run_cli

pytestmark = pytest.mark.slow


def test_the_versions_table_shows_return_delta_and_p50_band_with_env(tmp_path):
    policy = rollout_policies.cartpole(tmp_path / "cartpole.onnx")
    done = run_cli("run", policy, "--targets", "ort-cpu@1.22.0,ort-cpu", "--variants", "fp32", "--env", "CartPole-v1",
                   "--episodes", "3", "--iters", "100", "--warmup", "5", "--batch-sizes", "1", "--out", tmp_path / "out",
                   timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    cells = {cell["target"]: cell for cell in load_results(tmp_path / "out")["cells"]}
    assert cells["ort-cpu@1.22.0"]["runtime_version"] == "onnxruntime 1.22.0"
    deltas = [cells[label]["rollout"]["return_delta"] for label in ("ort-cpu", "ort-cpu@1.22.0")]
    html = (tmp_path / "out" / "index.html").read_text()
    section = html[html.index('id="versions"'):]
    text = re.sub(r"<[^>]+>", " ", section[:section.index("</section>")])
    assert "return Δ (reference → release)" in text
    assert re.search(rf"{re.escape(f'{deltas[0]:+.4g}')}\s+→\s+{re.escape(f'{deltas[1]:+.4g}')}", text)
    assert re.search(r"\d\.\d\d×\s+\(\d\.\d\d–\d\.\d\d\)", text)  # the ratio and its noise band
    for cell in cells.values():
        stats = cell["latency"][0]
        assert stats["p50_low_us"] <= stats["p50_us"] <= stats["p50_high_us"]
