"""The p50 a real cell reports: one worker process, exactly as `policy-matrix run` times it."""

from __future__ import annotations

import tempfile
from pathlib import Path

from matrix.run import cells, variants
from matrix.inputs import observations
from matrix.inputs.model import ModelInfo


def cell_p50(target: str, info: ModelInfo, feeds: observations.Feeds, batch: int, iters: int) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        observations.save(feeds, folder / "obs.npz")
        paths, errors = variants.produce_all(info, ["fp32"], folder)
        spec = cells.CellSpec(
            target=target, variant="fp32", observations=str(folder / "obs.npz"),
            onnx_variants={k: str(v) for k, v in paths.items()}, variant_errors=errors,
            batch_sizes=[batch], warmup=50, iters=iters, batch_axes=info.batch_axes,
        )
        worker = cells.WorkerProcess(memory_limit=None, lifetime_s=600)  # the worker a run's cells share
        try:
            outcome = cells.execute(folder / "cell", spec, {}, 600, lambda _: None, None, worker)
        finally:
            worker.stop()
        return outcome.measurement.latency[0].p50_us
