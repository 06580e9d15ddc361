"""Behaviour in the loop: episodes driven by one runtime, compared with the float64 reference's.

Single-step drift is not what an RL user ships on: a policy that drifts 0.15 per
step can score the same return, one that drifts 0.04 can flip the actions that
matter. Here a `step(feeds) -> outputs` callable (a cell's own session at batch 1,
or the float64 reference) drives a Gymnasium environment; episode i resets with
seed + i (Stable-Baselines3's evaluation convention), so every cell and host
sees the same initial states. A recurrent policy (an input/output state pair)
carries its state from step to step, starting from zeros or the values given
(`--initial-state`).

The observation inputs are every input but the state inputs and the side inputs:
one for a Box or Discrete observation, one per key for a Dict observation (SB3's
MultiInputPolicy, goal-conditioned HER policies, image + proprioception), each key
feeding the input of the same name. A single input is the one-key case throughout:
what is recorded per step (and sampled, replayed, compared) is one array per input.
A side input (fed whole, no batch axis: a rank-0 `deterministic`, `rng [1]`) is no
part of the observation: it is fed the value the user gave (`--side-input`, see
matrix/inputs/side_inputs.py) on every step, the same for the reference and every cell.

Without an environment, a recorded observation sequence is replayed open loop
(`--trajectory`) and the drift of each step's action is reported along it.

The environment runs beside the session (in the cell's worker); the comparison
with the reference runs in the core. Gymnasium is imported only here, only when
a rollout is asked for (the `rl` extra).
"""

from __future__ import annotations

import contextlib
import importlib
import json
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
from ..inputs.contract import action_output, action_outputs
from ..inputs.model import ModelInfo, TensorSpec
from ..inputs.observations import Feeds, check_held, check_side, first_non_finite, holds_only
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
class ObservationInput:
    input: str  # the ONNX input; with a Dict observation space, also the key that feeds it
    shape: list[int]  # without the batch dimension
    dtype: str


@dataclass
class SideInput:
    input: str  # an input fed whole (no batch axis), beside the observation
    shape: list[int]  # as fed, whole
    dtype: str
    value: object  # the --side-input value as nested lists (a bare number for rank 0): plain data, it crosses processes

    @property
    def array(self) -> np.ndarray:
        return np.asarray(self.value, dtype=self.dtype).reshape(self.shape)


@dataclass
class RolloutPlan:
    """What a worker needs to drive episodes; travels in the cell's spec.json."""

    observations: list[ObservationInput]  # the inputs the environment's observation feeds, in the model's order
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
    side_inputs: list[SideInput] = field(default_factory=list)  # fed the same value on every step

    @classmethod
    def from_dict(cls, data: dict) -> "RolloutPlan":
        return cls(**{**data, "observations": [ObservationInput(**o) for o in data["observations"]],
                      "states": [StatePair(**s) for s in data.get("states", [])],
                      "side_inputs": [SideInput(**s) for s in data.get("side_inputs", [])]})

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def open_loop(self) -> bool:
        return bool(self.trajectory)

    @property
    def observation_names(self) -> list[str]:
        return [o.input for o in self.observations]

    @property
    def side_feeds(self) -> Feeds:
        """The side inputs as fed on every step (made once per episode or replay: the loop's cost is every step's)."""
        return {s.input: s.array for s in self.side_inputs}

    def describe(self) -> dict:
        """The run's options entry: what a reader needs to reproduce the episodes."""
        states = {"states": [s.input for s in self.states], "initial_state": self.initial_state or "zeros"} if self.states else {}
        if self.side_inputs:
            states["side_inputs"] = {s.input: s.value for s in self.side_inputs}
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


