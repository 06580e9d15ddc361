"""The policy as its training framework runs it, inside the user's own training interpreter.

Run as a script by `--source-python` (default: the current interpreter): `PYTHON source_runner.py`.
It needs only numpy and the standard library on that side, plus the framework the source
names; policy-matrix itself is not installed there. It speaks the JSON-lines protocol of
targets/jsonl_process.py: one request per stdin line ({"op": ..., ...}), one answer per
stdout line ({"ok": true, "result": ...} or {"ok": false, "error": ...}); closing stdin ends it.

Ops:
- check {spec}: import the framework (and a user's module); {"missing": package} when one is not installed.
- load {spec}: load the policy (this executes the user's code and checkpoint, as training did); spec["inputs"]
  names the model's observation inputs. Its answer says what the policy takes where the framework says
  (`observation_space`: SB3's Dict keys or Box shape), for the core to tell an input it does not take.
- predict_file {observations, inputs, batch_axes, out}: every row of an .npz observation set at batch 1 (an input
  absent from batch_axes, such as a rank-0 flag, is fed whole to every call).
- predict {obs, dtypes}: one observation (a nested list per input) -> the action(s), for episodes driven by the core.
- time {observations, inputs, batch_axes, warmup, iters}: per-call latency of predict at batch 1 (ns).

An observation is one array per ONNX observation input, by name: a Dict observation's keys (SB3's
MultiInputPolicy), a single input being the one-key case. The source is called as its framework takes it:
SB3's `predict` with the dict when its observation space is a Dict, a torch module with one tensor per input
in the model's input order and dtype (as torch.onnx.export passed them; floats as float32), any other callable
with the one array, or the dict of arrays when there are several. An input without a batch axis (a rank-0
`deterministic` flag beside the observation) is not per row: it goes whole to every call.

The source's observation normaliser (`--source-normalize`: SB3 VecNormalize statistics or an
.npz with mean/var) is applied before each call, as VecNormalize does in deployment: per key for a Dict
observation (VecNormalize's norm_obs_keys), the keys without statistics as they are.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import zipfile
from collections.abc import Callable, Collection
from pathlib import Path

import numpy as np

FRAMEWORKS = {"sb3": "stable_baselines3", "torch": "torch", "torchscript": "torch"}
VERSIONED = ("stable_baselines3", "sb3_contrib", "torch", "jax", "tensorflow", "numpy")


class Source:
    """One loaded policy: `predict({input: obs [1, ...]}) -> list of arrays` plus what it says about itself."""

    def __init__(self, call, action_space: dict | None = None, observation_space: dict | None = None):
        self.call, self.action_space = call, action_space  # call: the observation's arrays by input -> answer(s)
        # What the policy takes, where its framework says: {"keys": [...]} (a Dict) or {"shape": [...]} (one array)
        self.observation_space = observation_space
        self.normalizer: dict | None = None
        # Why the framework could not have normalised an input with statistics ("" where it could): SB3's spaces tell
        self.refuses_statistics: Callable[[str], str] = lambda name: ""

    def predict(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self.normalizer is not None:
            feeds = normalized(feeds, self.normalizer)
        answer = self.call(feeds)
        return [np.asarray(a) for a in answer] if isinstance(answer, (tuple, list)) else [np.asarray(answer)]


def normalized(feeds: dict[str, np.ndarray], normalizer: dict) -> dict[str, np.ndarray]:
    """VecNormalize.normalize_obs: per input with statistics, (obs - mean) / sqrt(var + epsilon), clipped to
    +-clip_obs, as float32 whatever the input was (uint8 pixels too: VecNormalize makes a normalised key's space a
    float32 Box); the others as they are (the core imports this too, to evaluate the ONNX graph on the
    observations the source saw)."""
    shown = dict(feeds)
    for name, stats in normalizer["inputs"].items():
        scaled = (feeds[name] - np.asarray(stats["mean"])) / np.sqrt(np.asarray(stats["var"]) + normalizer["epsilon"])
        shown[name] = np.clip(scaled, -normalizer["clip_obs"], normalizer["clip_obs"]).astype(np.float32)
    return shown


def _one_or_dict(feeds: dict[str, np.ndarray]):
    """A one-input policy's array, or the Dict observation's arrays by key."""
    return next(iter(feeds.values())) if len(feeds) == 1 else feeds


def _user_path() -> None:
    """A user's module beside them is found as `python -m` would find it."""
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())


