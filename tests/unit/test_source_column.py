"""The source column's pure parts: naming a contract difference by fitting, judging the column by the
cell rules, and the report's note on what the column is (matrix/reference/source_fit.py, matrix/reference/source.py)."""

from __future__ import annotations

import json
import sys
import zipfile

import numpy as np
import pytest

from matrix.errors import InputError
from matrix.inputs import observations
from matrix.report import report
from matrix.reference import source, source_runner
from matrix.run.cells import CellOutcome
from matrix.judge.judge import Evidence, Judge
from matrix.run.protocol import Measurement
from matrix.reference.reference import Reference
from matrix.results import RunResults
from matrix.judge.rules import Tolerances
from matrix.reference.source_fit import DIVIDE_255, NORMALIZE, Bounds, divide_255_key, explain, rescale
import policies
from saved import fixture_json

PENDULUM = Bounds(np.array([-2.0]), np.array([2.0]))
TOLERANCE = 1e-4


def _tanh_outputs(rows: int = 64, scale: float = 1.0) -> np.ndarray:
    return np.tanh(np.random.default_rng(0).normal(0, 2, (rows, 1))) * scale


# --- naming a contract difference by fitting -------------------------------------------------------

def test_a_rescale_to_the_action_space_is_named_and_a_clip_is_not():
    reference = _tanh_outputs()
    found = explain(rescale(reference, PENDULUM), reference, TOLERANCE, PENDULUM)
    assert found.transform == "rescale"
    assert found.text == "the source rescales [-1, 1] to the action space [-2, 2]; the ONNX graph does not"


def test_a_clip_to_the_action_space_is_named_when_the_graph_leaves_the_space():
    reference = _tanh_outputs(scale=3.0)  # an unsquashed Gaussian mean, as PPO's documented export returns
    found = explain(np.clip(reference, -2, 2), reference, TOLERANCE, PENDULUM)
    assert found.transform == "clip"
    assert "clips actions to the action space [-2, 2]" in found.text


def test_the_other_direction_says_the_graph_does_it():
    source = _tanh_outputs()
    assert explain(source, rescale(source, PENDULUM), TOLERANCE, PENDULUM).transform == "onnx-rescales"


def test_observation_transforms_are_named_from_the_reference_on_transformed_observations():
    reference, on_pixels = _tanh_outputs(), _tanh_outputs(scale=0.5)
    found = explain(on_pixels, reference, TOLERANCE, PENDULUM, {DIVIDE_255: on_pixels, NORMALIZE: reference})
    assert found.transform == DIVIDE_255 and "divides observations by 255" in found.text


def test_nothing_is_named_when_outputs_agree_or_no_transform_explains_them():
    reference = _tanh_outputs()
    assert explain(reference + 1e-6, reference, TOLERANCE, PENDULUM) is None
    noisy = reference + np.random.default_rng(1).normal(0, 0.1, reference.shape)
    assert explain(noisy, reference, TOLERANCE, PENDULUM, {DIVIDE_255: reference * 0.3}) is None


def test_without_an_action_space_an_affine_map_is_fitted_and_said_as_such():
    reference = _tanh_outputs()
    found = explain(3.0 * reference + 0.5, reference, TOLERANCE)
    assert found.transform == "affine" and "x 3 + 0.5" in found.text


# --- judging the column -----------------------------------------------------------------------------

def _rules(reference: np.ndarray) -> source.Judging:
    judge = Judge(Tolerances.parse([f"source:*={TOLERANCE}"]))
    return source.Judging(host="h", judge=judge, evidence=Evidence(None, Reference({"action": reference}, {})))


def _judged(answers: np.ndarray, reference: np.ndarray, facts: dict | None = None):
    spec = source.SourceSpec("python", "trained_policy:act", sys.executable)
    outcome = CellOutcome(Measurement(stage="done"), {"outputs/action": answers}, 1.0)
    return source.judge(spec, outcome, facts or {}, _rules(reference))


def test_the_column_is_judged_by_the_cell_rules_and_names_the_difference_first():
    reference = _tanh_outputs()
    cell = _judged(rescale(reference, PENDULUM).reshape(len(reference), -1).astype(np.float32), reference,
                   {"action_space": {"low": [-2.0], "high": [2.0]}})
    assert (cell.target, cell.variant, cell.verdict) == ("source", "python", "FAIL")
    assert cell.reasons[0].startswith("export: the source rescales [-1, 1] to the action space [-2, 2]")
    assert cell.reasons[1].startswith("action: drift")