def plan_for(model: ModelInfo, side_values: Feeds | None = None, **settings) -> RolloutPlan:
    """The rollout plan for this model (every input but the recurrent state inputs and the side inputs is fed by the
    observation; each side input its value in `side_values`, from --side-input); InputError when it cannot take one
    observation at a time, or a side input has no value."""
    states = state_pairs(model)
    state_inputs = {s.input for s in states}
    sides = side_inputs(model, state_inputs, side_values or {})
    fed = state_inputs | {s.input for s in sides}
    observed = [ObservationInput(spec.name, _fixed_dims(spec, model), spec.dtype)
                for spec in model.inputs if spec.name not in fed]
    if not observed:
        raise InputError("rollouts need an observation input besides recurrent state inputs and side inputs")
    for spec in model.inputs:
        batch = batch_dim(spec, model.batch_axes)
        if isinstance(batch, int) and batch != 1:
            raise InputError(f"rollouts run at batch 1, but input {spec.name!r} has a fixed batch of {batch}")
    if not action_outputs(model):
        raise InputError("rollouts need an action output besides recurrent state outputs")
    return RolloutPlan(observations=observed, action_output=action_output(model), states=states, side_inputs=sides,
                       **settings)


class SideValueMissing(InputError):
    """A side input the loop feeds has no value (--side-input gives it)."""


def stand_in_values(model: ModelInfo) -> Feeds:
    """Zeros for every input fed whole: a plan to check an environment's spaces with before a side input's value is
    asked for (no step runs with them)."""
    return {spec.name: np.zeros(_whole_shape(spec), spec.dtype)
            for spec in model.inputs if spec.name not in model.batch_axes}


def side_inputs(model: ModelInfo, state_inputs: set[str], values: Feeds) -> list[SideInput]:
    """The inputs fed whole beside the observation, each with its given value: the loop cannot guess a flag's or a
    seed's value, so one without is refused, naming the option that gives it."""
    whole = [spec for spec in model.inputs if spec.name not in model.batch_axes and spec.name not in state_inputs]
    missing = [spec for spec in whole if spec.name not in values]
    if missing:
        spec = missing[0]
        raise SideValueMissing(f"rollouts feed the input {spec.name!r} ({spec.dtype} {spec.shape}, no batch axis: a side input "
                         f"beside the observation) one value on every step, which the tool cannot guess: give it with "
                         f"--side-input {spec.name}=VALUE (e.g. {spec.name}={_example(spec)})")
    return [SideInput(spec.name, list(values[spec.name].shape), spec.dtype, values[spec.name].tolist()) for spec in whole]


def recorded_side_values(path: Path | None, model: ModelInfo, given: Feeds, limit_bytes: int | None) -> Feeds:
    """The side inputs a trajectory .npz records and --side-input leaves out, each as its input takes it: the value
    is what the file holds, once or on every step (as --obs's value is the file's); one that changes along the steps
    is refused, since the loop feeds one value on every step."""
    from ..inputs import side_inputs as side_values

    states = {pair.input for pair in model.state_pairs}
    wanted = [spec for spec in model.inputs
              if spec.name not in model.batch_axes and spec.name not in states and spec.name not in given]
    if path is None or not wanted:
        return {}
    recorded = userfiles.read_arrays(path, "trajectory", limit_bytes, wanted=[spec.name for spec in wanted])
    if isinstance(recorded, np.ndarray):  # an .npy holds the observation alone
        return {}
    found = {}
    for spec in wanted:
        if spec.name in recorded:
            found[spec.name] = _recorded_value(path, spec, recorded[spec.name]).tolist()
    return side_values.conform(found, model, given_by=f"{path}:")  # the user gave these in the file, not the option


def _recorded_value(path: Path, spec: TensorSpec, recorded: np.ndarray) -> np.ndarray:
    """The one value a side input holds along a recording: the first step's, where every step holds it."""
    whole = _whole_shape(spec)
    size = int(np.prod(whole, dtype=np.int64))
    if recorded.size == 0 or recorded.size % size:
        raise InputError(f"{path}: {spec.name!r} of shape {list(recorded.shape)} is no value of input {spec.name!r} "
                         f"({spec.dtype} {spec.shape}), once or per step")
    first = recorded.reshape(-1, size)[0].reshape(whole)
    if not holds_only(recorded, first):
        shown = json.dumps(np.unique(recorded)[:4].tolist())[:80]
        raise InputError(f"{path}: {spec.name!r} changes along the trajectory ({shown}), but the loop feeds a side input "
                         f"one value on every step: give it with --side-input {spec.name}=VALUE")
    return first


