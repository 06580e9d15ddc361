"""Behaviour in the loop: episodes driven by one runtime, compared with the float64 reference's.

Single-step drift is not what an RL user ships on: a policy that drifts 0.15 per
step can score the same return, one that drifts 0.04 can flip the actions that
matter. Here a `step(feeds) -> outputs` callable (a cell's own session at batch 1,
or the float64 reference) drives a Gymnasium environment; episode i resets with
seed + i (Stable-Baselines3's evaluation convention), so every cell and host
sees the same initial states. A recurrent policy (an input/output state pair)
carries its state from step to step, starting from zeros or the values given
(`--initial-state`).

Without an environment, a recorded observation sequence is replayed open loop
(`--trajectory`) and the drift of each step's action is reported along it.

The environment runs beside the session (in the cell's worker); the comparison
with the reference runs in the core. Gymnasium is imported only here, only when
a rollout is asked for (the `rl` extra).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..inputs import graph_facts
from ..judge import stats
from .. import userfiles, validated
from ..errors import InputError
from ..inputs.batch_axes import batch_dim, without_batch
from ..inputs.model import ModelInfo, TensorSpec
from ..inputs.observations import Feeds, check_held, first_non_finite
from ..judge.rules import RETURN_FLOOR

Step = Callable[[Feeds], Feeds]

# A trajectory has left the reference's at the first step whose observation differs
# from the reference's by more than this (max abs over the observation's elements).
DIVERGENCE_EPSILON = 1e-3
# Continuous actions "agree" when no element differs by more than this.
ACTION_EPSILON = 1e-3


@dataclass
class StatePair:
    input: str
    output: str
    shape: list[int]  # without the batch dimension
    dtype: str
    initial: list | None = None  # --initial-state: the values every episode starts from (None: zeros)
    axis: int | None = 0  # where the batch of 1 goes (an LSTM's [layers, batch, hidden]: 1); None: no batch

    @property
    def fed_shape(self) -> list[int]:
        """The shape fed at batch 1."""
        return self.shape if self.axis is None else [*self.shape[: self.axis], 1, *self.shape[self.axis :]]


@dataclass
class RolloutPlan:
    """What a worker needs to drive episodes; travels in the cell's spec.json."""

    obs_input: str
    obs_shape: list[int]  # without the batch dimension
    obs_dtype: str
    action_output: str
    env: str = ""
    env_kwargs: dict = field(default_factory=dict)
    episodes: int = 10
    seed: int = 0
    clip_actions: bool = False
    states: list[StatePair] = field(default_factory=list)
    trajectory: str = ""  # .npy of recorded observations, replayed open loop instead of an env
    initial_state: str = ""  # the --initial-state file's name, for the report (the values are in `states`)
    action_low: list[float] | None = None  # a Box action space's bounds, flattened (read from the env by check())
    action_high: list[float] | None = None

    @classmethod
    def from_dict(cls, data: dict) -> "RolloutPlan":
        return cls(**{**data, "states": [StatePair(**s) for s in data.get("states", [])]})

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def open_loop(self) -> bool:
        return bool(self.trajectory)

    def describe(self) -> dict:
        """The run's options entry: what a reader needs to reproduce the episodes."""
        states = {"states": [s.input for s in self.states], "initial_state": self.initial_state or "zeros"} if self.states else {}
        if self.open_loop:
            return {"mode": "open-loop", "trajectory": Path(self.trajectory).name, **states}
        return {"mode": "closed-loop", "env": self.env, "env_kwargs": self.env_kwargs, "episodes": self.episodes,
                "seeds": f"{self.seed}..{self.seed + self.episodes - 1}", "clip_actions": self.clip_actions,
                **states, "divergence_epsilon": DIVERGENCE_EPSILON}


# --- the plan: which input is the observation, which output the action, which pairs are state ---

