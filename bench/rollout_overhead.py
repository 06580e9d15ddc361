"""Per-step cost of a runtime in the loop, per target family, against a bare loop of the same runtime.

For each target, one real cell worker (exactly as `policy-matrix run --env` drives it)
runs Pendulum-v1 episodes with the hand-written controller at batch 1, and times
the same runtime's bare call loop (its `time()`: inside the process or page). Then

    step      = wall time per step of the rollout (runtime call + environment + harness)
    env       = one env.step() alone, in this process, with a fixed action
    bare      = p50 of one call in the runtime's own timing loop
    overhead  = step - env - bare: what driving the runtime from the loop adds per step
                (Python -> page round trip for browser targets, -> node for ort-node)

    .venv/bin/python bench/rollout_overhead.py [--targets ort-cpu,tflite,...] [--episodes 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import rollout_policies  # noqa: E402

import targets  # noqa: E402
from matrix.run import cells, rollouts, variants  # noqa: E402
from matrix.inputs import observations  # noqa: E402
from matrix.inputs import model as model_loader  # noqa: E402
from matrix.run.orchestrate import Services  # noqa: E402
from matrix.run.protocol import Measurement  # noqa: E402

FAMILIES = ("ort-cpu", "ort-node", "ort-web-wasm", "tflite", "tract")
ENV = "Pendulum-v1"


def env_step_us(steps: int = 2000) -> float:
    env = rollouts.make_env(ENV, {})
    env.reset(seed=0)
    action = np.zeros(1, dtype=np.float32)
    samples = []
    for _ in range(steps):
        start = time.perf_counter_ns()
        _, _, terminated, truncated, _ = env.step(action)
        samples.append(time.perf_counter_ns() - start)
        if terminated or truncated:
            env.reset(seed=0)
    env.close()
    return statistics.median(samples) / 1e3


def cell(target: str, folder: Path, policy: Path, episodes: int, services: Services) -> Measurement:
    info = model_loader.load(policy)
    observations.save(observations.seeded(info, 8, 0), folder / "obs.npz")
    paths, errors = variants.produce_all(info, ["fp32"], folder)
    plan = rollouts.plan_for(info, env=ENV, episodes=episodes, seed=0)
    spec = cells.CellSpec(
        target=target, variant="fp32", observations=str(folder / "obs.npz"),
        onnx_variants={k: str(v) for k, v in paths.items()}, variant_errors=errors,
        batch_sizes=[1], warmup=50, iters=500, rollout=plan.as_dict(), batch_axes=info.batch_axes,
    )
    env = services.env_for(targets.get(target))
    return cells.execute(folder / target, spec, env, 600, lambda _: None).measurement


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(FAMILIES))
    parser.add_argument("--episodes", type=int, default=2)
    args = parser.parse_args()
    env_us = env_step_us()
    print(f"{ENV}: env.step alone {env_us:.1f} us (median)")
    print(f"{'target':14} {'step us':>9} {'bare us':>9} {'overhead us':>12} {'step/bare':>10} {'steps':>6}")
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        policy = rollout_policies.pendulum(folder / "pendulum.onnx")
        services = Services(folder)
        try:
            for name in args.targets.split(","):
                reason = targets.get(name).unavailable_reason()
                if reason:
                    print(f"{name:14} skipped: {reason}")
                    continue
                measured = cell(name, folder, policy, args.episodes, services)
                if measured.rollout is None:
                    print(f"{name:14} failed: {measured.error or measured.skip}")
                    continue
                step = measured.rollout["seconds"] / measured.rollout["steps"] * 1e6
                bare = measured.latency[0].p50_us
                print(f"{name:14} {step:9.1f} {bare:9.1f} {step - env_us - bare:12.1f} {step / bare:10.1f}"
                      f" {measured.rollout['steps']:6d}")
        finally:
            services.stop_all()


if __name__ == "__main__":
    main()
