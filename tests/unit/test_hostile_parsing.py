"""Hostile input through the real parsing layer, in process: `policy-matrix ...` as `cli.main()` runs it,
without a subprocess per case (the `policy_matrix` fixture of tests/conftest.py). Each case must end in exit
code 2 and one line on stderr naming the problem, before any cell runs. (tests/test_hostile_input.py holds the
table of malformed models, observations, options and configs, and the cases that need the real process: its exit
code, and the runner's peak memory.)

Each maker gets an empty folder and returns (argv, expected words of the one line).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import CliRun
from onnx import TensorProto, helper, numpy_helper
from saved import FIXTURES

from matrix.inputs.examples import path as example

MLP = str(example("continuous_mlp"))  # obs [batch, 17] float32
DISCRETE = str(example("discrete_mlp"))
OPSET = [helper.make_opsetid("", 18)]
SHARD = FIXTURES / "shard_continuous_mlp.json"
# Cheapest run settings: a case the parser wrongly accepts costs seconds, not minutes, before it fails.
QUICK = ["--targets", "ort-cpu", "--variants", "fp32", "--iters", "1", "--warmup", "0", "--batch-sizes", "1", "--n-obs", "4"]


def assert_one_line(done: CliRun, expected: str) -> None:
    assert done.returncode == 2, done.lines[-5:]
    assert len(done.lines) == 1 and expected in done.lines[0], done.lines[-5:]
    assert len(done.lines[0]) < 1000, "one readable line, not a dump"


# --- models ---------------------------------------------------------------------------------------------


def _io(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _save(folder: Path, model: onnx.ModelProto, name="m.onnx") -> Path:
    folder.mkdir(exist_ok=True)
    onnx.save(model, str(folder / name))
    return folder / name


def _external(location: str, name="w", count=4, offset="0", length=None) -> onnx.TensorProto:
    tensor = numpy_helper.from_array(np.ones(count, np.float32), name)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", offset), ("length", str(4 * count) if length is None else length)):
        tensor.external_data.add(key=key, value=value)
    return tensor


def _mul_by(weight: onnx.TensorProto) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Mul", ["obs", weight.name], ["action"])], "g",
                              [_io("obs", ["b", 4])], [_io("action", ["b", 4])], [weight])
    return helper.make_model(graph, opset_imports=OPSET)


def _weights(folder: Path, name="w.bin", nbytes=16) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(b"\0" * nbytes)


def external_case(location, **fields):
    def make(tmp):
        _weights(tmp / "m")
        return [_save(tmp / "m", _mul_by(_external(location, **fields))), *QUICK]
    return make


def external_symlink_inside(tmp):
    _weights(tmp / "m", "real.bin")
    os.symlink("real.bin", tmp / "m" / "w.bin")
    return [_save(tmp / "m", _mul_by(_external("w.bin"))), *QUICK]


def external_is(kind):
    def make(tmp):
        (tmp / "m").mkdir()
        if kind == "folder":
            (tmp / "m" / "w.bin").mkdir()
        elif kind == "fifo":
            os.mkfifo(tmp / "m" / "w.bin")
        return [_save(tmp / "m", _mul_by(_external("w.bin"))), *QUICK]
    return make


def external_in_function_if(tmp):
    """A local function whose If branch holds the external tensor: every subgraph of every function is checked."""
    _weights(tmp, "secret.bin")
    then = helper.make_graph([helper.make_node("Identity", ["wt"], ["o"])], "then", [], [_io("o", [4])],
                             [_external("../secret.bin", "wt")])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "else", [], [_io("o", [4])])
    function = helper.make_function("local", "F", ["x", "c"], ["y"],
                                    [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], OPSET)
    init = [numpy_helper.from_array(np.array(True), "cond"), numpy_helper.from_array(np.zeros(4, np.float32), "z")]
    graph = helper.make_graph([helper.make_node("F", ["z", "cond"], ["wv"], domain="local"),
                               helper.make_node("Mul", ["obs", "wv"], ["action"])], "g",
                              [_io("obs", ["b", 4])], [_io("action", ["b", 4])], init)
    model = helper.make_model(graph, opset_imports=[*OPSET, helper.make_opsetid("local", 1)], functions=[function])
    return [_save(tmp / "m", model), *QUICK]


def external_above_the_limit(tmp):
    """1 GiB of declared external data (a sparse file) under --memory-limit 512M: refused by its summed size."""
    (tmp / "m").mkdir()
    with open(tmp / "m" / "w.bin", "wb") as stream:
        stream.truncate(1 << 30)
    return [_save(tmp / "m", _mul_by(_external("w.bin", length=str(1 << 30)))), *QUICK, "--memory-limit", "512M"]


def function_with_long_node_name(tmp):
    function = helper.make_function("local", "F", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"], name="n" * 5000)], OPSET)
    graph = helper.make_graph([helper.make_node("F", ["obs"], ["action"], domain="local")], "g",
                              [_io("obs", ["b", 4])], [_io("action", ["b", 4])])
    model = helper.make_model(graph, opset_imports=[*OPSET, helper.make_opsetid("local", 1)], functions=[function])
    return [_save(tmp / "m", model), *QUICK]


def huge_op_type(tmp):
    node = helper.make_node("X" * 1_000_000, ["obs"], ["action"], domain="custom")
    graph = helper.make_graph([node], "g", [_io("obs", ["b", 4])], [_io("action", ["b", 4])])
    model = helper.make_model(graph, opset_imports=[*OPSET, helper.make_opsetid("custom", 1)])
    return [_save(tmp / "m", model), *QUICK]


def side_input(shape, *extra):
    def make(tmp):
        nodes = [helper.make_node("Identity", ["obs"], ["action"]), helper.make_node("ReduceSum", ["side"], ["s"], keepdims=0)]
        graph = helper.make_graph(nodes, "g", [_io("obs", ["b", 4]), _io("side", shape)], [_io("action", ["b", 4]), _io("s", [])])
        return [_save(tmp / "m", helper.make_model(graph, opset_imports=OPSET)), *QUICK, *extra]
    return make


def model_file(kind):
    def make(tmp):
        path = tmp / "m.onnx"
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "device":
            os.symlink("/dev/zero", path)
        elif kind == "folder":
            path.mkdir()
        elif kind == "empty":
            path.write_bytes(b"")
        elif kind == "random":
            path.write_bytes(np.random.default_rng(0).bytes(4096))
        elif kind == "above 2 GB":
            with open(path, "wb") as stream:
                stream.truncate(3 << 30)
        return [path, *QUICK]
    return make


MODELS = {
    "external data: NUL in its location": (external_case("w.bin\0../../etc/passwd"), "not a file name"),
    "external data: empty location": (external_case(""), "not a file name"),
    "external data: symlink inside the folder": (external_symlink_inside, "symbolic link"),
    "external data: a folder": (external_is("folder"), "not a regular file"),
    "external data: a FIFO": (external_is("fifo"), "not a regular file"),
    "external data: missing": (external_is("missing"), "missing"),
    "external data: offset past the end": (external_case("w.bin", offset="64"), "holds 16 bytes"),
    "external data: length past the end": (external_case("w.bin", length="4096"), "holds 16 bytes"),
    "external data: negative offset": (external_case("w.bin", offset="-4"), "not a byte count"),
    "external data: offset not a number": (external_case("w.bin", offset="zero"), "not a byte count"),
    "external data: 30-digit length": (external_case("w.bin", length="9" * 30), "not a byte count"),
    "external data: '..' to a file outside": (external_case("../w.bin"), "outside the model's folder"),
    "external data: absolute path": (external_case("/etc/hostname"), "outside the model's folder"),
    "external data: in a local function's If": (external_in_function_if, "outside the model's folder"),
    "external data: 1 GiB under --memory-limit 512M": (external_above_the_limit, "above the memory limit"),
    "a local function's 5000-character node name": (function_with_long_node_name, "characters long"),
    "a 1 MB operator type": (huge_op_type, "characters long"),
    "side input [786432, 1024] under 1G": (side_input([786432, 1024], "--memory-limit", "1G"), "fed whole"),
    "side input [2^31, 1024]": (side_input([1 << 31, 1024]), "fed whole"),
    "side input [b, -3]": (side_input(["b", -3]), "negative dimension"),
    "model file: a FIFO": (model_file("fifo"), "a FIFO, not a regular file"),
    "model file: /dev/zero through a symlink": (model_file("device"), "character device"),
    "model file: a folder": (model_file("folder"), "a folder, not a regular file"),
    "model file: missing": (model_file("missing"), "no such model file"),
    "model file: empty": (model_file("empty"), "not an ONNX model"),
    "model file: random bytes": (model_file("random"), "not an ONNX model"),
    "model file: 3 GB (sparse)": (model_file("above 2 GB"), "above the memory limit"),
}


# --- observation, trajectory and initial-state files --------------------------------------------------------


def _npy_header(path: Path, shape, descr="<f4", payload=b"") -> Path:
    with open(path, "wb") as stream:
        np.lib.format.write_array_header_1_0(stream, {"descr": descr, "fortran_order": False, "shape": shape})
        stream.write(payload)
    return path


def special_file(tmp: Path, kind: str, name: str) -> Path:
    path = tmp / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        os.symlink("/dev/zero", path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "10^11-row header":
        _npy_header(path, (10**11, 17), payload=np.zeros(17, np.float32).tobytes())
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "a NaN at row 2":
        rows = np.zeros((4, 17), np.float32)
        rows[2, 5] = np.nan
        np.save(path, rows)
    return path


def obs_file(kind):
    return lambda tmp: [MLP, *QUICK, "--obs", special_file(tmp, kind, "obs.npy")]


def obs_arrays(arrays: dict, *extra, compressed=False):
    def make(tmp):
        (np.savez_compressed if compressed else np.savez)(tmp / "obs.npz", **arrays)
        return [MLP, *QUICK, "--obs", tmp / "obs.npz", *extra]
    return make


def npz_of_many_members(tmp):
    np.savez(tmp / "obs.npz", obs=np.zeros((4, 17), np.float32), **{f"m{i}": np.zeros(1, np.uint8) for i in range(1100)})
    return [MLP, *QUICK, "--obs", tmp / "obs.npz"]


def npy_with_a_long_header(tmp):
    path = tmp / "obs.npy"
    with open(path, "wb") as stream:
        stream.write(b"\x93NUMPY\x02\x00" + (200_000).to_bytes(4, "little") + b" " * 200_000)
    return [MLP, *QUICK, "--obs", path]


def trajectory(kind):
    return lambda tmp: [MLP, *QUICK, "--trajectory", special_file(tmp, kind, "t.npy")]


def initial_state(kind):
    return lambda tmp: [MLP, *QUICK, "--env", "Pendulum-v1", "--initial-state", special_file(tmp, kind, "h0.npz")]


FILES = {
    "--obs a FIFO": (obs_file("fifo"), "a FIFO, not a regular file"),
    "--obs /dev/zero through a symlink": (obs_file("device"), "character device"),
    "--obs a folder": (obs_file("folder"), "a folder, not a regular file"),
    "--obs missing": (obs_file("missing"), "no such observation file"),
    "--obs empty": (obs_file("empty"), "not a readable"),
    "--obs header of 10^11 rows": (obs_file("10^11-row header"), "header declares"),
    "--obs npz of 1100 arrays": (npz_of_many_members, "more than 1024"),
    "--obs npy header of 200 kB": (npy_with_a_long_header, "not a readable"),
    "--obs npz without the input": (obs_arrays({"other": np.zeros((4, 17), np.float32)}), "no array for model input"),
    "--obs npz with a pickle beside it": (obs_arrays({"obs": np.zeros((4, 17), np.float32), "p": np.array([{}], object)}), "pickled"),
    "--obs npz with a pickle, compressed": (obs_arrays({"obs": np.zeros((4, 17), np.float32), "p": np.array([{}], object)},
                                                       compressed=True), "pickled"),
    "--obs npz: the input above --memory-limit": (obs_arrays({"obs": np.zeros((1 << 20, 17), np.float32)}, "--memory-limit", "64M"),
                                                  "above the memory limit"),
    "--obs npz: wrong shape": (obs_arrays({"obs": np.zeros((4, 3), np.float32)}), "the model expects"),
    "--obs npz: zero rows": (obs_arrays({"obs": np.zeros((0, 17), np.float32)}), "0 observations"),
    "--obs npz: strings": (obs_arrays({"obs": np.full((4, 17), "x")}), "unicode"),
    "--trajectory a FIFO": (trajectory("fifo"), "a FIFO, not a regular file"),
    "--trajectory /dev/zero": (trajectory("device"), "character device"),
    "--trajectory a folder": (trajectory("folder"), "a folder, not a regular file"),
    "--trajectory header of 10^11 rows": (trajectory("10^11-row header"), "header declares"),
    "--trajectory empty": (trajectory("empty"), "not a readable"),
    "--trajectory missing": (trajectory("missing"), "no such trajectory file"),
    "--trajectory with a NaN": (trajectory("a NaN at row 2"), "non-finite value at step 2"),
}


# --- options ------------------------------------------------------------------------------------------------


def option(*args):
    return lambda tmp: [MLP, *QUICK, *args]


def env_module(module: str, body: str):
    """A user's environment class in its own module (a module, once imported, is cached by name)."""
    def make(tmp):
        (tmp / f"{module}.py").write_text(body)
        return [DISCRETE, *QUICK, "--env", f"{module}:Env"]
    return make


