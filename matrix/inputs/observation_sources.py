"""Where the observation set comes from: the policy's own distribution first, always named.

Precedence: recorded (`--obs`) > states the float64 reference visited in its own
rollouts (`--env`) or the recorded trajectory (`--trajectory`), sampled evenly
over episodes and steps, each row with the recurrent state the reference carried
into that step > seeded synthetic rows. A side input given a value
(`--side-input`) holds that value in every set. Single-step drift on states a
policy never visits says little about the policy (SB3 Pendulum: 50 of 128
synthetic rows are states the environment can produce; int8 drift 0.286 there,
0.218 on its own states, equal returns), so a cell judged on synthetic rows says so.

The visited states are sampled inside the guarded reference job (they need the
reference's rollout or replay first) and saved as observations.npz like any other set.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .model import ModelInfo
from .observations import Feeds, given_words, whole_numbers_said

RECORDED, VISITED, TRAJECTORY, SYNTHETIC = "recorded", "visited", "trajectory", "synthetic"


@dataclass(frozen=True)
class ObservationSource:
    kind: str  # recorded | visited | trajectory | synthetic
    detail: str  # in words, for the report header and summary.md
    fallback_reason: str = ""  # why the policy's own states could not be used

    @property
    def sampled_by_reference(self) -> bool:
        """Rows of the float64 reference's own rollout or replay, sampled in its job once it has run."""
        return self.kind in (VISITED, TRAJECTORY)

    @property
    def synthetic(self) -> bool:
        """Not states the policy visited: drift judged on them says so."""
        return self.kind == SYNTHETIC

    def describe(self, size: int) -> str:
        why = f" ({self.fallback_reason})" if self.fallback_reason else ""
        return f"{size} {self.detail}{why}"


def choose(recorded: Path | None, plan, model: ModelInfo, seed: int, side: Feeds | None = None) -> ObservationSource:
    """The strongest source this run has; `plan` is the rollout plan (None without --env/--trajectory), `side` the
    side inputs' given values (--side-input), which every source holds in place of its own."""
    given = f"; {given_words(side)} as given" if side else ""
    source = _strongest(recorded, plan, model, seed)
    return ObservationSource(source.kind, source.detail + given, source.fallback_reason)


def _strongest(recorded: Path | None, plan, model: ModelInfo, seed: int) -> ObservationSource:
    if recorded:
        return ObservationSource(RECORDED, f"recorded observations from {Path(recorded).name}")
    ranges = whole_numbers_said(model)
    # The seed first: it seeds every input's rows, and after a pixel input's clause it read as that input's own.
    synthetic = (f"synthetic rows (seed {seed}: normal samples and edge values{'; ' + ranges if ranges else ''}): "
                 "not states the policy visits")
    if plan is None:
        return ObservationSource(SYNTHETIC, synthetic, "pass --obs or --env for the policy's own states")
    carried = f", each with the {_names([s.input for s in plan.states])} the reference carried into it" if plan.states else ""
    if plan.open_loop:
        return ObservationSource(TRAJECTORY, f"observations of the trajectory {Path(plan.trajectory).name}, sampled "
                                 f"evenly{carried}")
    return ObservationSource(VISITED, f"states the float64 reference visited in {plan.episodes} episodes of {plan.env} "
                             f"(seeds {plan.seed}..{plan.seed + plan.episodes - 1}), sampled evenly over episodes and "
                             f"steps{carried}")


def _names(inputs: list[str]) -> str:
    return " and ".join(repr(name) for name in inputs)


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


def visited_feeds(runs: list[Feeds], plan, count: int, multiple: int = 1) -> Feeds:
    """The observation set from the reference's episodes (or a trajectory as one run): one array per observation
    input in the model's dtype and shape, each recurrent state input as the reference carried it into the same
    step (its batch on the state's own axis), and each side input as the episodes fed it. The rows are the same
    steps for every input: which steps are taken depends only on the runs' lengths."""
    runs = [run for run in runs if len(next(iter(run.values())))]

    def sampled(name: str, shape: list[int], dtype: str) -> np.ndarray:
        return sample_evenly([np.asarray(run[name]).reshape([len(run[name]), *shape]) for run in runs],
                             count, multiple).astype(dtype)

    states = {s.input: _state_rows(sampled(s.input, s.shape, s.dtype), s) for s in plan.states}
    return {**{o.input: sampled(o.input, o.shape, o.dtype) for o in plan.observations}, **states, **plan.side_feeds}


def _state_rows(rows: np.ndarray, state) -> np.ndarray:
    """[rows, *state shape] with the rows on the state's batch axis (an LSTM's [layers, batch, hidden]: axis 1); a
    state without a batch axis is fed whole: the value it starts from."""
    if state.axis is None:
        return rows[0]
    return np.ascontiguousarray(np.moveaxis(rows, 0, state.axis))


def feeds_sha256(feeds: Feeds) -> str:
    """The observation set's identity: names, dtypes, shapes and bytes (not the .npz's zip metadata)."""
    digest = hashlib.sha256()
    for name in sorted(feeds):
        array = np.ascontiguousarray(feeds[name])
        digest.update(f"{name}|{array.dtype.str}|{list(array.shape)}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()
