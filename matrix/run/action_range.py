"""Can the policy reach the whole action space it drives? (with `--env`)

An SB3 SAC export ends in Tanh, so its actions stay in [-1, 1], while Pendulum
takes torques in [-2, 2]: SB3 rescales outside the graph, and a caller who feeds
the exported actions straight to the env gets half the actuator range (return
-265.6 instead of -129.8). The reachable range comes from the graph (a final
Tanh, Sigmoid, Clip or Min/Max pair) or, where the graph states none, from the
actions the float64 reference took in its episodes, where they pile up at an
extreme inside the space (a saturating output, not a policy that merely stays
away from its limits).
"""

from __future__ import annotations

import numpy as np

from ..inputs.contract import action_output
from ..inputs.graph_facts import action_bounds
from ..inputs.lint import Lint
from ..inputs.model import ModelInfo
from ..results import LintResult, RunResults
from .rollouts import ReferenceRollout, RolloutPlan

# Below this share of the action space's width, the policy's range "covers less" than the space.
FULL_COVERAGE = 0.99
# Observed actions show a bound when at least this share of steps sit within this fraction of the width of their extreme.
PILE_SHARE = 0.05
PILE_TOLERANCE = 1e-3


def add_to(results: RunResults, model: ModelInfo, plan: RolloutPlan, reference: ReferenceRollout | None) -> None:
    """The lint among the run's lints, and where it warns, a note in the Behaviour section."""
    found = reach_lint(model, plan, reference)
    if found is None:
        return
    results.lints.append(LintResult(**vars(found)))
    if found.level == "warn":
        results.run_options["rollout"]["action_range"] = found.message


def reach_lint(model: ModelInfo, plan: RolloutPlan, reference: ReferenceRollout | None) -> Lint | None:
    """The `action-range` lint of a continuous policy driving `plan.env`; None where it does not apply
    (no env, a discrete or unbounded action space, nothing known about what the policy reaches)."""
    if plan.open_loop or plan.action_low is None or plan.action_high is None:
        return None
    space_low, space_high = np.asarray(plan.action_low, np.float64), np.asarray(plan.action_high, np.float64)
    if not (np.isfinite(space_low).all() and np.isfinite(space_high).all()):
        return None
    reach = _reachable(model, space_low, space_high, reference)
    if reach is None:
        return None
    low, high, source = reach
    width = np.maximum(space_high - space_low, 1e-12)
    share = float(np.min((np.minimum(high, space_high) - np.maximum(low, space_low)).clip(min=0) / width))
    space = f"{plan.env}'s action space is {_interval(space_low, space_high)}"
    if share >= FULL_COVERAGE:
        return Lint("action-range", "ok", f"the policy's actions reach {_interval(low, high)} ({source}); {space}")
    return Lint(
        "action-range", "warn",
        f"the policy's actions reach only {_interval(low, high)} ({source}) but {space}: it covers {share:.0%} of it "
        "(an exporter that rescales outside the graph, as Stable-Baselines3 does, leaves the rescale to the caller)",
    )


def _reachable(model: ModelInfo, space_low: np.ndarray, space_high: np.ndarray,
               reference: ReferenceRollout | None) -> tuple[np.ndarray, np.ndarray, str] | None:
    stated = action_bounds(model, action_output(model))
    if stated is not None:
        low, high, source = stated
        return np.float64(low), np.float64(high), source
    episodes = reference.episodes if reference else []
    if not episodes or any(episode.discrete for episode in episodes):
        return None
    taken = np.concatenate([episode.actions.reshape(len(episode.actions), -1) for episode in episodes])
    low, high = _piled_extreme(taken, space_low, space_high, np.min), _piled_extreme(taken, space_low, space_high, np.max)
    if np.array_equal(low, space_low) and np.array_equal(high, space_high):
        return None
    return low, high, f"observed: the float64 reference's actions pile up there in {len(episodes)} episodes"


def _piled_extreme(taken: np.ndarray, space_low: np.ndarray, space_high: np.ndarray, extreme) -> np.ndarray:
    """Per dim, the observed extreme where many steps sit on it inside the space (a saturating output:
    the mark of a bound in the policy), else the space's own bound. A policy that merely does not use
    its whole range spreads below its extremes and is not flagged."""
    width = space_high - space_low
    value = extreme(taken, axis=0)
    bound = space_high if extreme is np.max else space_low
    piled = (np.abs(taken - value) <= PILE_TOLERANCE * width).mean(axis=0) >= PILE_SHARE
    inside = np.abs(bound - value) > PILE_TOLERANCE * width
    return np.where(piled & inside, value, bound)


def _interval(low, high) -> str:
    low, high = np.atleast_1d(low), np.atleast_1d(high)
    if np.all(low == low[0]) and np.all(high == high[0]):
        return f"[{low[0]:.4g}, {high[0]:.4g}]"
    return f"[{', '.join(f'{v:.3g}' for v in low)}] .. [{', '.join(f'{v:.3g}' for v in high)}]"