RAISES = "class Env:\n    def __init__(self, **kwargs):\n        raise RuntimeError('no display')\n"
HANGS = "import time\nclass Env:\n    def __init__(self, **kwargs):\n        time.sleep(600)\n"
BAD_SPACE = "class Env:\n    observation_space = property(lambda self: 1 / 0)\n    def close(self):\n        pass\n"

OPTIONS = {
    "--timeout 1e12": (option("--timeout", "1e12"), "--timeout"),
    "--timeout 1e309": (option("--timeout", "1e309"), "--timeout"),
    "--memory-limit 16000000T": (option("--memory-limit", "16000000T"), "at most 1024T"),
    "--memory-limit 0": (option("--memory-limit", "0"), "at least 64M"),
    "--memory-limit -1G": (option("--memory-limit", "-1G"), "--memory-limit"),
    # digits of another script (an IME's fullwidth １) are digits to a str pattern's \d and to int()/float(): read as 1
    "--memory-limit fullwidth 1G": (option("--memory-limit", "\uff11G"), "expected a size such as 4G"),
    "--batch-axis fullwidth axis": (option("--batch-axis", "obs=\uff11"), "expected NAME=AXIS"),
    "--targets fullwidth release": (option("--targets", "ort-cpu@\uff11.\uff12\uff10.\uff11"), "is not a release number"),
    "--variants fp32,fp32": (option("--variants", "fp32,fp32"), "given twice"),
    "--variants ,": (option("--variants", ","), "unknown variant"),
    "--variants fp64": (option("--variants", "fp64"), "unknown variant"),
    "--out ''": (option("--out", ""), "is empty"),
    "--out of a 300-character component": (option("--out", "r" * 300 + "/x"), "cannot write there"),
    "--resume ''": (option("--resume", ""), "is empty"),
    "--n-obs 10^30": (option("--n-obs", str(10**30)), "above the limit"),
    "--batch-sizes a": (option("--batch-sizes", "a"), "--batch-sizes"),
    "--batch-sizes -1": (option("--batch-sizes", "-1"), "--batch-sizes"),
    "--min-agreement 2": (option("--min-agreement", "2"), "--min-agreement"),
    "--min-agreement nan": (option("--min-agreement", "nan"), "--min-agreement"),
    "--tie-margin -1": (option("--tie-margin", "-1"), "--tie-margin"),
    "--tie-margin inf": (option("--tie-margin", "inf"), "--tie-margin"),
    "--drift-factor -1": (option("--drift-factor", "-1"), "--drift-factor"),
    "--settings without a value": (option("--settings", "ort-cpu:threads="), "--settings"),
    "--settings threads=0": (option("--settings", "ort-cpu:threads=0"), "whole number"),
    "--settings an unknown knob": (option("--settings", "ort-cpu:turbo=on"), "knob"),
    "--settings an unknown target": (option("--settings", "nothing:threads=1"), "matches none"),
    "--env-kwargs 100000 deep": (option("--env", "CartPole-v1", "--env-kwargs", "[" * 100_000), "nested deeper"),
    "--env-kwargs not JSON": (option("--env", "CartPole-v1", "--env-kwargs", "{nope"), "not JSON"),
    "--env-kwargs a list": (option("--env", "CartPole-v1", "--env-kwargs", "[1]"), "expected a JSON object"),
    "--env-kwargs without --env": (option("--env-kwargs", "{}"), "needs --env"),
    "--env and --trajectory": (option("--env", "CartPole-v1", "--trajectory", "t.npy"), "exclude each other"),
    "--episodes 0": (lambda tmp: [DISCRETE, *QUICK, "--env", "CartPole-v1", "--episodes", "0"], "--episodes"),
    "--return-tolerance abc": (option("--return-tolerance", "abc"), "return-tolerance"),
}