def test_answers_that_fit_no_output_are_a_skip_not_the_exports_verdict():
    reference = _tanh_outputs()
    cell = _judged(np.zeros((len(reference), 2)), reference)
    assert cell.verdict == "SKIP" and not cell.parity
    assert "fit none of the ONNX outputs (action [1])" in cell.reasons[0]


def test_the_report_says_what_the_source_row_is_with_the_users_strings_escaped():
    results = RunResults.model_validate(fixture_json("shard_continuous_mlp.json"))
    results.run_options["source"] = {"source": "python:<script>x</script>", "python": "/usr/bin/python3", "normalize": ""}
    html = report.render_html(results)
    assert "Row <b>source</b>: the policy as its training framework runs it" in html
    assert "<code>python:&lt;script&gt;x&lt;/script&gt;</code>" in html and "<script>x</script>" not in html


@pytest.mark.parametrize("module, keys, expected", [
    ("stable_baselines3.sac.policies", {}, ("stable_baselines3", "SAC")),
    ("stable_baselines3.common.policies", {"clip_range": 0.2}, ("stable_baselines3", "PPO")),
    ("stable_baselines3.common.policies", {}, ("stable_baselines3", "A2C")),
    ("sb3_contrib.tqc.policies", {}, ("sb3_contrib", "TQC")),
])
def test_the_sb3_algorithm_is_read_from_the_zip(tmp_path, module, keys, expected):
    path = tmp_path / "model.zip"
    with zipfile.ZipFile(path, "w") as archive:  # SB3's own layout: a `data` JSON beside the weights
        archive.writestr("data", json.dumps({"policy_class": {"__module__": module}, **keys}))
    assert source_runner.sb3_algorithm(path) == expected


def test_the_source_reads_its_input_by_the_members_exact_name(tmp_path):
    """np.load's `data["a.npy"]` is the member of an input named `a`: an input named `a.npy` beside it was fed
    the other input's rows. The runner, which cannot import the tool, reads the member by its exact name too."""
    path = tmp_path / "observations.npz"
    observations.save({"a": np.zeros((3, 2), np.float32), "a.npy": np.ones((3, 2), np.float32)}, path)
    echo = source_runner.Source(lambda feeds: feeds["a.npy"])
    out = tmp_path / "answers.npz"
    request = {"observations": str(path), "inputs": ["a.npy"], "batch_axes": {"a.npy": 0}, "out": str(out)}
    assert source_runner.predict_file(echo, request)["rows"] == 3
    with np.load(out) as answers:
        np.testing.assert_array_equal(answers["answer/0"], np.ones((3, 2)))


def test_an_input_without_a_batch_axis_goes_whole_to_every_call_and_the_others_a_row_each(tmp_path):
    """A rank-0 `deterministic` beside `obs` is not per row: slicing a row of it raised IndexError, the source
    cell's FAIL; `obs` batched on axis 1 (--batch-axis obs=1) is sliced there."""
    path = tmp_path / "observations.npz"
    observations.save({"obs": np.arange(6, dtype=np.float32).reshape(2, 3), "deterministic": np.float32(1)}, path)
    seen = []
    source = source_runner.Source(lambda feeds: seen.append(feeds) or feeds["obs"] * feeds["deterministic"])
    request = {"observations": str(path), "inputs": ["obs", "deterministic"], "batch_axes": {"obs": 1},
               "out": str(tmp_path / "answers.npz"), "warmup": 1, "iters": 2}
    assert source_runner.predict_file(source, request)["rows"] == 3
    assert [(feeds["obs"].shape, feeds["deterministic"].shape) for feeds in seen] == [((2, 1), ())] * 3
    with np.load(request["out"]) as answers:
        np.testing.assert_array_equal(answers["answer/0"], [[0, 3], [1, 4], [2, 5]])
    assert len(source_runner.time_predict(source, request)["samples_ns"]) == 2


# --- a Dict observation: one array per key ----------------------------------------------------------

def test_a_recurrent_state_is_refused_and_several_observation_inputs_are_not(load_policy):
    with pytest.raises(InputError, match=r"--source does not feed a recurrent policy's state; gru\.onnx carries \['h'\]"):
        source.check_model(load_policy(policies.gru_cell(), "gru"))
    source.check_model(load_policy(policies.side_input_policy(), "side"))  # two inputs, no state: fed as one dict


