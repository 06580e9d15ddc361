"""Hostile input, table-driven: every malformed model, observation file, option and config
ends in exit 2 and one line on stderr, never a traceback and never a silent acceptance.

The models are built here with onnx.helper, so each case shows exactly what is hostile. The cases run in this
process (`cli.main()`, tests/conftest.py's `policy_matrix`); one case of each table and the memory-bounded
ones run as a user's process (tests/unit/test_hostile_parsing.py holds the parsing layer's own table).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import CliRun, run_cli
from onnx import TensorProto, helper, numpy_helper

from matrix.inputs.examples import path as example

OPSET = [helper.make_opsetid("", 18)]
MLP = example("continuous_mlp")  # input obs [batch, 17]


def _model(nodes, inputs, outputs, initializers=(), opset=OPSET) -> onnx.ModelProto:
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(initializers)), opset_imports=opset)


def _save(folder: Path, model: onnx.ModelProto, name: str = "m.onnx") -> Path:
    onnx.save(model, folder / name)
    return folder / name


def _float_io(shape, name="obs"):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _identity_model(input_info) -> onnx.ModelProto:
    tensor = input_info.type.tensor_type
    shape = [d.dim_value or d.dim_param for d in tensor.shape.dim] if tensor.HasField("shape") else ["b", 4]
    output_info = helper.make_tensor_value_info("action", tensor.elem_type, shape)
    return _model([helper.make_node("Identity", [input_info.name], ["action"])], [input_info], [output_info])


# --- models ---------------------------------------------------------------------------


def no_inputs(folder):
    value = numpy_helper.from_array(np.ones((1, 2), np.float32))
    node = helper.make_node("Constant", [], ["action"], value=value)
    return _save(folder, _model([node], [], [_float_io([1, 2], "action")]))


def sequence_input(folder):
    seq = helper.make_tensor_sequence_value_info("obs", TensorProto.FLOAT, ["b", 4])
    node = helper.make_node("SequenceLength", ["obs"], ["action"])
    return _save(folder, _model([node], [seq], [helper.make_tensor_value_info("action", TensorProto.INT64, [])]))


def map_input(folder):
    map_type = helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
    obs = helper.make_value_info("obs", map_type)
    node = helper.make_node("DictVectorizer", ["obs"], ["action"], domain="ai.onnx.ml", int64_vocabulary=[0, 1])
    opset = [*OPSET, helper.make_opsetid("ai.onnx.ml", 3)]
    return _save(folder, _model([node], [obs], [_float_io(["b", 2], "action")], opset=opset))


def optional_input(folder):
    optional = helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, ["b", 4]))
    obs = helper.make_value_info("obs", optional)
    node = helper.make_node("OptionalHasElement", ["obs"], ["action"])
    return _save(folder, _model([node], [obs], [helper.make_tensor_value_info("action", TensorProto.BOOL, [])]))


def string_input(folder):
    return _save(folder, _identity_model(helper.make_tensor_value_info("obs", TensorProto.STRING, ["b", 4])))


def rank0_input(folder):
    return _save(folder, _identity_model(_float_io([])))


def no_shape_input(folder):
    return _save(folder, _identity_model(_float_io(None)))


def zero_sized_dim(folder):
    return _save(folder, _identity_model(_float_io(["b", 0])))


def huge_node_name(folder):
    obs = _float_io(["b", 4])
    node = helper.make_node("Relu", ["obs"], ["action"], name="n" * 10_000_000)
    return _save(folder, _model([node], [obs], [_float_io(["b", 4], "action")]))


def huge_input_name(folder):
    name = "o" * 2_000_000
    return _save(folder, _model([helper.make_node("Relu", [name], ["action"])], [_float_io(["b", 4], name)], [_float_io(["b", 4], "action")]))


def nul_in_input_name(folder):
    """onnx.reference and a zip member name (observations.npz is keyed by input names) end at the NUL."""
    return _save(folder, _model([helper.make_node("Relu", ["ob\0s"], ["action"])], [_float_io(["b", 4], "ob\0s")],
                                [_float_io(["b", 4], "action")]))


def _declared(shape):
    def make(folder):
        return _save(folder, _model([helper.make_node("Relu", ["obs"], ["action"])], [_float_io(shape)], [_float_io(shape, "action")]))
    return make


def constant_of_shape_4tb(folder):
    shape = numpy_helper.from_array(np.array([1 << 20, 1 << 20], np.int64), "shape")
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["big"]),
        helper.make_node("ReduceMax", ["big"], ["top"], keepdims=0),
        helper.make_node("Add", ["obs", "top"], ["action"]),
    ]
    return _save(folder, _model(nodes, [_float_io(["b", 4])], [_float_io(["b", 4], "action")], [shape]))


def _external_weight(location: str) -> onnx.TensorProto:
    weight = numpy_helper.from_array(np.ones(4, np.float32), "w")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        weight.external_data.add(key=key, value=value)
    return weight


def _if_with_external(location: str):
    """A model whose external tensor hides in the then-branch of an If."""
    def make(folder):
        (folder.parent / "secret.bin").write_bytes(np.ones(4, np.float32).tobytes())
        branch_out = _float_io([4], "w_out")
        then_graph = helper.make_graph([helper.make_node("Identity", ["w"], ["w_out"])], "then", [], [branch_out], [_external_weight(location)])
        zeros = numpy_helper.from_array(np.zeros(4, np.float32), "z")
        else_graph = helper.make_graph([helper.make_node("Identity", ["z"], ["w_out"])], "else", [], [branch_out], [zeros])
        cond = numpy_helper.from_array(np.array(True), "cond")
        nodes = [
            helper.make_node("If", ["cond"], ["w_branch"], then_branch=then_graph, else_branch=else_graph),
            helper.make_node("Mul", ["obs", "w_branch"], ["action"]),
        ]
        return _save(folder, _model(nodes, [_float_io(["b", 4])], [_float_io(["b", 4], "action")], [cond]))
    return make


def _loop_with_external(location: str):
    def make(folder):
        (folder.parent / "secret.bin").write_bytes(np.ones(4, np.float32).tobytes())
        body = helper.make_graph(
            [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["acc_in", "w"], ["acc_out"])],
            "body",
            [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
             _float_io([4], "acc_in")],
            [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), _float_io([4], "acc_out")],
            [_external_weight(location)],
        )
        init = [numpy_helper.from_array(np.array(2, np.int64), "trips"), numpy_helper.from_array(np.array(True), "go"),
                numpy_helper.from_array(np.zeros(4, np.float32), "acc0")]
        nodes = [helper.make_node("Loop", ["trips", "go", "acc0"], ["acc"], body=body),
                 helper.make_node("Mul", ["obs", "acc"], ["action"])]
        return _save(folder, _model(nodes, [_float_io(["b", 4])], [_float_io(["b", 4], "action")], init))
    return make


def _symlink_external(folder):
    (folder.parent / "secret.bin").write_bytes(np.ones(4, np.float32).tobytes())
    os.symlink(folder.parent / "secret.bin", folder / "weights.bin")
    return _if_with_external("weights.bin")(folder)


def _action_metadata(**metadata):
    """The MLP with action metadata the contract check reads (its bounds, its number of actions)."""
    def make(folder):
        model = onnx.load(MLP)
        helper.set_model_props(model, metadata)
        return _save(folder, model)
    return make


MODELS = {
    "no inputs": (no_inputs, "no inputs"),
    "sequence input": (sequence_input, "sequence"),
    "map input": (map_input, "map"),
    "optional input": (optional_input, "optional"),
    "string input": (string_input, "STRING"),
    "rank-0 input": (rank0_input, "rank 0"),
    "input without shape": (no_shape_input, "not a valid ONNX model"),  # the checker already says so
    "zero-sized dimension": (zero_sized_dim, "zero-sized"),
    "10 MB node name": (huge_node_name, "characters long"),
    "2 MB input name": (huge_input_name, "characters long"),
    "NUL in an input name": (nul_in_input_name, "holds a NUL character"),
    "input [b, 1e9]": (_declared(["b", 10**9]), "per sample"),
    "input [b, 2^40]": (_declared(["b", 1 << 40]), "per sample"),
    "input [b, 2^20, 2^20]": (_declared(["b", 1 << 20, 1 << 20]), "per sample"),
    "ConstantOfShape of 4 TB": (constant_of_shape_4tb, "4 TiB, above the limit"),
    "external data '..' inside If": (_if_with_external("../secret.bin"), "outside the model's folder"),
    "external data absolute inside If": (lambda f: _if_with_external(str(f.parent / "secret.bin"))(f), "outside the model's folder"),
    "external data '..' inside Loop": (_loop_with_external("../secret.bin"), "outside the model's folder"),
    "external data via symlink": (_symlink_external, "outside the model's folder"),
    # read by the judge: a word ended the run in a traceback after the first cell, a NaN bound or a negative
    # count FAILed every cell's contract as if the runtime had broken it
    "metadata action_n 'abc'": (_action_metadata(action_space="discrete", action_n="abc"), "action_n = 'abc'"),
    "metadata action_n of 5000 digits": (_action_metadata(action_n="9" * 5000), "action_n = '99999"),
    "metadata action_n -3": (_action_metadata(action_n="-3"), "a whole number of actions >= 1"),
    "metadata action_low 'abc'": (_action_metadata(action_low="abc", action_high="1"), "action_low = 'abc'"),
    "metadata action_high NaN": (_action_metadata(action_low="-1", action_high="nan"), "action_high = 'nan'"),
    "metadata action_low with a digit group": (_action_metadata(action_low="-1_0", action_high="1"),
                                                "action_low = '-1_0': expected a number"),
    "metadata action_low above action_high": (_action_metadata(action_low="2", action_high="1"), "above action_high"),
    "metadata action_low inf": (_action_metadata(action_low="inf", action_high="inf"), "action_low = 'inf': no action"),
    "metadata action_high -1e999": (_action_metadata(action_low="-1", action_high="-1e999"), "action_high = '-1e999': no action"),
}


# --- observation files (for the MLP: obs [batch, 17] float32) -------------------------


def _npy(array, name="obs.npy", **kwargs):
    def make(folder):
        np.save(folder / name, array, **kwargs)
        return folder / name
    return make


def pickle_in_npz_unused_key(folder):
    np.savez(folder / "obs.npz", obs=np.zeros((4, 17), np.float32), junk=np.array([{"a": 1}], dtype=object))
    return folder / "obs.npz"


def header_of_1e11_rows(folder):
    header = {"descr": "<f4", "fortran_order": False, "shape": (10**11, 17)}
    with open(folder / "obs.npy", "wb") as stream:
        np.lib.format.write_array_header_1_0(stream, header)
        stream.write(np.zeros(17, np.float32).tobytes())
    return folder / "obs.npy"


def broken_zip(folder):
    (folder / "obs.npz").write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    return folder / "obs.npz"


def text_file(folder):
    (folder / "obs.npy").write_text("1,2,3\n")
    return folder / "obs.npy"


OBSERVATIONS = {
    "unicode array": (_npy(np.full((4, 17), "ä")), "unicode"),
    "byte strings": (_npy(np.full((4, 17), b"x")), "byte strings"),
    "pickled object array": (_npy(np.array([[{}] * 17] * 2, dtype=object), allow_pickle=True), "pickled"),
    "pickle under an unused npz key": (pickle_in_npz_unused_key, "pickled"),
    "zero rows": (_npy(np.zeros((0, 17), np.float32)), "0 observations"),
    "header declaring 10^11 rows": (header_of_1e11_rows, "header declares"),
    "complex values": (_npy(np.zeros((4, 17), np.complex64)), "complex"),
    "structured records": (_npy(np.zeros((4, 17), dtype=[("a", "f4"), ("b", "i4")])), "raw records"),
    "dates": (_npy(np.zeros((4, 17), "datetime64[s]")), "dates"),
    "broken zip": (broken_zip, "not a readable"),
    "text file": (text_file, "not a readable"),
    # every runtime FAILed 'finite outputs' on the file's NaN, as if it had made it; 1e39 becomes inf in float32
    "a NaN": (_npy(np.where(np.arange(4 * 17).reshape(4, 17) == 20, np.nan, 0).astype(np.float32)), "non-finite value at row 1"),
    "float64 beyond float32": (_npy(np.full((4, 17), 1e39)), "non-finite value at row 0"),
}


# --- options --------------------------------------------------------------------------

OPTIONS = {
    "--n-obs 0": (["--n-obs", "0"], "--n-obs"),
    "--n-obs -5": (["--n-obs", "-5"], "--n-obs"),
    "--n-obs abc": (["--n-obs", "abc"], "--n-obs"),
    "--threads 0": (["--threads", "0"], "--threads"),
    "--warmup -1": (["--warmup", "-1"], "--warmup"),
    "--iters 0": (["--iters", "0"], "--iters"),
    "--seed -1": (["--seed", "-1"], "--seed"),
    "--timeout 0": (["--timeout", "0"], "--timeout"),
    "--timeout nan": (["--timeout", "nan"], "--timeout"),
    "--timeout -1": (["--timeout", "-1"], "--timeout"),
    "--timeout inf": (["--timeout", "inf"], "--timeout"),
    "--batch-sizes 0": (["--batch-sizes", "0"], "--batch-sizes"),
    # the tool makes each timed batch (745 GiB of row indices alone): refused, not a cell's "out of memory"
    "--batch-sizes 10^11": (["--batch-sizes", "1,100000000000"], "--batch-sizes 100000000000: a batch needs"),
    "NaN tolerance": (["--tolerance", "ort-cpu:fp32=nan"], ">= 0"),
    "negative tolerance": (["--tolerance", "ort-cpu:fp32=-1e-3"], ">= 0"),
    "non-numeric tolerance": (["--tolerance", "ort-cpu:fp32=abc"], "TARGET:VARIANT=VALUE"),
    "tolerance *:*": (["--tolerance", "*:*=0.1"], "matches nothing"),
    "tolerance of an unknown target": (["--tolerance", "no-such:fp32=0.1"], "matches nothing"),
    "tolerance of an unknown precision": (["--tolerance", "ort-cpu:fp8=0.1"], "matches nothing"),
    "bare unknown tolerance key": (["--tolerance", "fast=0.1"], "matches nothing"),
    "--memory-limit too small": (["--memory-limit", "12"], "--memory-limit"),
    "--memory-limit not a size": (["--memory-limit", "lots"], "--memory-limit"),
    "--require unknown target": (["--require", "no-such"], "--require: unknown target"),
    "--require a target not selected": (["--targets", "ort-cpu", "--require", "tract"], "--require"),
    "--drift-factor nan": (["--drift-factor", "nan"], "--drift-factor"),
    "--latency-threshold -1": (["--latency-threshold", "-1"], "--latency-threshold"),
    "--fail-on unknown": (["--fail-on", "sometimes"], "--fail-on"),
}


def _out_is_a_file(tmp):
    (tmp / "file").write_text("x")
    return ["--out", tmp / "file"], "not a folder"


def _out_below_a_file(tmp):
    (tmp / "file").write_text("x")
    return ["--out", tmp / "file" / "report"], "cannot write there"


def _out_in_proc(tmp):
    return ["--out", "/proc/policy-matrix-report"], "cannot write there"


def _resume_nothing(tmp):
    (tmp / "empty").mkdir()
    return ["--resume", tmp / "empty"], "no run to resume"


def _resume_other_out(tmp):
    return ["--resume", tmp / "a", "--out", tmp / "b"], "--resume"


def _baseline_not_results(tmp):
    (tmp / "base.json").write_text("[1, 2]")
    return ["--baseline", tmp / "base.json"], "not a results file"


def _baseline_invalid(tmp):
    (tmp / "base.json").write_text('{"schema_version": 1, "cells": "many"}')
    return ["--baseline", tmp / "base.json"], "not a valid results file"


PATH_OPTIONS = {
    "--out is a file": _out_is_a_file,
    "--out below a file": _out_below_a_file,
    "--out unwritable": _out_in_proc,
    "--resume a folder without a run": _resume_nothing,
    "--resume and another --out": _resume_other_out,
    "--baseline a JSON list": _baseline_not_results,
    "--baseline of the wrong shape": _baseline_invalid,
}


# --- matrix.toml ----------------------------------------------------------------------

CONFIGS = {
    "top-level tolerance = 5": ("tolerance = 5\n", "must be a table"),
    "non-UTF-8": (b"[tolerance]\n\"fp32\" = 1e-4 # \xff\xfe\n", "not UTF-8"),
    "NaN value": ('[tolerance]\n"ort-cpu:fp32" = nan\n', ">= 0"),
    "negative value": ('[tolerance]\n"ort-cpu:fp32" = -0.1\n', ">= 0"),
    "string value": ('[tolerance]\n"ort-cpu:fp32" = "abc"\n', "not a number"),
    "boolean value": ('[tolerance]\n"ort-cpu:fp32" = true\n', "not a number"),
    "list value": ('[tolerance]\n"ort-cpu:fp32" = [1, 2]\n', "not a number"),
    "*:* key": ('[tolerance]\n"*:*" = 0.1\n', "matches nothing"),
    "unknown target key": ('[tolerance]\n"no-such" = 0.1\n', "matches nothing"),
    "broken TOML": ("[tolerance\n", "cannot read the config"),
}


def assert_one_line(done: CliRun, expected: str) -> None:
    assert done.returncode == 2, (done.returncode, done.lines[-5:])
    assert len(done.lines) == 1 and expected in done.lines[0], done.lines[-5:]
    assert len(done.lines[0]) < 1000, "one readable line, not a dump"


def test_the_table_has_at_least_40_cases():
    total = len(MODELS) + len(OBSERVATIONS) + len(OPTIONS) + len(PATH_OPTIONS) + len(CONFIGS) + 1  # + missing config
    assert total >= 40


# Each case runs in this process (cli.main() with its real jobs and workers, no interpreter to start and import
# per case: ~0.04 s a case against ~3 s); test_the_real_process_exits_2_with_one_line runs one case of each table
# as a user's process, for its exit code and its stderr.


def _model_case(case, tmp_path):
    make, expected = MODELS[case]
    folder = tmp_path / "models"
    folder.mkdir()
    return [make(folder), "--targets", "ort-cpu", "--out", tmp_path / "out"], expected


def _observation_case(case, tmp_path):
    make, expected = OBSERVATIONS[case]
    return [MLP, "--targets", "ort-cpu", "--obs", make(tmp_path), "--out", tmp_path / "out"], expected


def _option_case(case, tmp_path):
    args, expected = OPTIONS[case]
    return [MLP, "--out", tmp_path / "out", *args], expected


def _path_option_case(case, tmp_path):
    args, expected = PATH_OPTIONS[case](tmp_path)
    return [MLP, "--targets", "ort-cpu", *args], expected


def _config_case(case, tmp_path):
    text, expected = CONFIGS[case]
    config = tmp_path / "matrix.toml"
    config.write_bytes(text if isinstance(text, bytes) else text.encode())
    return [MLP, "--config", config, "--out", tmp_path / "out"], expected


@pytest.mark.parametrize("case", MODELS)
def test_hostile_model(case, tmp_path, policy_matrix):
    args, expected = _model_case(case, tmp_path)
    assert_one_line(policy_matrix(args), expected)


@pytest.mark.parametrize("case", OBSERVATIONS)
def test_hostile_observation_file(case, tmp_path, policy_matrix):
    args, expected = _observation_case(case, tmp_path)
    assert_one_line(policy_matrix(args), expected)


@pytest.mark.parametrize("case", OPTIONS)
def test_hostile_option(case, tmp_path, policy_matrix):
    args, expected = _option_case(case, tmp_path)
    assert_one_line(policy_matrix(args), expected)


@pytest.mark.parametrize("case", PATH_OPTIONS)
def test_hostile_path_option(case, tmp_path, policy_matrix):
    args, expected = _path_option_case(case, tmp_path)
    assert_one_line(policy_matrix(args), expected)


def test_a_refused_baseline_leaves_no_report_folder(tmp_path, policy_matrix):
    """Refused before anything is written, as merge's is: run made --out (with its lock) first and left it empty."""
    (tmp_path / "base.json").write_text("[1, 2]")
    done = policy_matrix([MLP, "--targets", "ort-cpu", "--out", tmp_path / "report", "--baseline", tmp_path / "base.json"])
    assert_one_line(done, "not a results file")
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize("case", CONFIGS)
def test_hostile_config(case, tmp_path, policy_matrix):
    args, expected = _config_case(case, tmp_path)
    assert_one_line(policy_matrix(args), expected)