def state_pairs(model: ModelInfo) -> list[StatePair]:
    specs = {spec.name: spec for spec in model.inputs}
    return [StatePair(pair.input, pair.output, _fixed_dims(specs[pair.input], model), specs[pair.input].dtype, axis=pair.axis)
            for pair in model.state_pairs]


def plan_for(model: ModelInfo, **settings) -> RolloutPlan:
    """The rollout plan for this model; InputError when it cannot take one observation at a time."""
    states = state_pairs(model)
    state_inputs = {s.input for s in states}
    obs_candidates = [spec for spec in model.inputs if spec.name not in state_inputs]
    if len(obs_candidates) != 1:
        names = [spec.name for spec in obs_candidates]
        raise InputError(f"rollouts need one observation input besides recurrent state pairs, found {names}")
    obs = obs_candidates[0]
    for spec in model.inputs:
        batch = batch_dim(spec, model.batch_axes)
        if isinstance(batch, int) and batch != 1:
            raise InputError(f"rollouts run at batch 1, but input {spec.name!r} has a fixed batch of {batch}")
    state_outputs = {s.output for s in states}
    actions = [spec.name for spec in model.outputs if spec.name not in state_outputs]
    if not actions:
        raise InputError("rollouts need an action output besides recurrent state outputs")
    action = "action" if "action" in actions else actions[0]
    return RolloutPlan(obs_input=obs.name, obs_shape=_fixed_dims(obs, model), obs_dtype=obs.dtype, action_output=action,
                       states=states, **settings)


def _fixed_dims(spec: TensorSpec, model: ModelInfo) -> list[int]:
    dims = without_batch(spec, model.batch_axes)
    if not all(isinstance(d, int) for d in dims):
        raise InputError(f"rollouts need fixed non-batch dimensions, but {spec.name!r} has shape {spec.shape}")
    return list(dims)


def parse_env_kwargs(text: str) -> dict:
    value = validated.json_value(text or "{}", "--env-kwargs")  # bounded nesting, one line when it is not JSON
    if not isinstance(value, dict):
        raise InputError(f"--env-kwargs {text!r}: expected a JSON object, e.g. '{{\"g\": 9.81}}'")
    return value


# --- environments -------------------------------------------------------------------------------

def make_env(env: str, kwargs: dict):
    """A Gymnasium id, or `module:Class` for a user's own environment class."""
    try:
        import gymnasium as gym
    except ImportError:
        raise InputError("--env needs Gymnasium: pip install 'policy-matrix[rl]' (make setup installs it)") from None
    module_name, sep, attribute = env.partition(":")
    if sep and module_name and attribute.isidentifier():
        if os.getcwd() not in sys.path:  # a user's env module beside them, as `python -m` would find it
            sys.path.append(os.getcwd())
        try:
            env_class = getattr(importlib.import_module(module_name), attribute, None)
        except ImportError as error:
            raise InputError(f"--env {env!r}: cannot import {module_name!r} ({error})") from None
        if not isinstance(env_class, type):
            raise InputError(f"--env {env!r}: {module_name} has no class {attribute!r}")
        return env_class(**kwargs)
    try:
        return gym.make(env, **kwargs)
    except gym.error.Error as error:
        raise InputError(f"--env {env!r}: {error}") from None


def check(plan: RolloutPlan, limit_bytes: int | None = None) -> None:
    """Fail early, with one line, when the environment and the model do not fit together."""
    if plan.open_loop:
        recorded = load_trajectory(Path(plan.trajectory), plan, limit_bytes)
        if not len(recorded):
            raise InputError(f"{plan.trajectory}: the trajectory holds no observations")
        return
    if plan.episodes < 1:
        raise InputError("--episodes must be at least 1")
    try:
        env = make_env(plan.env, plan.env_kwargs)
    except TypeError as error:
        raise InputError(f"--env {plan.env!r} does not take these --env-kwargs: {userfiles.one_line(error)}") from None
    except InputError:
        raise
    except Exception as error:  # the user's environment code: whatever it raises is one line
        raise InputError(f"--env {userfiles.one_line(plan.env, 100)!r} could not be made: {_described(error)}") from None
    try:
        _check_spaces(env, plan)
    except InputError:
        raise
    except Exception as error:
        raise InputError(f"--env {userfiles.one_line(plan.env, 100)!r}: its spaces cannot be read: {_described(error)}") from None
    finally:
        with contextlib.suppress(Exception):  # a failing close() changes nothing the check found
            env.close()