# The environment is made in a guarded step (a process of its own, under --timeout): seconds per case.
ENVIRONMENTS = {
    "--env ':'": (lambda tmp: [DISCRETE, *QUICK, "--env", ":"], "could not be made"),
    "--env max_episode_steps -5": (lambda tmp: [DISCRETE, *QUICK, "--env", "CartPole-v1", "--env-kwargs",
                                                '{"max_episode_steps": -5}'], "could not be made"),
    "--env a class that raises": (env_module("hostile_env_raises", RAISES), "RuntimeError: no display"),
    "--env a class whose space raises": (env_module("hostile_env_space", BAD_SPACE), "ZeroDivisionError"),
    "--env whose constructor hangs": (lambda tmp: [*env_module("hostile_env_hangs", HANGS)(tmp), "--timeout", "3"],
                                      "timed out after 3 s"),
    "--env a module that is missing": (lambda tmp: [DISCRETE, *QUICK, "--env", "no_such_module:Env"], "cannot import"),
}


# --- matrix.toml ----------------------------------------------------------------------------------------------


def config_file(kind):
    return lambda tmp: [MLP, *QUICK, "--config", special_file(tmp, kind, "matrix.toml")]


def config(text: str):
    def make(tmp):
        (tmp / "matrix.toml").write_text(text)
        return [MLP, *QUICK, "--config", tmp / "matrix.toml"]
    return make