def test_missing_config(tmp_path, policy_matrix):
    assert_one_line(policy_matrix([MLP, "--config", tmp_path / "nope.toml", "--out", tmp_path / "out"]), "no such config file")


@pytest.mark.slow
@pytest.mark.parametrize("table, case", [(_model_case, "ConstantOfShape of 4 TB"), (_observation_case, "pickled object array"),
                                         (_option_case, "--timeout nan"), (_path_option_case, "--out unwritable"),
                                         (_config_case, "non-UTF-8")],
                         ids=lambda value: getattr(value, "__name__", value))
def test_the_real_process_exits_2_with_one_line(table, case, tmp_path):
    args, expected = table(case, tmp_path)
    done = run_cli("run", *args)
    assert "Traceback" not in done.stderr
    assert_one_line(CliRun(done.returncode, done.stdout, done.stderr), expected)


# --- the runner's own memory (tests/unit/test_hostile_parsing.py holds the in-process table) -----------


def _run_measuring_peak(*args) -> tuple[int, str, int]:
    """Exit code, stderr and the peak resident memory (bytes) of the CLI and the processes it waited for."""
    process = subprocess.Popen([sys.executable, "-m", "matrix", *map(str, args)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    stderr = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    return process.returncode, stderr, usage.ru_maxrss * 1024


def _obs_dev_zero(tmp):
    os.symlink("/dev/zero", tmp / "obs.npy")
    return [MLP, "--obs", tmp / "obs.npy"], "character device"


def _external_1gib(tmp):
    (tmp / "m").mkdir()
    with open(tmp / "m" / "w.bin", "wb") as stream:
        stream.truncate(1 << 30)  # sparse: declared, not stored
    weight = _external_weight("w.bin")
    weight.dims[:] = [1 << 28]
    next(e for e in weight.external_data if e.key == "length").value = str(1 << 30)
    nodes = [helper.make_node("ReduceSum", ["w"], ["s"], keepdims=0), helper.make_node("Add", ["obs", "s"], ["action"])]
    return [_save(tmp / "m", _model(nodes, [_float_io(["b", 4])], [_float_io(["b", 4], "action")], [weight]))], "above the memory limit"


@pytest.mark.slow
@pytest.mark.parametrize("make", [_obs_dev_zero, _external_1gib], ids=["--obs /dev/zero", "1 GiB of external data"])
def test_a_hostile_file_is_refused_within_the_memory_cap(make, tmp_path):
    args, expected = make(tmp_path)
    code, stderr, peak = _run_measuring_peak("run", *args, "--targets", "ort-cpu", "--memory-limit", "512M",
                                              "--out", tmp_path / "out")
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and expected in lines[0], stderr[-2000:]
    assert peak < 512 << 20, f"peak {peak / 2**20:.0f} MiB"


@pytest.mark.slow
def test_an_npz_of_unused_giants_runs_reading_only_the_models_input(tmp_path):
    """11 arrays of 100 MB beside the one the model needs (1.1 GB declared, compressed to little):
    a documented run under --memory-limit 300M, since only `obs` is read."""
    # np.savez_compressed's default level took 7.9 CPU s to write this file; zlib's fastest level 3.2 (5 MB on disk).
    giant = np.zeros(25 << 20, np.float32)
    arrays = [("obs", np.zeros((8, 17), np.float32)), *((f"unused{i}", giant) for i in range(11))]
    with zipfile.ZipFile(tmp_path / "obs.npz", "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for name, array in arrays:
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array)
    code, stderr, peak = _run_measuring_peak("run", MLP, "--obs", tmp_path / "obs.npz", "--targets", "ort-cpu",
                                              "--variants", "fp32", "--iters", "5", "--memory-limit", "300M",
                                              "--out", tmp_path / "out")
    assert code == 0, stderr[-2000:]
    # Resident memory counts the runtimes' shared libraries, which the data cap does not: the bound that shows the
    # 1.1 GB of unused arrays were never read is half of them, not the cap itself (peaks seen: 156-344 MiB).
    assert peak < 550 << 20, f"peak {peak / 2**20:.0f} MiB"



def test_a_node_name_that_reads_as_console_markup_is_shown_as_written(tmp_path, policy_matrix):
    """onnxruntime has no Erf for doubles and names the node in its refusal; the float64 reference runs it, so
    the run goes on after the line saying the development runtime failed. That line once fed the node's name to
    rich as markup: `[/]` closed nothing and the run ended in a traceback before its first cell."""
    name = "erf[/]\x1b[31m"
    obs = helper.make_tensor_value_info("obs", TensorProto.DOUBLE, ["b", 4])
    action = helper.make_tensor_value_info("action", TensorProto.DOUBLE, ["b", 4])
    model = _save(tmp_path, _model([helper.make_node("Erf", ["obs"], ["action"], name=name)], [obs], [action]))
    out = tmp_path / "a[" / "]out"  # the last line names the report: a folder's `[/]` is not markup either
    done = policy_matrix([model, "--targets", "ort-cpu", "--variants", "fp32", "--iters", "5", "--out", out])
    assert done.returncode == 1, done.stderr[-2000:]  # the ort-cpu cell FAILs with onnxruntime's words
    assert done.lines[-2:] == [f"report: {out / 'index.html'}", "policy-matrix: exit 1: 1 cell: 1 FAIL (--fail-on fail)"]
    refusal = next(line for line in done.lines if "the development runtime) failed" in line)
    assert "with name 'erf[/]\\x1b[31m'" in refusal, refusal
    assert "\x1b" not in done.stdout + done.stderr


def test_names_that_are_npz_words_or_paths_are_saved_and_read_back_as_themselves(tmp_path, policy_matrix):
    """observations.npz, reference.npz and each cell's outputs are keyed by the model's names. np.savez took an
    input or output named `file` for its own argument (a traceback) and `allow_pickle` for its flag (the array
    silently dropped), and np.load's data["a.npy"] read the array of `a`. Names with '/' or '..' are member names,
    never paths: the files written are the run's own."""
    inputs = ["file", "../x", "A"]
    outputs = {"allow_pickle": "Relu", "a": "Neg", "a.npy": "Abs", "p/../q": "Sigmoid", "/abs": "Tanh"}
    nodes = [helper.make_node(op, [inputs[i % len(inputs)]], [name]) for i, (name, op) in enumerate(outputs.items())]
    model = _save(tmp_path, _model(nodes, [_float_io(["b", 4], name) for name in inputs],
                                   [_float_io(["b", 4], name) for name in outputs]))
    out = tmp_path / "out"
    done = policy_matrix([model, "--targets", "ort-cpu", "--variants", "fp32", "--iters", "5", "--out", out])
    assert done.returncode == 0, done.stderr[-2000:]
    from matrix import results as schema, userfiles

    (cell,) = schema.load(out / "results.json").cells
    assert cell.verdict == "PASS" and sorted(p.output for p in cell.parity) == sorted(outputs)
    observed = userfiles.read_arrays(out / "observations.npz", "observation", None)
    reference = userfiles.read_arrays(out / "reference.npz", "reference", None)
    assert sorted(observed) == sorted(inputs) and sorted(reference) == sorted(outputs)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    expected = dict(zip(outputs, session.run(list(outputs), observed)))
    for name in outputs:
        np.testing.assert_allclose(reference[name], expected[name], atol=1e-6, err_msg=name)
    again = policy_matrix([model, "--obs", out / "observations.npz", "--targets", "ort-cpu", "--variants", "fp32",
                           "--iters", "5", "--out", tmp_path / "again"])
    assert again.returncode == 0, again.stderr[-2000:]
    first, second = (schema.load(folder / "results.json").model for folder in (out, tmp_path / "again"))
    assert second["observations_sha256"] == first["observations_sha256"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "m.onnx", "out"]


def test_an_output_named_as_another_outputs_margins_keeps_its_own_values(tmp_path, policy_matrix):
    """reference.npz held the outputs by name and each discrete output's margins as `margin:<output>`: an output
    literally named `margin:action` (here the best logit) was overwritten by the action's margins. The margins have
    their own file, by output name; reference.npz keeps every output by name, as readers take it."""
    logits = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["obs", "w"], ["logits"]),
             helper.make_node("ArgMax", ["logits"], ["action"], axis=1, keepdims=0),
             helper.make_node("ReduceMax", ["logits"], ["margin:action"], axes=[1], keepdims=0)]
    outputs = [helper.make_tensor_value_info("action", TensorProto.INT64, ["b"]), _float_io(["b"], "margin:action")]
    model = _save(tmp_path, _model(nodes, [_float_io(["b", 4])], outputs, [logits], opset=[helper.make_opsetid("", 17)]))
    out = tmp_path / "out"
    done = policy_matrix([model, "--targets", "ort-cpu", "--variants", "fp32", "--iters", "5", "--out", out])
    assert done.returncode == 0, done.stderr[-2000:]
    from matrix import userfiles

    observed = userfiles.read_arrays(out / "observations.npz", "observation", None)
    reference = userfiles.read_arrays(out / "reference.npz", "reference", None)
    margins = userfiles.read_arrays(out / "reference_margins.npz", "margins", None)
    best, action = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(["margin:action", "action"], observed)
    assert sorted(reference) == ["action", "margin:action"] and sorted(margins) == ["action"]
    np.testing.assert_allclose(reference["margin:action"], best, atol=1e-6)
    np.testing.assert_array_equal(reference["action"], action)
    top2 = np.sort(observed["obs"].astype(np.float64) @ numpy_helper.to_array(logits), axis=1)[:, -2:]
    np.testing.assert_allclose(margins["action"], top2[:, 1] - top2[:, 0], atol=1e-9)