def _described(error: Exception) -> str:
    return f"{type(error).__name__}: {userfiles.one_line(error)}"


def _check_spaces(env, plan: RolloutPlan) -> None:
    if env.observation_space.shape is None:
        raise InputError(f"--env {plan.env!r}: observation space {env.observation_space} is not supported (Box, Discrete)")
    obs_size = int(np.prod(env.observation_space.shape or (1,)))
    if obs_size != int(np.prod(plan.obs_shape)):
        raise InputError(
            f"--env {plan.env!r}: observations have shape {env.observation_space.shape}, "
            f"the model's {plan.obs_input!r} expects {plan.obs_shape}"
        )
    if _action_kind(env.action_space) == "continuous":
        plan.action_low = env.action_space.low.astype(np.float64).ravel().tolist()
        plan.action_high = env.action_space.high.astype(np.float64).ravel().tolist()


def _action_kind(space) -> str:
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return "discrete"
    if isinstance(space, spaces.MultiDiscrete):
        return "multi-discrete"
    if isinstance(space, spaces.Box):
        return "continuous"
    raise InputError(f"action space {space} is not supported (Box, Discrete, MultiDiscrete)")


def to_feed(observation, plan: RolloutPlan) -> np.ndarray:
    """Box -> the model's dtype and declared shape at batch 1; Discrete -> its integer."""
    return np.asarray(observation).astype(plan.obs_dtype).reshape([1, *plan.obs_shape])


def to_env_action(output: np.ndarray, space, clip: bool, kind: str = "") -> tuple[np.ndarray | int, bool]:
    """The policy's output as the action space expects it, and whether clipping changed it."""
    kind = kind or _action_kind(space)
    values = np.asarray(output)
    if kind == "discrete":
        if values.size != 1:
            raise ValueError(f"a Discrete action space needs one integer per step, the policy gave shape {values.shape}")
        return int(values.reshape(-1)[0]), False
    if kind == "multi-discrete":
        return values.astype(np.int64).reshape(space.shape), False
    action = values.astype(space.dtype).reshape(space.shape)
    if not clip:
        return action, False
    clipped = np.clip(action, space.low, space.high)
    return clipped, not np.array_equal(clipped, action)


# --- driving episodes --------------------------------------------------------------------------

@dataclass
class Episode:
    seed: int
    observations: np.ndarray  # [T, ...] the observations the policy acted on (as the env gave them)
    actions: np.ndarray  # [T, ...] the actions the env received
    rewards: np.ndarray  # [T]
    clipped_steps: int = 0
    discrete: bool = False

    @property
    def episode_return(self) -> float:
        return float(np.sum(self.rewards, dtype=np.float64))

    @property
    def length(self) -> int:
        return len(self.rewards)


def initial_state(plan: RolloutPlan) -> Feeds:
    return {s.input: np.zeros(s.fed_shape, dtype=s.dtype) if s.initial is None
            else np.asarray(s.initial, dtype=s.dtype).reshape(s.fed_shape) for s in plan.states}