CONFIGS = {
    "iters = 1.5": (config("iters = 1.5\n"), "expected a whole number"),
    "iters = true": (config("iters = true\n"), "expected a whole number"),
    "seed = inf": (config("seed = inf\n"), "expected a whole number"),
    "timeout = 1e300": (config("timeout = 1e300\n"), "--timeout"),
    "timeout = 'soon'": (config("timeout = 'soon'\n"), "expected a number"),
    "out = 5": (config("out = 5\n"), "expected a string"),
    "out = ['a']": (config("out = ['a']\n"), "expected a string"),
    "memory-limit = 4": (config("memory-limit = 4\n"), "expected a string"),
    "variants = [[...]] 5000 deep": (config("variants = " + "[" * 5000 + "]" * 5000 + "\n"), "nested deeper"),
    "targets = [['ort-cpu']]": (config("targets = [['ort-cpu']]\n"), "expected a string or a list"),
    "variants = [true]": (config("variants = [true]\n"), "expected a string or a list"),
    "fail-on = 1": (config("fail-on = 1\n"), "expected a string"),
    "diagnose = 'yes'": (config("diagnose = 'yes'\n"), "true or false"),
    "unknown key": (config("turbo = true\n"), "unknown setting"),
    "[tolerance] 1e400": (config('[tolerance]\n"ort-cpu:fp32" = nan\n'), ">= 0"),
    # read like every other file of the user's: the FIFO hung the runner, /dev/zero filled its memory
    "--config a FIFO": (config_file("fifo"), "a FIFO, not a regular file"),
    "--config /dev/zero through a symlink": (config_file("device"), "character device"),
}