@pytest.mark.parametrize("name", ["..onnx", "...onnx"])
def test_a_model_named_with_dots_reports_into_a_folder_of_its_own(name, tmp_path, policy_matrix):
    """The report's default folder is reports/<the file's stem>: the stem of '...onnx' is '..', which put the
    report into the current folder itself (and '..onnx' into reports/), beside the user's files."""
    (tmp_path / name).write_bytes(MLP.read_bytes())
    done = policy_matrix([tmp_path / name, "--targets", "ort-cpu", "--variants", "fp32", "--iters", "5"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "reports" / name / "index.html").is_file(), sorted(p.name for p in (tmp_path / "reports").iterdir())
    assert not (tmp_path / "index.html").exists() and not (tmp_path / "reports" / "index.html").exists()


@pytest.mark.slow
def test_a_shards_target_that_reads_as_console_markup_is_shown_under_v(tmp_path):
    """`merge -v` prints each cell's target and variant, fields of a shard from another machine: a target '[/]'
    ended the merge in rich's MarkupError traceback after the report was written."""
    from matrix import results as schema

    shard = schema.load(Path(__file__).parent / "fixtures" / "shard_continuous_mlp.json")
    for cell in shard.cells:
        cell.target = "ort-cpu[/]"
    (tmp_path / "shard").mkdir()
    shard.save(tmp_path / "shard" / "results.json")
    done = run_cli("-v", "merge", tmp_path / "shard", "--out", tmp_path / "merged")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert any(line.startswith("PASS ort-cpu[/] fp32:") for line in done.stderr.splitlines()), done.stderr