def framework_module(spec: dict) -> str:
    """The top-level package this source needs; for python:MODULE:FUNC, the user's module itself."""
    if spec["kind"] == "sb3":
        return sb3_algorithm(Path(spec["target"]))[0]
    if spec["kind"] == "python":
        return spec["target"].split(":")[0]
    return FRAMEWORKS[spec["kind"]]


def check(spec: dict) -> dict:
    """Whether this interpreter has what the source imports: {"missing": package} when not. A user's
    module is imported too, so a framework it needs (jax, tensorflow) is named before the run; any other
    error it raises is left to the source cell, which loads it again and reports it."""
    _user_path()
    module = framework_module(spec)
    top = module.split(".")[0]
    if importlib.util.find_spec(top) is None:
        return {"missing": top}
    try:
        importlib.import_module(module)
        if spec["kind"] in ("python", "torch"):
            importlib.import_module(spec["target"].split(":")[0])
    except ModuleNotFoundError as error:
        return {"missing": (error.name or top).split(".")[0]}
    except Exception:  # noqa: S110 - the cell loads the source again and reports this error as its reason
        pass
    return {"versions": _versions()}


def _versions() -> dict:
    found = {}
    for name in VERSIONED:
        try:
            found[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def sb3_algorithm(path: Path) -> tuple[str, str]:
    """(package, class) of the algorithm that saved the zip, read from its `data` JSON: the policy
    class's module names it (stable_baselines3.sac.policies -> SAC); PPO and A2C share
    common.policies, and PPO alone saves a clip_range."""
    with zipfile.ZipFile(path) as archive:
        data = json.loads(archive.read("data"))
    module = data["policy_class"]["__module__"]
    package, folder = module.split(".")[:2]
    if folder == "common":
        return package, "PPO" if "clip_range" in data else "A2C"
    return package, folder.upper()


def load(spec: dict) -> tuple[Source, dict]:
    _user_path()
    source = LOADERS[spec["kind"]](spec["target"])
    if spec.get("normalize"):
        source.normalizer = _normalizer(Path(spec["normalize"]), spec["inputs"])
        refused = [why for name in source.normalizer["inputs"] if (why := source.refuses_statistics(name))]
        if refused:
            raise ValueError(refused[0])
    facts = {"versions": _versions(), "action_space": source.action_space, "normalizer": _listed(source.normalizer),
             "observation_space": source.observation_space}
    return source, facts


def _listed(normalizer: dict | None) -> dict | None:
    if normalizer is None:
        return None
    inputs = {name: {k: np.asarray(v).tolist() for k, v in stats.items()} for name, stats in normalizer["inputs"].items()}
    return {**normalizer, "inputs": inputs}


def _load_sb3(target: str) -> Source:
    import gymnasium  # SB3 depends on it: where SB3 loads, so does this

    package, name = sb3_algorithm(Path(target))
    model = getattr(importlib.import_module(package), name).load(target, device="cpu")
    space = model.action_space
    bounds = {"low": np.asarray(space.low).tolist(), "high": np.asarray(space.high).tolist()} if hasattr(space, "low") else None
    observation = model.observation_space
    takes_dict = isinstance(observation, gymnasium.spaces.Dict)  # a MultiInputPolicy, even with one key
    takes = {"keys": list(observation.spaces)} if takes_dict else {"shape": list(observation.shape or ())}
    source = Source(lambda feeds: model.predict(feeds if takes_dict else _one_or_dict(feeds), deterministic=True)[0],
                    bounds, takes)
    source.refuses_statistics = lambda name: _vecnormalize_refuses(
        observation.spaces.get(name) if takes_dict else observation, name)
    return source


def _vecnormalize_refuses(space, name: str) -> str:
    """Why SB3's VecNormalize cannot have normalised what this policy takes as `name` ("" where it can): it refuses
    a space that is not a Box, and a key it normalises becomes a float32 Box in the policy's space, so a policy that
    still takes an image there (uint8 in [0, 255]) was trained on the pixels, not on statistics of them."""
    from gymnasium import spaces
    from stable_baselines3.common.preprocessing import is_image_space

    if space is None:  # an input the policy does not take: the column says so (source_job._not_taken)
        return ""
    if not isinstance(space, spaces.Box):
        return (f"--source-normalize holds statistics for {name!r}, which the policy takes as {space}: VecNormalize "
                "normalises Box observations only")
    if is_image_space(space):
        return (f"--source-normalize holds statistics for {name!r}, which the policy takes as image pixels ({space}): "
                "VecNormalize would have made it a float32 Box, so the policy was trained on the pixels (VecNormalize's "
                "norm_obs_keys without the image key keeps them as they are)")
    return ""


def _torch_call(module):
    import torch

    module.eval()

    def tensor(obs: np.ndarray):
        """A float input as float32 (the module's parameters); any other as the export took it: a bool
        `deterministic` flag for torch.where, an int64 index, uint8 pixels the module scales itself."""
        return torch.as_tensor(obs, dtype=torch.float32) if obs.dtype.kind == "f" else torch.as_tensor(obs)

    def call(feeds: dict[str, np.ndarray]):
        with torch.no_grad():
            answer = module(*(tensor(obs) for obs in feeds.values()))
        answers = answer if isinstance(answer, (tuple, list)) else [answer]
        return [a.detach().cpu().numpy() for a in answers]

    return call


def _load_torch(target: str) -> Source:
    import torch

    module_name, _, attribute = target.partition(":")
    found = getattr(importlib.import_module(module_name), attribute)
    module = found if isinstance(found, torch.nn.Module) else found()  # a class or factory is called with no arguments
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"{target} gave {type(module).__name__}, not a torch.nn.Module")
    return Source(_torch_call(module))