# --- results files: compare, merge, --baseline ------------------------------------------------------------------


def _shard(change) -> dict:
    data = json.loads(SHARD.read_text())
    change(data)
    return data


def _set(path: str, value):
    def change(data):
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value
    return change


def _drop(path: str):
    def change(data):
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        del node[last]
    return change


def _duplicate_cell(data):
    data["cells"].append(data["cells"][0])


SHARD_CHANGES = {
    "no model.sha256": (_drop("model.sha256"), "model.sha256"),
    "no model.name": (_drop("model.name"), "model.name"),
    "model.sha256 not a hash": (_set("model.sha256", "<script>"), "model.sha256"),
    "model a list": (_set("model", []), "model"),
    "unknown verdict": (_set("cells.0.verdict", "MAYBE"), "verdict"),
    "p50_us NaN": (_set("cells.0.latency.0.p50_us", "NaN"), "p50_us"),
    "p50_us negative": (_set("cells.0.latency.0.p50_us", -1), "p50_us"),
    "p99_us Infinity": (_set("cells.0.latency.0.p99_us", "Infinity"), "p99_us"),
    "batch 0": (_set("cells.0.latency.0.batch", 0), "batch"),
    "settings a list": (_set("settings", [1, 2]), "settings"),
    "settings.decision a list": (_set("settings.decision", []), "decision"),
    "settings.decision.prefer unknown": (_set("settings.decision", {"prefer": "luck"}), "prefer"),
    "settings.batch_sizes of text": (_set("settings.batch_sizes", ["a"]), "batch_sizes"),
    "settings.tie_margin negative": (_set("settings.tie_margin", -1), "tie_margin"),
    "settings.min_agreement 7": (_set("settings.min_agreement", 7), "min_agreement"),
    "interrupted with an unknown signal": (lambda d: d.update(schema_version=2, interrupted={"after_cells": 1, "signal": "<b>x"}),
                                           "signal"),
    "a cell twice": (_duplicate_cell, "appears twice"),
    "cells an object": (_set("cells", {"a": 1}), "cells"),
    "cells a number": (_set("cells", 5), "cells"),
    "hosts a string": (_set("hosts", "many"), "hosts"),
    "schema_version 'x'": (_set("schema_version", "x"), "schema version"),
    "settings nested 100 deep": (_set("settings", json.loads("[" * 100 + "]" * 100)), "nested deeper"),
}


