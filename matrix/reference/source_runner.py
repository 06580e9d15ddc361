"""The policy as its training framework runs it, inside the user's own training interpreter.

Run as a script by `--source-python` (default: the current interpreter): `PYTHON source_runner.py`.
It needs only numpy and the standard library on that side, plus the framework the source
names; policy-matrix itself is not installed there. It speaks the JSON-lines protocol of
targets/jsonl_process.py: one request per stdin line ({"op": ..., ...}), one answer per
stdout line ({"ok": true, "result": ...} or {"ok": false, "error": ...}); closing stdin ends it.

Ops:
- check {spec}: import the framework (and a user's module); {"missing": package} when one is not installed.
- load {spec}: load the policy (this executes the user's code and checkpoint, as training did).
- predict_file {observations, input, out}: every row of an .npz observation set at batch 1.
- predict {obs}: one observation (a nested list) -> the action(s), for episodes driven by the core.
- time {observations, input, warmup, iters}: per-call latency of predict at batch 1 (ns).

The source's observation normaliser (`--source-normalize`: SB3 VecNormalize statistics or an
.npz with mean/var) is applied before each call, as VecNormalize does in deployment.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import zipfile
from pathlib import Path

import numpy as np

FRAMEWORKS = {"sb3": "stable_baselines3", "torch": "torch", "torchscript": "torch"}
VERSIONED = ("stable_baselines3", "sb3_contrib", "torch", "jax", "tensorflow", "numpy")


class Source:
    """One loaded policy: `predict(obs [1, ...]) -> list of arrays` plus what it says about itself."""

    def __init__(self, call, action_space: dict | None = None):
        self.call, self.action_space = call, action_space
        self.normalizer: dict | None = None

    def predict(self, obs: np.ndarray) -> list[np.ndarray]:
        if self.normalizer is not None:
            obs = normalized(obs, self.normalizer)
        answer = self.call(obs)
        return [np.asarray(a) for a in answer] if isinstance(answer, (tuple, list)) else [np.asarray(answer)]


def normalized(obs: np.ndarray, stats: dict) -> np.ndarray:
    """VecNormalize.normalize_obs: (obs - mean) / sqrt(var + epsilon), clipped to +-clip_obs (the core
    imports this too, to evaluate the ONNX graph on the observations the source saw)."""
    scaled = (obs - np.asarray(stats["mean"])) / np.sqrt(np.asarray(stats["var"]) + stats["epsilon"])
    return np.clip(scaled, -stats["clip_obs"], stats["clip_obs"]).astype(obs.dtype)


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
        source.normalizer = _normalizer(Path(spec["normalize"]))
    facts = {"versions": _versions(), "action_space": source.action_space,
             "normalizer": {k: np.asarray(v).tolist() for k, v in source.normalizer.items()} if source.normalizer else None}
    return source, facts


def _load_sb3(target: str) -> Source:
    package, name = sb3_algorithm(Path(target))
    model = getattr(importlib.import_module(package), name).load(target, device="cpu")
    space = model.action_space
    bounds = {"low": np.asarray(space.low).tolist(), "high": np.asarray(space.high).tolist()} if hasattr(space, "low") else None
    return Source(lambda obs: model.predict(obs, deterministic=True)[0], bounds)


def _torch_call(module):
    import torch

    module.eval()

    def call(obs: np.ndarray):
        with torch.no_grad():
            answer = module(torch.as_tensor(obs, dtype=torch.float32))
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
    return Source(function)


LOADERS = {"sb3": _load_sb3, "torch": _load_torch, "torchscript": _load_torchscript, "python": _load_python}


def _normalizer(path: Path) -> dict:
    """Observation statistics: an .npz with mean and var (epsilon, clip_obs optional), or SB3's
    VecNormalize pickle (the user's own file, loaded in their interpreter like the checkpoint)."""
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            stats = {name: data[name] for name in data.files}
        return {"mean": stats["mean"], "var": stats["var"], "epsilon": float(stats.get("epsilon", 1e-8)),
                "clip_obs": float(stats.get("clip_obs", np.inf))}
    import pickle

    with path.open("rb") as stream:
        vec_normalize = pickle.load(stream)
    rms = vec_normalize.obs_rms
    return {"mean": np.asarray(rms.mean), "var": np.asarray(rms.var), "epsilon": float(vec_normalize.epsilon),
            "clip_obs": float(vec_normalize.clip_obs)}


def _rows(request: dict) -> np.ndarray:
    """The input's array by its member's exact name, as the core writes it (matrix/inputs/observations.save):
    np.load's `data["a.npy"]` is the member of an input named `a` when both are there."""
    with zipfile.ZipFile(request["observations"]) as archive, archive.open(f"{request['input']}.npy") as member:
        return np.lib.format.read_array(member, allow_pickle=False)


def predict_file(source: Source, request: dict) -> dict:
    """Each observation alone (batch 1, as `predict` is called in deployment); outputs stacked per position."""
    answers = [source.predict(row[None]) for row in _rows(request)]
    stacked = {f"answer/{i}": np.stack([np.asarray(a[i]).reshape(-1) for a in answers]) for i in range(len(answers[0]))}
    np.savez(request["out"], **stacked)
    return {"answers": len(answers[0]), "rows": len(answers)}


def time_predict(source: Source, request: dict) -> dict:
    # Run as a script, the targets' timing loop (standard library only) is imported from its
    # folder, as the Core ML helper does; here, not at the top, so the core may import `normalized`.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "targets"))
    from timing import time_calls

    row = _rows(request)[:1]
    return {"samples_ns": time_calls(lambda: source.predict(row), request["warmup"], request["iters"])}


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
                result = [a.tolist() for a in source.predict(np.asarray(request["obs"], dtype=request["dtype"]))]
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