def _load_torchscript(target: str) -> Source:
    import torch

    return Source(_torch_call(torch.jit.load(target, map_location="cpu")))


def _load_python(target: str) -> Source:
    module_name, _, attribute = target.partition(":")
    function = getattr(importlib.import_module(module_name), attribute)
    if not callable(function):
        raise TypeError(f"{target} is {type(function).__name__}, not a callable")
    return Source(lambda feeds: function(_one_or_dict(feeds)))


LOADERS = {"sb3": _load_sb3, "torch": _load_torch, "torchscript": _load_torchscript, "python": _load_python}


def _normalizer(path: Path, inputs: list[str]) -> dict:
    """Observation statistics by input: an .npz with mean and var for the one input, or mean/KEY and var/KEY
    per key of a Dict observation (epsilon, clip_obs optional), or SB3's VecNormalize pickle, whose obs_rms is
    one for a Box and one per normalised key (norm_obs_keys) for a Dict (the user's own file, loaded in
    their interpreter like the checkpoint)."""
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            stats = {name: data[name] for name in data.files}
        per_input = {key: {"mean": stats[mean], "var": stats[var]} for key, (mean, var) in npz_statistics(stats).items()}
        return _by_input(per_input, inputs, float(stats.get("epsilon", 1e-8)), float(stats.get("clip_obs", np.inf)))
    import pickle

    with path.open("rb") as stream:
        vec_normalize = pickle.load(stream)
    rms = vec_normalize.obs_rms
    per_input = {key: {"mean": np.asarray(r.mean), "var": np.asarray(r.var)} for key, r in rms.items()} \
        if isinstance(rms, dict) else {None: {"mean": np.asarray(rms.mean), "var": np.asarray(rms.var)}}
    return _by_input(per_input, inputs, float(vec_normalize.epsilon), float(vec_normalize.clip_obs))


def npz_statistics(names: Collection[str]) -> dict[str | None, tuple[str, str]]:
    """The arrays of a --source-normalize .npz that hold each key's (mean, var): ("mean", "var") for one observation's
    (key None), ("mean/KEY", "var/KEY") per key of a Dict observation. The core checks a file's names by it before
    the run (matrix/reference/source.py), never loading the file; this interpreter reads the file by it."""
    if "mean" in names:
        found: dict[str | None, tuple[str, str]] = {None: ("mean", "var")}
    else:
        keys = [name.removeprefix("mean/") for name in names if name.startswith("mean/")]
        found = {key: (f"mean/{key}", f"var/{key}") for key in keys}
    if not found:
        raise ValueError("--source-normalize holds no mean and var (nor mean/KEY and var/KEY per key)")
    missing = [f"{var} beside {mean}" for mean, var in found.values() if var not in names]
    if missing:
        raise ValueError(f"--source-normalize holds no {missing[0]}")
    return found