def _whole_shape(spec: TensorSpec) -> list[int]:
    """A side input's shape as fed whole, an open dimension taken as 1."""
    return [d if isinstance(d, int) else 1 for d in spec.shape]


def _example(spec: TensorSpec) -> str:
    shape = _whole_shape(spec)
    if int(np.prod(shape)) == 1:  # one number: --side-input takes it for any one-element input
        return "true" if np.dtype(spec.dtype).kind == "b" else "0"
    return str(np.zeros(shape, int).tolist()).replace(" ", "")


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
        if not trajectory_length(load_trajectory(Path(plan.trajectory), plan, limit_bytes)):
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
    from gymnasium import spaces

    parts = observation_spaces(env.observation_space, plan)
    keyed = isinstance(env.observation_space, spaces.Dict)
    for observed in plan.observations:
        space = parts[observed.input]
        if space.shape is None:  # a Tuple, a Graph, Text: no one array to feed
            raise InputError(f"--env {plan.env!r}: observation space {space} is not supported (Box, Discrete, or a Dict of them)")
        if int(np.prod(space.shape or (1,))) != int(np.prod(observed.shape)):
            what = f"its Dict entry {observed.input!r} has shape" if keyed else "observations have shape"
            raise InputError(f"--env {plan.env!r}: {what} {space.shape}, the model's {observed.input!r} expects {observed.shape}")
    if _action_kind(env.action_space) == "continuous":
        plan.action_low = env.action_space.low.astype(np.float64).ravel().tolist()
        plan.action_high = env.action_space.high.astype(np.float64).ravel().tolist()


def observation_spaces(space, plan: RolloutPlan) -> dict:
    """The part of the environment's observation space that feeds each observation input: a Dict's entry whose key
    is the input's name, else the whole space for the one input; InputError naming both sides where they differ."""
    from gymnasium import spaces

    names = plan.observation_names
    if isinstance(space, spaces.Dict):
        keys = list(space.spaces)
        nested = [key for key, part in space.spaces.items() if part.shape is None]
        if nested:  # a Dict or Tuple inside the Dict: no one array per key to feed
            raise InputError(f"--env {plan.env!r}: its Dict observation's entry {nested[0]!r} is {space[nested[0]]}: nested "
                             "Dict/Tuple observations are not supported (flatten them into one Box per key, as the export does)")
        if set(keys) != set(names):
            _refuse_side_input_keys(plan, keys)
            unmatched = [f"no key for input {name!r}" for name in names if name not in keys]
            unmatched += [f"no input for key {key!r}" for key in keys if key not in names][:5]
            raise InputError(f"--env {plan.env!r}: its Dict observation has keys {keys[:20]}, the model's observation inputs "
                             f"are {names}: {', '.join(unmatched)} (each key feeds the input of the same name)")
        return {name: space[name] for name in names}
    if len(names) != 1:
        raise InputError(f"--env {plan.env!r}: its observation space {space} is one value, but the model has "
                         f"{len(names)} observation inputs {names}: a Dict observation space feeds one input per key")
    return {names[0]: space}


def _refuse_side_input_keys(plan: RolloutPlan, keys: list[str]) -> None:
    """A Dict key named like an input without a batch axis: the key cannot feed it, and a --side-input value, fed
    whole on every step, does not make the key feed it either; both said at once, whether a value was given or not."""
    for side in plan.side_inputs:
        if side.input in keys:
            axis = f", or say its axis with --batch-axis {side.input}=AXIS" if side.shape else ""
            raise InputError(
                f"--env {plan.env!r}: its Dict observation's key {side.input!r} names the model's input {side.input!r}, "
                f"which has no batch axis ({side.dtype} {side.shape}, fed whole beside the observation): a key feeds an "
                f"observation input, one with a batch axis (export {side.input!r} as [batch, ...]{axis}), while "
                f"--side-input {side.input}=VALUE feeds one value on every step and leaves the key unfed; the Dict's "
                "keys and the model's observation inputs must be the same")