def _results_file(tmp: Path, data, name="bad.json") -> Path:
    path = tmp / name
    path.write_bytes(data if isinstance(data, bytes) else (data if isinstance(data, str) else json.dumps(data)).encode())
    return path


def compare_with(change):
    return lambda tmp: ["compare", "--baseline", SHARD, "--current", _results_file(tmp, _shard(change))]


def merge_of(change):
    return lambda tmp: ["merge", SHARD, _results_file(tmp, _shard(change)), "--out", tmp / "merged"]


def baseline_of(change):
    return lambda tmp: [MLP, *QUICK, "--baseline", _results_file(tmp, _shard(change)), "--out", tmp / "out"]


def raw_results(text: str | bytes, command="compare"):
    def make(tmp):
        path = _results_file(tmp, text)
        if command == "compare":
            return ["compare", "--baseline", path, "--current", SHARD]
        return ["merge", path, "--out", tmp / "merged"]
    return make


def results_special(kind: str):
    def make(tmp):
        path = special_file(tmp, kind, "results.json")
        return ["compare", "--baseline", path, "--current", SHARD]
    return make


def compare_without_hashes(tmp):
    unhashed = _shard(_drop("model.sha256"))
    return ["compare", "--baseline", _results_file(tmp, unhashed, "a.json"), "--current", _results_file(tmp, unhashed, "b.json")]


