"""Bad input ends in one clear line on stderr and exit code 2, never a traceback. The cases run in this process
(cli.main(), tests/conftest.py's `policy_matrix`); a bad model under `lint` and a usage error run as a user's
process, for its exit code and its stderr (tests/test_hostile_input.py does the same for `run`)."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import CliRun, run_cli
from onnx import TensorProto, helper, numpy_helper

from matrix.inputs.examples import path as example


def _tiny(node: onnx.NodeProto, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["b", 4])], list(initializers),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])


def _missing(tmp: Path) -> Path:
    return tmp / "nope.onnx"


def _not_onnx(tmp: Path) -> Path:
    (tmp / "policy.onnx").write_text("this is a text file, not a protobuf\n")
    return tmp / "policy.onnx"


def _truncated(tmp: Path) -> Path:
    data = example("continuous_mlp").read_bytes()
    (tmp / "cut.onnx").write_bytes(data[: len(data) // 2])
    return tmp / "cut.onnx"


def _custom_domain(tmp: Path) -> Path:
    onnx.save(_tiny(helper.make_node("FancyAct", ["obs"], ["action"], name="fancy", domain="com.example")), tmp / "custom.onnx")
    return tmp / "custom.onnx"


def _external_outside(tmp: Path) -> Path:
    weight = numpy_helper.from_array(np.ones(4, np.float32), "w")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../outside.bin"), ("offset", "0"), ("length", "16")):
        weight.external_data.add(key=key, value=value)
    (tmp.parent / "outside.bin").write_bytes(np.ones(4, np.float32).tobytes())
    onnx.save(_tiny(helper.make_node("Mul", ["obs", "w"], ["action"]), [weight]), tmp / "ext.onnx")
    return tmp / "ext.onnx"


def _type_clash(tmp: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Add", ["obs", "half"], ["action"])], "g",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["b", 4])],
        [numpy_helper.from_array(np.ones(4, np.float64), "half")],  # the NumPy 2 float64 pitfall
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp / "clash.onnx")
    return tmp / "clash.onnx"


BAD_MODELS = {
    "missing file": (_missing, "no such model file"),
    "not onnx": (_not_onnx, "not an ONNX model"),
    "truncated": (_truncated, "not an ONNX model"),
    "unsupported op domain": (_custom_domain, "com.example"),
    "external data outside the folder": (_external_outside, "outside the model's folder"),
    "type clash (full check)": (_type_clash, "not a valid ONNX model"),
}


def test_an_operator_onnx_cannot_evaluate_is_named_in_one_line(tmp_path, policy_matrix):
    """GlobalLpPool has no implementation in onnx's evaluator: the line named it, then listed every operator the
    evaluator has, cut off mid-list, and advised skipping a test in onnx's own backend_reference_test.py."""
    graph = helper.make_graph([helper.make_node("GlobalLpPool", ["obs"], ["action"])], "g",
                              [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["b", 2, 3, 3])],
                              [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["b", 2, 1, 1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "lp.onnx")
    done = policy_matrix([tmp_path / "lp.onnx", "--targets", "ort-cpu", "--variants", "fp32", "--out", tmp_path / "out"])
    _assert_one_line(done, "the float64 reference of lp.onnx could not be computed: onnx's reference evaluator has no "
                           "implementation of operator 'GlobalLpPool'")
    assert done.lines[0].endswith("'GlobalLpPool'")


def _assert_one_line(done: CliRun, expected: str) -> None:
    assert done.returncode == 2, (done.returncode, done.lines[-5:])
    assert len(done.lines) == 1 and expected in done.lines[0], done.lines[-5:]


def _assert_clean_exit_2(done, expected: str) -> None:
    assert "Traceback" not in done.stderr
    _assert_one_line(CliRun(done.returncode, done.stdout, done.stderr), expected)


def _bad_model_args(case, command, tmp_path) -> tuple[list, str]:
    make, expected = BAD_MODELS[case]
    folder = tmp_path / "models"
    folder.mkdir()
    out = ["--out", tmp_path / "out"] if command == "run" else []
    return [command, make(folder), *out], expected


@pytest.mark.parametrize("case", BAD_MODELS)
@pytest.mark.parametrize("command", ["run", "lint"])
def test_bad_model_exits_2_with_one_line(case, command, tmp_path, policy_matrix):
    args, expected = _bad_model_args(case, command, tmp_path)
    _assert_one_line(policy_matrix(args), expected)


@pytest.mark.slow
def test_a_bad_model_under_lint_is_one_line_and_exit_2_from_the_real_process(tmp_path):
    args, expected = _bad_model_args("type clash (full check)", "lint", tmp_path)
    _assert_clean_exit_2(run_cli(*args), expected)


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--targets", "no-such-target"], "unknown target"),
        (["--variants", "fp8"], "unknown variant"),
        (["--precisions", "fp8"], "unknown variant"),
        (["--variants", "fp32", "--precisions", "fp16"], "give one"),
        (["--tolerance", "ort-cpu:int8"], "TARGET:VARIANT=VALUE"),
        (["--batch-sizes", "1,x"], "--batch-sizes"),
        (["--obs", "missing.npy"], "no such observation file"),
        (["--targets", "ort-cpu@1.x"], "is not a release number"),
        (["--targets", "ort-cpu@../../etc"], "is not a release number"),
        (["--targets", "no-such-target@1.20.1"], "unknown target"),
        (["--targets", "coreml@9.0.0"], "cannot be pinned to a release"),
    ],
)
def test_bad_options_exit_2(args, expected, tmp_path, policy_matrix):
    _assert_one_line(policy_matrix([example("continuous_mlp"), "--out", tmp_path, *args]), expected)


@pytest.mark.slow
def test_usage_errors_are_one_line_too():
    _assert_clean_exit_2(run_cli("run"), "Missing argument")


def test_observations_of_the_wrong_shape_exit_2(tmp_path, policy_matrix):
    np.save(tmp_path / "obs.npy", np.zeros((10, 5), np.float32))
    _assert_one_line(policy_matrix([example("continuous_mlp"), "--obs", tmp_path / "obs.npy", "--out", tmp_path / "out"]), "expects")