def _action_kind(space) -> str:
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return "discrete"
    if isinstance(space, spaces.MultiDiscrete):
        return "multi-discrete"
    if isinstance(space, spaces.Box):
        return "continuous"
    raise InputError(f"action space {space} is not supported (Box, Discrete, MultiDiscrete)")


def by_input(observation, names: list[str]) -> dict:
    """The environment's observation per observation input: a Dict's entries by name, else the whole for the one input."""
    if isinstance(observation, dict):  # what a Dict space gives (a dict, not any Mapping: this runs every step)
        return {name: observation[name] for name in names}
    return {names[0]: observation}


def feed_layout(plan: RolloutPlan) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """Per observation input: its name, dtype and shape at batch 1, made once per episode for to_feeds."""
    return [(o.input, np.dtype(o.dtype), (1, *o.shape)) for o in plan.observations]


def to_feeds(given: dict, layout: list[tuple[str, np.dtype, tuple[int, ...]]]) -> Feeds:
    """Each input's part (by_input): Box -> the model's dtype and declared shape at batch 1; Discrete -> its integer."""
    return {name: np.asarray(given[name]).astype(dtype).reshape(shape) for name, dtype, shape in layout}


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
    observations: dict[str, np.ndarray]  # per observation input, [T, ...]: what the policy acted on (as the env gave it)
    actions: np.ndarray  # [T, ...] the actions the env received
    rewards: np.ndarray  # [T]
    clipped_steps: int = 0
    discrete: bool = False
    states: dict[str, np.ndarray] = field(default_factory=dict)  # per state input, [T, *fed shape]: what each step was fed

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
    state, side = initial_state(plan), plan.side_feeds
    names, layout = plan.observation_names, feed_layout(plan)  # once: the loop's own cost is part of every step
    seen, actions, rewards, clipped_steps = {name: [] for name in names}, [], [], 0
    carried = {s.input: [] for s in plan.states}
    kind = _action_kind(env.action_space)
    done = False
    while not done:
        given = by_input(observation, names)
        _carry(carried, state)
        outputs = step({**to_feeds(given, layout), **side, **state})
        state = {s.input: outputs[s.output] for s in plan.states}
        action, clipped = to_env_action(outputs[plan.action_output], env.action_space, plan.clip_actions, kind)
        for name, value in given.items():
            seen[name].append(np.array(value))  # a copy: an env may hand out one array it changes in place
        actions.append(np.asarray(action, dtype=np.float64))
        observation, reward, terminated, truncated, _ = env.step(action)
        rewards.append(float(reward))
        clipped_steps += clipped
        done = terminated or truncated
    observed = {name: np.stack(values) for name, values in seen.items()}
    return Episode(seed, observed, np.stack(actions), np.asarray(rewards), clipped_steps, kind != "continuous",
                   _stacked(carried))


def _carry(carried: dict[str, list], state: Feeds) -> None:
    """The state fed at this step, kept: the observation set's rows pair each visited observation with it."""
    for name, value in state.items():
        carried[name].append(value)


def _stacked(carried: dict[str, list]) -> dict[str, np.ndarray]:
    return {name: np.stack(values) for name, values in carried.items() if values}


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