RESULTS = {
    **{f"compare: {case}": (compare_with(change), words) for case, (change, words) in SHARD_CHANGES.items()},
    **{f"merge: {case}": (merge_of(change), words) for case, (change, words) in SHARD_CHANGES.items()},
    **{f"--baseline: {case}": (baseline_of(change), words)
       for case, (change, words) in list(SHARD_CHANGES.items())[:8]},
    "compare: 100000-deep JSON": (raw_results("[" * 100_000 + "]" * 100_000), "nested deeper"),
    "merge: 100000-deep JSON": (raw_results('{"a":' * 100_000 + "1" + "}" * 100_000, "merge"), "nested deeper"),
    "compare: not UTF-8": (raw_results(b'{"a": "\xff"}'), "not JSON"),
    "compare: a JSON string": (raw_results('"results"'), "not a results file"),
    "compare: another tool's JSON object": (raw_results('{"version": 3, "results": []}'),
                                            "not a policy-matrix results file (no schema_version)"),
    "compare: empty": (raw_results(""), "not JSON"),
    "compare: a FIFO": (results_special("fifo"), "a FIFO, not a regular file"),
    "compare: /dev/zero": (results_special("device"), "character device"),
    "compare: two results without a model hash": (compare_without_hashes, "model.sha256"),
}


# --- report folders: --resume, planted links, the lock -------------------------------------------------------------


def _run_json(tmp: Path, text: str) -> list:
    (tmp / "out").mkdir()
    (tmp / "out" / "run.json").write_text(text)
    return [MLP, *QUICK, "--resume", tmp / "out"]


def planted_link(name: str):
    def make(tmp):
        (tmp / "out" / Path(name).parent).mkdir(parents=True)
        (tmp / "out" / ".policy-matrix.lock").touch()  # a folder the tool took before: its mark
        (tmp / "victim.txt").write_text("keep me")
        os.symlink(tmp / "victim.txt", tmp / "out" / name)
        return [MLP, *QUICK, "--out", tmp / "out"]
    return make


def lock_is(kind: str):
    def make(tmp):
        (tmp / "out").mkdir()
        lock = tmp / "out" / ".policy-matrix.lock"
        lock.mkdir() if kind == "folder" else os.symlink(tmp / "elsewhere", lock)
        return [MLP, *QUICK, "--out", tmp / "out"]
    return make


def users_folder(command: str):
    """A folder holding the user's own index.html, named where the tool writes a report or a table."""
    def make(tmp):
        (tmp / "mine").mkdir()
        (tmp / "mine" / "index.html").write_text("my page")
        option = command.split()[1]
        return {"run": [MLP, *QUICK, option, tmp / "mine"],
                "merge": ["merge", Path(__file__).parents[1] / "fixtures" / "shard_continuous_mlp.json", "--out", tmp / "mine"],
                "frameworks": ["frameworks", "--out", tmp / "mine"]}[command.split()[0]]
    return make