def set_initial_state(plan: RolloutPlan, path: Path, limit_bytes: int | None = None) -> None:
    """--initial-state FILE.npz: one array per state input, with or without its batch of 1 (on the state's
    batch axis: [1, 1, 128] or [1, 128] for an LSTM's [layers, batch, hidden]); others start at zeros."""
    pairs = {s.input: s for s in plan.states}
    if not pairs:
        raise InputError(f"--initial-state {path.name}: the model has no recurrent state pair to start")
    given = userfiles.read_arrays(path, "initial state", limit_bytes)  # headers checked first, never unpickled
    if not isinstance(given, dict):
        raise InputError(f"--initial-state {path}: not a readable .npz file (a single array, not named arrays)")
    for name, value in given.items():
        pair = pairs.get(name)
        if pair is None:
            raise InputError(f"--initial-state: {name[:100]!r} is not a recurrent state input; those are {sorted(pairs)}")
        if value.dtype.kind not in "biuf" or list(value.shape) not in (pair.shape, pair.fed_shape):
            raise InputError(f"--initial-state: {name!r} is {value.dtype} {list(value.shape)}; the state is "
                             f"{pair.dtype} {pair.fed_shape}")
        if not np.isfinite(value.astype(np.float64)).all():
            raise InputError(f"--initial-state: {name!r} holds non-finite values")
        pair.initial = value.astype(pair.dtype).reshape(pair.shape).tolist()
    plan.initial_state = path.name


def run_episode(step: Step, env, plan: RolloutPlan, seed: int) -> Episode:
    observation, _ = env.reset(seed=seed)
    state = initial_state(plan)
    seen, actions, rewards, clipped_steps = [], [], [], 0
    kind = _action_kind(env.action_space)  # once: the loop's own cost is part of every step
    done = False
    while not done:
        outputs = step({plan.obs_input: to_feed(observation, plan), **state})
        state = {s.input: outputs[s.output] for s in plan.states}
        action, clipped = to_env_action(outputs[plan.action_output], env.action_space, plan.clip_actions, kind)
        seen.append(np.asarray(observation, dtype=np.float64))
        actions.append(np.asarray(action, dtype=np.float64))
        observation, reward, terminated, truncated, _ = env.step(action)
        rewards.append(float(reward))
        clipped_steps += clipped
        done = terminated or truncated
    return Episode(seed, np.stack(seen), np.stack(actions), np.asarray(rewards), clipped_steps, kind != "continuous")


def run_episodes(step: Step, plan: RolloutPlan, on_episode: Callable[[int], None] = lambda done: None) -> list[Episode]:
    env = make_env(plan.env, plan.env_kwargs)
    try:
        episodes = []
        for i in range(plan.episodes):
            episodes.append(run_episode(step, env, plan, plan.seed + i))
            on_episode(i + 1)
        return episodes
    finally:
        env.close()


def load_trajectory(path: Path, plan: RolloutPlan, limit_bytes: int | None = None) -> np.ndarray:
    """Recorded observations [T, *obs_shape] (or [T, 1, *obs_shape]) in the model's dtype."""
    recorded = userfiles.read_arrays(path, "trajectory", limit_bytes)  # headers checked before any data is read
    if not isinstance(recorded, np.ndarray) or recorded.ndim < 1:
        raise InputError(f"{path}: expected one array of observations [T, *obs_shape]")
    per_step = int(np.prod(recorded.shape[1:], dtype=np.int64))
    if per_step != int(np.prod(plan.obs_shape)):
        raise InputError(f"{path}: observations of shape {list(recorded.shape[1:])}, the model expects {plan.obs_shape}")
    shaped = recorded.reshape([len(recorded), *plan.obs_shape])
    with np.errstate(over="ignore", invalid="ignore"):  # a value beyond the input's dtype: refused below
        steps = shaped.astype(plan.obs_dtype)
    for values in (recorded, steps):  # as --obs: no state, and every cell would FAIL on it
        if (bad := first_non_finite(values)) is not None:
            raise InputError(f"{path}: holds a non-finite value at step {bad[0]} (as {values.dtype}): observations must be finite")
    check_held(shaped, steps, plan.obs_input, 0, path)
    return steps


def replay(step: Step, plan: RolloutPlan) -> np.ndarray:
    """Open loop: each recorded observation in order, state carried; the action of each step."""
    state = initial_state(plan)
    actions = []
    for observation in load_trajectory(Path(plan.trajectory), plan):
        outputs = step({plan.obs_input: observation[None], **state})
        state = {s.input: outputs[s.output] for s in plan.states}
        actions.append(np.asarray(outputs[plan.action_output], dtype=np.float64)[0])
    return np.stack(actions)