def load_trajectory(path: Path, plan: RolloutPlan, limit_bytes: int | None = None) -> Feeds:
    """Recorded observations per observation input, [T, *shape] (or [T, 1, *shape]) in the model's dtype: an .npy
    for the one input, or an .npz with one array per observation input, by name (a Dict observation's keys). A side
    input beside them (np.savez(**feeds) keeps every input) must hold the value the loop feeds, as --obs's must."""
    recorded = userfiles.read_arrays(path, "trajectory", limit_bytes)  # headers checked before any data is read
    names = plan.observation_names
    if isinstance(recorded, np.ndarray):
        if len(names) != 1:
            raise InputError(f"{path}: one array, but the model has the observation inputs {names}: save one array "
                             "per input by name, np.savez('trajectory.npz', **{input: [T, ...]})")
        recorded = {names[0]: recorded}
    check_side(recorded, plan.side_feeds, path)
    recorded = {name: array for name, array in recorded.items() if name not in plan.side_feeds}
    if set(recorded) != set(names):
        sides = f" beside the side inputs {list(plan.side_feeds)}" if plan.side_feeds else ""
        raise InputError(f"{path}: holds the arrays {sorted(name[:100] for name in recorded)[:20]}, the model's observation "
                         f"inputs are {names}{sides}: one array per input, by name")
    steps = {o.input: _recorded_steps(path, recorded[o.input], o, len(names) > 1) for o in plan.observations}
    if len({len(values) for values in steps.values()}) > 1:
        raise InputError(f"{path}: the inputs hold different numbers of steps "
                         f"({', '.join(f'{name} {len(values)}' for name, values in steps.items())})")
    return steps


def _recorded_steps(path: Path, recorded: np.ndarray, observed: ObservationInput, named: bool) -> np.ndarray:
    """One input's recorded observations in its dtype and shape; InputError where it cannot take them."""
    where = f"{path} ({observed.input!r})" if named else str(path)
    if recorded.ndim < 1:
        raise InputError(f"{where}: expected one array of observations [T, *obs_shape]")
    per_step = int(np.prod(recorded.shape[1:], dtype=np.int64))
    if per_step != int(np.prod(observed.shape)):
        raise InputError(f"{where}: observations of shape {list(recorded.shape[1:])}, the model expects {observed.shape}")
    shaped = recorded.reshape([len(recorded), *observed.shape])
    with np.errstate(over="ignore", invalid="ignore"):  # a value beyond the input's dtype: refused below
        steps = shaped.astype(observed.dtype)
    for values in (recorded, steps):  # as --obs: no state, and every cell would FAIL on it
        if (bad := first_non_finite(values)) is not None:
            raise InputError(f"{where}: holds a non-finite value at step {bad[0]} (as {values.dtype}): "
                             "observations must be finite")
    check_held(shaped, steps, observed.input, 0, path)
    return steps


def trajectory_length(recorded: Feeds) -> int:
    return len(next(iter(recorded.values())))


def replay(step: Step, plan: RolloutPlan) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Open loop: each recorded observation in order, state carried; the action of each step and, per state
    input, the state each step was fed ([T, *fed shape])."""
    state, side = initial_state(plan), plan.side_feeds
    actions, carried = [], {s.input: [] for s in plan.states}
    recorded = load_trajectory(Path(plan.trajectory), plan)
    for t in range(trajectory_length(recorded)):
        _carry(carried, state)
        outputs = step({**{name: values[t : t + 1] for name, values in recorded.items()}, **side, **state})
        state = {s.input: outputs[s.output] for s in plan.states}
        actions.append(np.asarray(outputs[plan.action_output], dtype=np.float64)[0])
    return np.stack(actions), _stacked(carried)


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
        return drive(reference_step(model), plan, lambda progress: None, with_states=True)
    except (ValueError, TypeError, AssertionError) as error:  # the env refused the policy's own actions
        what = "the trajectory" if plan.open_loop else f"--env {plan.env!r}"
        raise InputError(f"the float64 reference policy cannot drive {what}: {' '.join(str(error).split())[:300]}") from None


def reference_from(measured: dict, arrays: dict[str, np.ndarray]) -> ReferenceRollout:
    if "rollout/replay_actions" in arrays:
        return ReferenceRollout(actions=arrays["rollout/replay_actions"])
    return ReferenceRollout(episodes=episodes_from(arrays, measured))


def visited_runs(measured: dict, arrays: dict[str, np.ndarray], plan: RolloutPlan) -> list[Feeds]:
    """What the reference visited, per episode (one run for a replayed trajectory): each observation input's and
    each state input's value at every step, from the arrays `drive(..., with_states=True)` gave."""
    if plan.open_loop:
        return [{**load_trajectory(Path(plan.trajectory), plan), **_prefixed(arrays, "rollout/replay_states/")}]
    return [{**e.observations, **e.states} for e in episodes_from(arrays, measured)]