VALID_SHA = "0" * 64
FOLDERS = {
    "run.json: settings a list": (lambda tmp: _run_json(tmp, json.dumps({"run_id": "a1", "model_sha256": VALID_SHA, "settings": []})),
                                  "field settings"),
    "run.json: no run_id": (lambda tmp: _run_json(tmp, json.dumps({"model_sha256": VALID_SHA})), "field run_id"),
    "run.json: run_id a path": (lambda tmp: _run_json(tmp, json.dumps({"run_id": "../../x", "model_sha256": VALID_SHA})),
                                "field run_id"),
    "run.json: 100000 deep": (lambda tmp: _run_json(tmp, "[" * 100_000), "nested deeper"),
    "run.json: not JSON": (lambda tmp: _run_json(tmp, "{"), "not JSON"),
    "run.json: a list": (lambda tmp: _run_json(tmp, "[]"), "run.json"),
    **{f"planted link: {name}": (planted_link(name), "symbolic link")
       for name in ("run.json", "results.jsonl", "reference.npz", "reference_margins.npz", "observations.npz",
                    "results.json", "index.html", ".results.json.partial", "cells/ort-cpu-fp32/worker.log", "variants")},
    "lock: a folder": (lock_is("folder"), "not a regular file"),
    "lock: a symlink": (lock_is("symlink"), "symbolic link"),
    **{f"a folder of the user's: {command}": (users_folder(command), "not a policy-matrix report")
       for command in ("run --out", "run --resume", "merge --out", "frameworks --out")},
}

TABLE = {**MODELS, **FILES, **OPTIONS, **CONFIGS, **RESULTS, **FOLDERS}


def test_the_table_covers_at_least_150_cases():
    assert len(TABLE) + len(ENVIRONMENTS) >= 150, len(TABLE)


@pytest.mark.slow
@pytest.mark.parametrize("case", ENVIRONMENTS)
def test_a_hostile_environment_is_one_line_and_exit_2(case, tmp_path, policy_matrix):
    make, expected = ENVIRONMENTS[case]
    assert_one_line(policy_matrix(make(tmp_path)), expected)


@pytest.mark.parametrize("case", TABLE)
def test_hostile_input_is_one_line_and_exit_2(case, tmp_path, policy_matrix):
    make, expected = TABLE[case]
    assert_one_line(policy_matrix(make(tmp_path)), expected)


def test_a_planted_link_is_left_untouched(tmp_path, policy_matrix):
    args = planted_link("results.jsonl")(tmp_path)
    policy_matrix(args)
    assert (tmp_path / "victim.txt").read_text() == "keep me"


@pytest.mark.parametrize("command", ["run --out", "merge --out", "frameworks --out"])
def test_a_folder_of_the_users_is_left_untouched(command, tmp_path, policy_matrix):
    """`--out` naming a folder of the user's own files overwrote its index.html (or summary.md) without a word."""
    policy_matrix(users_folder(command)(tmp_path))
    assert sorted(path.name for path in (tmp_path / "mine").iterdir()) == ["index.html"]
    assert (tmp_path / "mine" / "index.html").read_text() == "my page"


def test_an_interrupted_shard_does_not_decide_the_exit_code_of_a_merge(tmp_path, policy_matrix):
    """Only the run that was interrupted exits 130/143; a merge shows the shard's interruption and exits by
    the verdicts (--fail-on), as CI expects of a merge job."""
    interrupted = _shard(lambda data: data.update(schema_version=2, interrupted={"after_cells": 2, "signal": "SIGINT"}))
    done = policy_matrix(["merge", _results_file(tmp_path, interrupted), "--out", tmp_path / "merged"])
    assert done.returncode == 0, done.lines[-5:]
    assert "interrupted (SIGINT) after 2 cells" in (tmp_path / "merged" / "summary.md").read_text()
