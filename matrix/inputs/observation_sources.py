"""Where the observation set comes from: the policy's own distribution first, always named.

Precedence: recorded (`--obs`) > states the float64 reference visited in its own
rollouts (`--env`) or the recorded trajectory (`--trajectory`), sampled evenly
over episodes and steps > samples inside the environment's observation space
(`--env`, when the rollouts cannot give the set: a model with a recurrent state
beside the observation) > seeded synthetic rows. A side input given a value
(`--side-input`) holds that value in every set. Single-step drift on states a
policy never visits says little about the policy (SB3 Pendulum: 50 of 128
synthetic rows are states the environment can produce; int8 drift 0.286 there,
0.218 on its own states, equal returns), so a cell judged on synthetic rows says so.

The visited states are sampled inside the guarded reference job (they need the
reference's rollout first) and saved as observations.npz like any other set.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .model import ModelInfo
from .observations import Feeds, pixels_said

RECORDED, VISITED, TRAJECTORY, SPACE, SYNTHETIC = "recorded", "visited", "trajectory", "space", "synthetic"


@dataclass(frozen=True)
class ObservationSource:
    kind: str  # recorded | visited | trajectory | space | synthetic
    detail: str  # in words, for the report header and summary.md
    fallback_reason: str = ""  # why the policy's own states could not be used

    @property
    def synthetic(self) -> bool:
        """Not states the policy visited: drift judged on them says so."""
        return self.kind in (SPACE, SYNTHETIC)

    def describe(self, size: int) -> str:
        why = f" ({self.fallback_reason})" if self.fallback_reason else ""
        return f"{size} {self.detail}{why}"


def choose(recorded: Path | None, plan, model: ModelInfo, seed: int, side: Feeds | None = None) -> ObservationSource:
    """The strongest source this run has; `plan` is the rollout plan (None without --env/--trajectory), `side` the
    side inputs' given values (--side-input), which every source holds in place of its own."""
    given = "".join(f"; {name} = {json.dumps(value.tolist())} as given" for name, value in (side or {}).items())
    source = _strongest(recorded, plan, model, seed, set(side or {}))
    return ObservationSource(source.kind, source.detail + given, source.fallback_reason)


def _strongest(recorded: Path | None, plan, model: ModelInfo, seed: int, side: set[str]) -> ObservationSource:
    if recorded:
        return ObservationSource(RECORDED, f"recorded observations from {Path(recorded).name}")
    pixels = pixels_said(model)
    # The seed first: it seeds every input's rows, and after a pixel input's clause it read as that input's own.
    synthetic = (f"synthetic rows (seed {seed}: normal samples and edge values{'; ' + pixels if pixels else ''}): "
                 "not states the policy visits")
    if plan is None:
        return ObservationSource(SYNTHETIC, synthetic, "pass --obs or --env for the policy's own states")
    if plan.open_loop:
        return ObservationSource(TRAJECTORY, f"observations of the trajectory {Path(plan.trajectory).name}, sampled evenly")
    if [spec.name for spec in model.inputs if spec.name not in side] != plan.observation_names:
        return ObservationSource(SPACE, f"samples inside {plan.env}'s observation space (uniform where bounded, normal "
                                 f"where not; other inputs seeded, seed {seed})", "the rollouts record only the observation "
                                 "inputs, and the model has others (recurrent state)")
    return ObservationSource(VISITED, f"states the float64 reference visited in {plan.episodes} episodes of {plan.env} "
                             f"(seeds {plan.seed}..{plan.seed + plan.episodes - 1}), sampled evenly over episodes and steps")


def sample_evenly(runs: list[np.ndarray], count: int, multiple: int = 1) -> np.ndarray:
    """`count` rows (a multiple of `multiple`, at most all there are) spread over the runs (episodes) as
    equally as their lengths allow, evenly spaced within each."""
    total = sum(len(run) for run in runs)
    count = min(count, total)
    count = max(multiple, count - count % multiple) if total >= multiple else total
    shares = _shares([len(run) for run in runs], count)
    picked = [run[np.linspace(0, len(run) - 1, share).round().astype(int)] for run, share in zip(runs, shares) if share]
    return np.concatenate(picked)[:count]


def _shares(lengths: list[int], count: int) -> list[int]:
    """Equal shares per run, capped by each run's length; what a short run cannot take goes to the others."""
    shares = [0] * len(lengths)
    left = count
    while left > 0:
        open_runs = [i for i, length in enumerate(lengths) if shares[i] < length]
        if not open_runs:
            break
        each = max(1, left // len(open_runs))
        for i in open_runs:
            take = min(each, lengths[i] - shares[i], left)
            shares[i] += take
            left -= take
            if left == 0:
                break
    return shares


def visited_feeds(episode_observations: list[Feeds], plan, count: int, multiple: int = 1) -> Feeds:
    """The observation set from the reference's episodes (or a trajectory as one run), one array per observation
    input in the model's dtype and shape, and each side input as the episodes fed it. The rows are the same steps
    for every input: which steps are taken depends only on the runs' lengths."""
    runs = [run for run in episode_observations if len(next(iter(run.values())))]
    return {**{o.input: sample_evenly([np.asarray(run[o.input]).reshape([len(run[o.input]), *o.shape]) for run in runs],
                                      count, multiple).astype(o.dtype)
               for o in plan.observations}, **plan.side_feeds}


def inside_space(feeds: Feeds, plan, seed: int) -> Feeds:
    """`feeds` (seeded rows) with each observation input drawn inside its part of the environment's observation
    space (a Dict's entry of its name, else the whole) instead."""
    from ..run.rollouts import make_env, observation_spaces

    env = make_env(plan.env, plan.env_kwargs)
    try:
        parts = observation_spaces(env.observation_space, plan)
    finally:
        env.close()
    rng = np.random.default_rng(seed)
    return {**feeds, **{o.input: _inside(parts[o.input], o, len(feeds[o.input]), rng) for o in plan.observations}}


def _inside(space, observed, rows: int, rng: np.random.Generator) -> np.ndarray:
    """Uniform inside the Box bounds where both are finite, a clipped normal sample where not."""
    low = np.broadcast_to(np.asarray(getattr(space, "low", -np.inf), np.float64), space.shape or ()).reshape(observed.shape)
    high = np.broadcast_to(np.asarray(getattr(space, "high", np.inf), np.float64), space.shape or ()).reshape(observed.shape)
    bounded = np.isfinite(low) & np.isfinite(high)
    values = np.where(bounded, rng.uniform(np.where(bounded, low, 0), np.where(bounded, high, 1), (rows, *observed.shape)),
                      np.clip(rng.standard_normal((rows, *observed.shape)), low, high))
    return values.astype(observed.dtype)


def feeds_sha256(feeds: Feeds) -> str:
    """The observation set's identity: names, dtypes, shapes and bytes (not the .npz's zip metadata)."""
    digest = hashlib.sha256()
    for name in sorted(feeds):
        array = np.ascontiguousarray(feeds[name])
        digest.update(f"{name}|{array.dtype.str}|{list(array.shape)}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()