# --- worker <-> core: episodes as plain arrays ---------------------------------------------------

def episode_arrays(episodes: list[Episode], with_states: bool = False) -> dict[str, np.ndarray]:
    arrays = {}
    for i, episode in enumerate(episodes):
        arrays.update({f"rollout/{i}/observations/{name}": values for name, values in episode.observations.items()})
        if with_states:
            arrays.update({f"rollout/{i}/states/{name}": values for name, values in episode.states.items()})
        arrays[f"rollout/{i}/actions"] = episode.actions
        arrays[f"rollout/{i}/rewards"] = episode.rewards
    return arrays


def episodes_from(arrays: dict[str, np.ndarray], measured: dict) -> list[Episode]:
    return [
        Episode(seed, _prefixed(arrays, f"rollout/{i}/observations/"), arrays[f"rollout/{i}/actions"],
                arrays[f"rollout/{i}/rewards"], measured["clipped_steps"][i], measured["discrete"],
                _prefixed(arrays, f"rollout/{i}/states/"))
        for i, seed in enumerate(measured["seeds"])
    ]


def _prefixed(arrays: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {name.removeprefix(prefix): values for name, values in arrays.items() if name.startswith(prefix)}


def drive(step: Step, plan: RolloutPlan, on_progress: Callable[[str], None],
          with_states: bool = False) -> tuple[dict, dict[str, np.ndarray]]:
    """The worker's half: run the episodes (or the replay) with this step function; `with_states` (the reference's
    drive) adds the recurrent state fed at every step, which the visited observation set pairs with each observation."""
    started = time.perf_counter()
    if plan.open_loop:
        actions, states = replay(step, plan)
        carried = {f"rollout/replay_states/{name}": values for name, values in states.items()} if with_states else {}
        return ({"steps": len(actions), "seconds": time.perf_counter() - started},
                {"rollout/replay_actions": actions, **carried})
    episodes = run_episodes(step, plan, lambda done: on_progress(f"{done}/{plan.episodes} episodes"))
    measured = {
        "seeds": [e.seed for e in episodes], "clipped_steps": [e.clipped_steps for e in episodes],
        "discrete": episodes[0].discrete,
        "steps": sum(e.length for e in episodes), "seconds": time.perf_counter() - started,
    }
    return measured, episode_arrays(episodes, with_states)


# --- comparison with the reference ---------------------------------------------------------------

def divergence_step(observations: dict[str, np.ndarray], reference: dict[str, np.ndarray],
                    epsilon: float = DIVERGENCE_EPSILON) -> int | None:
    """First step whose observation (any element of any input) is farther than epsilon from the reference's; where
    no observation differs but one episode ended earlier, the step where it ended; None if never."""
    length, reference_length = trajectory_length(observations), trajectory_length(reference)
    common = min(length, reference_length)
    distance = np.zeros(common)
    for name, values in observations.items():  # as float64: pixels are unsigned, their difference is not
        apart = np.abs(values[:common].astype(np.float64) - reference[name][:common]).reshape(common, -1)
        distance = np.maximum(distance, apart.max(axis=1, initial=0.0))
    beyond = np.flatnonzero(distance > epsilon)
    if beyond.size:
        return int(beyond[0])
    return None if length == reference_length else common


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