# --- the float64 reference in the loop -----------------------------------------------------------

def reference_step(model: ModelInfo) -> Step:
    """The float64 reference as a step function (float inputs widened, the graph evaluated exactly)."""
    from ..reference.reference import evaluator_for, to_float64

    evaluator = evaluator_for(to_float64(model.proto))
    names = [spec.name for spec in model.outputs]

    def step(feeds: Feeds) -> Feeds:
        wide = {name: value.astype(np.float64) if value.dtype.kind == "f" else value for name, value in feeds.items()}
        return dict(zip(names, evaluator.run(names, wide)))

    return step


@dataclass
class ReferenceRollout:
    episodes: list[Episode] = field(default_factory=list)
    actions: np.ndarray | None = None  # open loop: the reference's action per recorded step


def reference_rollout(model: ModelInfo, plan: RolloutPlan) -> ReferenceRollout:
    """What the float64 reference does in the same episodes: the behavioural ground truth."""
    return reference_from(*reference_drive(model, plan))


def reference_drive(model: ModelInfo, plan: RolloutPlan) -> tuple[dict, dict[str, np.ndarray]]:
    """The reference's episodes as the worker protocol's plain record (it runs in the guarded reference job)."""
    try:
        return drive(reference_step(model), plan, lambda progress: None)
    except (ValueError, TypeError, AssertionError) as error:  # the env refused the policy's own actions
        what = "the trajectory" if plan.open_loop else f"--env {plan.env!r}"
        raise InputError(f"the float64 reference policy cannot drive {what}: {' '.join(str(error).split())[:300]}") from None


def reference_from(measured: dict, arrays: dict[str, np.ndarray]) -> ReferenceRollout:
    if "rollout/replay_actions" in arrays:
        return ReferenceRollout(actions=arrays["rollout/replay_actions"])
    return ReferenceRollout(episodes=episodes_from(arrays, measured))


# --- worker <-> core: episodes as plain arrays ---------------------------------------------------

def episode_arrays(episodes: list[Episode]) -> dict[str, np.ndarray]:
    arrays = {}
    for i, episode in enumerate(episodes):
        arrays[f"rollout/{i}/observations"] = episode.observations
        arrays[f"rollout/{i}/actions"] = episode.actions
        arrays[f"rollout/{i}/rewards"] = episode.rewards
    return arrays


def episodes_from(arrays: dict[str, np.ndarray], measured: dict) -> list[Episode]:
    return [
        Episode(seed, arrays[f"rollout/{i}/observations"], arrays[f"rollout/{i}/actions"], arrays[f"rollout/{i}/rewards"],
                measured["clipped_steps"][i], measured["discrete"])
        for i, seed in enumerate(measured["seeds"])
    ]


def drive(step: Step, plan: RolloutPlan, on_progress: Callable[[str], None]) -> tuple[dict, dict[str, np.ndarray]]:
    """The worker's half: run the episodes (or the replay) with this step function."""
    started = time.perf_counter()
    if plan.open_loop:
        actions = replay(step, plan)
        return {"steps": len(actions), "seconds": time.perf_counter() - started}, {"rollout/replay_actions": actions}
    episodes = run_episodes(step, plan, lambda done: on_progress(f"{done}/{plan.episodes} episodes"))
    measured = {
        "seeds": [e.seed for e in episodes], "clipped_steps": [e.clipped_steps for e in episodes],
        "discrete": episodes[0].discrete,
        "steps": sum(e.length for e in episodes), "seconds": time.perf_counter() - started,
    }
    return measured, episode_arrays(episodes)


# --- comparison with the reference ---------------------------------------------------------------