def statistics_inputs(keys: Collection[str | None], inputs: list[str]) -> dict[str | None, str]:
    """The model's observation input each statistics key is for; one array's statistics (key None) are the one input's."""
    if None in keys:
        if len(inputs) != 1:
            raise ValueError(f"--source-normalize holds one observation's statistics; the model has the observation "
                             f"inputs {inputs} (a Dict observation's are per key)")
        return {None: inputs[0]}
    unknown = sorted(set(keys) - set(inputs))
    if unknown:
        raise ValueError(f"--source-normalize holds statistics for the keys {unknown}, which are not the model's "
                         f"observation inputs {inputs}")
    return {key: key for key in keys}


def _by_input(per_input: dict, inputs: list[str], epsilon: float, clip_obs: float) -> dict:
    """The statistics keyed by the model's observation inputs."""
    named = statistics_inputs(per_input, inputs)
    return {"inputs": {named[key]: stats for key, stats in per_input.items()}, "epsilon": epsilon, "clip_obs": clip_obs}


def _rows(request: dict) -> dict[str, np.ndarray]:
    """Each input's array by its member's exact name, as the core writes it (matrix/inputs/observations.save):
    np.load's `data["a.npy"]` is the member of an input named `a` when both are there."""
    with zipfile.ZipFile(request["observations"]) as archive:
        rows = {}
        for name in request["inputs"]:
            with archive.open(f"{name}.npy") as member:
                rows[name] = np.lib.format.read_array(member, allow_pickle=False)
        return rows


def _row(rows: dict[str, np.ndarray], batch_axes: dict[str, int], index: int) -> dict[str, np.ndarray]:
    """Observation `index` at batch 1: each batched input's slice along its batch axis; an input without one (a rank-0
    `deterministic` flag beside the observation) is not per row, and goes whole to every call, as the export took it."""
    return {name: np.take(values, [index], axis=batch_axes[name]) if name in batch_axes else values
            for name, values in rows.items()}


def predict_file(source: Source, request: dict) -> dict:
    """Each observation alone (batch 1, as `predict` is called in deployment); outputs stacked per position."""
    rows, axes = _rows(request), request["batch_axes"]
    count = next((values.shape[axes[name]] for name, values in rows.items() if name in axes), 1)
    answers = [source.predict(_row(rows, axes, i)) for i in range(count)]
    stacked = {f"answer/{i}": np.stack([np.asarray(a[i]).reshape(-1) for a in answers]) for i in range(len(answers[0]))}
    np.savez(request["out"], **stacked)
    return {"answers": len(answers[0]), "rows": len(answers)}


def time_predict(source: Source, request: dict) -> dict:
    # Run as a script, the targets' timing loop (standard library only) is imported from its
    # folder, as the Core ML helper does; here, not at the top, so the core may import `normalized`.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "targets"))
    from timing import time_calls

    first = _row(_rows(request), request["batch_axes"], 0)
    return {"samples_ns": time_calls(lambda: source.predict(first), request["warmup"], request["iters"])}


def serve() -> None:
    """Answers go to the real stdout; whatever the user's code prints (Python or C) goes to stderr."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    source = None
    for line in sys.stdin:
        request = json.loads(line)
        try:
            op = request["op"]
            if op == "check":
                result = check(request["spec"])
            elif op == "load":
                source, result = load(request["spec"])
            elif op == "predict":
                feeds = {name: np.asarray(values, dtype=request["dtypes"][name]) for name, values in request["obs"].items()}
                result = [a.tolist() for a in source.predict(feeds)]
            elif op == "predict_file":
                result = predict_file(source, request)
            else:
                result = time_predict(source, request)
            answer = {"ok": True, "result": result}
        except Exception as error:  # the user's code's own words go back to the core as the cell's reason
            text = " ".join(str(error).split())[:600]
            answer = {"ok": False, "error": f"{type(error).__name__}: {text}" if text else type(error).__name__}
        print(json.dumps(answer), file=protocol, flush=True)


if __name__ == "__main__":
    serve()