def test_a_dict_observation_is_normalised_per_key_with_its_statistics(tmp_path):
    """SB3's VecNormalize normalises a Dict observation's norm_obs_keys only; an .npz gives them as mean/KEY, var/KEY."""
    path = tmp_path / "stats.npz"
    np.savez(path, **{"mean/observation": np.array([1.0, 2.0]), "var/observation": np.array([4.0, 16.0])}, clip_obs=10.0)
    stats = source_runner._normalizer(path, ["observation", "desired_goal"])
    feeds = {"observation": np.array([[3.0, 6.0]], np.float32), "desired_goal": np.array([[0.5, 0.5]], np.float32)}
    seen = source_runner.normalized(feeds, stats)
    np.testing.assert_allclose(seen["observation"], [[1.0, 1.0]], rtol=1e-6)
    assert seen["desired_goal"] is feeds["desired_goal"]  # a key without statistics is given as it is
    with pytest.raises(ValueError, match=r"statistics for the keys \['observation'\], which are not the model's "):
        source_runner._normalizer(path, ["obs"])
    np.savez(path, mean=np.zeros(2), var=np.ones(2))
    with pytest.raises(ValueError, match=r"holds one observation's statistics; the model has the observation inputs "):
        source_runner._normalizer(path, ["observation", "desired_goal"])


def test_a_pixel_key_is_left_as_it_is_without_statistics_and_made_float32_with_them(tmp_path):
    """SB3's VecNormalize.normalize_obs: the keys with statistics become float32 ((obs - mean) / sqrt(var + eps),
    clipped), whatever they were; a uint8 image key without statistics (norm_obs_keys without it) stays uint8 pixels,
    which the policy scales itself. Cast back to uint8, the normalised pixels had wrapped ([-1.5, -1, 0, 1.5] -> [255, 0, 0, 1])."""
    image = np.array([[[[0, 64], [128, 255]]]], np.uint8)  # [1, 1, 2, 2]
    feeds = {"image": image, "state": np.array([[3.0, 6.0]], np.float32)}
    state_stats = {"mean/state": np.array([1.0, 2.0]), "var/state": np.array([4.0, 16.0])}
    np.savez(tmp_path / "state.npz", **state_stats)
    seen = source_runner.normalized(feeds, source_runner._normalizer(tmp_path / "state.npz", ["image", "state"]))
    assert seen["image"] is image and seen["state"].dtype == np.float32
    np.savez(tmp_path / "both.npz", **state_stats, **{"mean/image": np.full((1, 2, 2), 128.0),
                                                      "var/image": np.full((1, 2, 2), 64.0 ** 2)}, clip_obs=1.5)
    seen = source_runner.normalized(feeds, source_runner._normalizer(tmp_path / "both.npz", ["image", "state"]))
    assert seen["image"].dtype == np.float32
    np.testing.assert_allclose(seen["image"], [[[[-1.5, -1.0], [0.0, 1.5]]]], rtol=1e-6)  # clipped at clip_obs


def test_one_key_divided_by_255_is_named_by_its_key():
    reference, on_pixels = _tanh_outputs(), _tanh_outputs(scale=0.5)
    transformed = {DIVIDE_255: reference * 0.3, divide_255_key("image"): on_pixels, divide_255_key("state"): reference}
    found = explain(on_pixels, reference, TOLERANCE, PENDULUM, transformed)
    assert found.transform == DIVIDE_255
    assert found.text == "the source divides the observation 'image' by 255; the ONNX graph does not"


def test_the_source_is_called_with_one_array_or_the_dict_of_arrays(tmp_path):
    path = tmp_path / "observations.npz"
    observations.save({"observation": np.arange(6, dtype=np.float32).reshape(3, 2), "goal": np.ones((3, 1), np.float32)}, path)
    out = tmp_path / "answers.npz"
    given = []
    keyed = source_runner.Source(lambda obs: given.append(obs) or obs["observation"].sum(axis=1) + obs["goal"][:, 0])
    source_runner.predict_file(keyed, {"observations": str(path), "inputs": ["observation", "goal"],
                                         "batch_axes": {"observation": 0, "goal": 0}, "out": str(out)})
    assert sorted(given[0]) == ["goal", "observation"] and given[0]["observation"].shape == (1, 2)
    with np.load(out) as answers:
        np.testing.assert_array_equal(answers["answer/0"], [[2.0], [6.0], [10.0]])