def divergence_step(observations: np.ndarray, reference: np.ndarray, epsilon: float = DIVERGENCE_EPSILON) -> int | None:
    """First step whose observation is farther than epsilon from the reference's; where no
    observation differs but one episode ended earlier, the step where it ended; None if never."""
    common = min(len(observations), len(reference))
    distance = np.abs(observations[:common] - reference[:common]).reshape(common, -1).max(axis=1, initial=0.0)
    beyond = np.flatnonzero(distance > epsilon)
    if beyond.size:
        return int(beyond[0])
    return None if len(observations) == len(reference) else common


def action_agreement(actions: np.ndarray, reference: np.ndarray, discrete: bool) -> float | None:
    """Share of the common steps whose action equals the reference's (within ACTION_EPSILON if continuous)."""
    common = min(len(actions), len(reference))
    if common == 0:
        return None
    difference = np.abs(actions[:common] - reference[:common]).reshape(common, -1).max(axis=1)
    return float(np.mean(difference <= (0.0 if discrete else ACTION_EPSILON)))


def step_drift(actions: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Open loop: per recorded step, the largest |action - reference action|."""
    return np.abs(actions - reference).reshape(len(actions), -1).max(axis=1)


def relative_delta(value: float, reference: float) -> float:
    """Divided by max(|reference|, RETURN_FLOOR): returns near 0 stay meaningful."""
    return (value - reference) / max(abs(reference), RETURN_FLOOR)


# --- the core's half: the record (matrix/judge/rules.behaviour judges it) -------------------------------

def summarise(measured: dict | None, arrays: dict[str, np.ndarray], reference: ReferenceRollout | None, plan: RolloutPlan | None):
    """The cell's Rollout record, from what its worker drove and what the reference drove."""
    from ..results import Rollout

    if measured is None or reference is None or plan is None:
        return None
    step_us = measured["seconds"] / max(measured["steps"], 1) * 1e6
    if plan.open_loop:
        drift = step_drift(arrays["rollout/replay_actions"], reference.actions)
        return Rollout(mode="open-loop", steps=measured["steps"], step_us=step_us, step_drift=drift.tolist(),
                       max_step_drift=float(drift.max(initial=0.0)))
    episodes = episodes_from(arrays, measured)
    outcomes = [_outcome(cell, ref) for cell, ref in zip(episodes, reference.episodes)]
    returns = np.array([o.episode_return for o in outcomes])
    reference_returns = np.array([o.reference_return for o in outcomes])
    agreements = [o.action_agreement for o in outcomes if o.action_agreement is not None]
    interval = stats.paired_interval(returns, reference_returns)
    return Rollout(
        mode="closed-loop", env=plan.env, episodes=outcomes,
        mean_return=float(returns.mean()), std_return=float(returns.std()),
        reference_mean_return=float(reference_returns.mean()), reference_std_return=float(reference_returns.std()),
        return_delta=float(returns.mean() - reference_returns.mean()),
        return_delta_rel=relative_delta(float(returns.mean()), float(reference_returns.mean())),
        return_delta_low=_finite_or_none(interval.low), return_delta_high=_finite_or_none(interval.high),
        confidence=interval.confidence,
        length_delta=float(np.mean([o.length - o.reference_length for o in outcomes])),
        action_agreement=float(np.mean(agreements)) if agreements else None,
        divergence_epsilon=DIVERGENCE_EPSILON, clip_actions=plan.clip_actions,
        clipped_steps=sum(o.clipped_steps for o in outcomes), steps=measured["steps"], step_us=step_us,
    )


def _outcome(cell: Episode, reference: Episode):
    from ..results import EpisodeOutcome

    return EpisodeOutcome(
        seed=cell.seed, episode_return=cell.episode_return, length=cell.length,
        reference_return=reference.episode_return, reference_length=reference.length,
        divergence_step=divergence_step(cell.observations, reference.observations),
        action_agreement=action_agreement(cell.actions, reference.actions, cell.discrete),
        clipped_steps=cell.clipped_steps,
    )


def _finite_or_none(value: float) -> float | None:
    """One episode has no interval: None in the record rather than an infinity."""
    return value if math.isfinite(value) else None
