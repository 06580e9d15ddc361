"""Observation sets: batching with inputs fed whole, and the checks on a user's file."""

from __future__ import annotations

import re

import numpy as np
import pytest

import policies
import rollout_policies
from matrix.inputs import batch_axes, examples, model, observations
from matrix.errors import InputError


def test_take_tiles_a_small_set_and_leaves_whole_inputs_alone():
    feeds = {"obs": np.arange(6, dtype=np.float32).reshape(3, 2), "rng": np.array([7.0], np.float32)}
    taken = observations.take(feeds, 5, {"obs": 0})
    assert taken["obs"][:, 0].tolist() == [0, 2, 4, 0, 2]
    assert taken["rng"] is feeds["rng"]
    assert taken["obs"].flags["C_CONTIGUOUS"]


def test_take_cuts_each_input_along_its_own_batch_axis():
    feeds = {"obs": np.arange(4.0).reshape(4, 1), "h_in": np.arange(8.0).reshape(1, 4, 2)}
    taken = observations.take(feeds, 2, {"obs": 0, "h_in": 1})
    assert taken["obs"].shape == (2, 1) and taken["h_in"].shape == (1, 2, 2)
    assert taken["h_in"].tolist() == [[[0, 1], [2, 3]]] and taken["h_in"].flags["C_CONTIGUOUS"]


def test_count_ignores_whole_inputs_and_is_one_when_everything_is_whole():
    assert observations.count({"obs": np.zeros((4, 2)), "rng": np.zeros(9)}, {"obs": 0}) == 4
    assert observations.count({"state": np.zeros((2, 5, 3)), "sr": np.array(16000)}, {"state": 1}) == 5
    assert observations.count({"scale": np.float32(2.0)}, {}) == 1
    assert observations.count({"axes": np.zeros(3, np.int64)}, {}) == 1


def test_run_in_batches_chunks_batched_inputs_and_feeds_whole_inputs_to_every_call():
    calls = []

    def run(feeds):
        calls.append({name: array.shape for name, array in feeds.items()})
        return {"y": feeds["obs"].sum(axis=1) * feeds["rng"][0]}

    feeds = {"obs": np.ones((5, 3), np.float32), "rng": np.array([2.0], np.float32)}
    out = observations.run_in_batches(run, feeds, 2, {"obs": 0, "y": 0})
    assert out["y"].tolist() == [6.0] * 5
    assert calls == [{"obs": (2, 3), "rng": (1,)}, {"obs": (2, 3), "rng": (1,)}, {"obs": (1, 3), "rng": (1,)}]


def test_run_in_batches_joins_outputs_along_their_batch_axis():
    """An LSTM's state [layers, batch, hidden]: chunks cut on axis 1 and the next state joined on axis 1."""
    feeds = {"obs": np.arange(5.0).reshape(5, 1), "h_in": np.arange(10.0).reshape(1, 5, 2), "sr": np.array(8000)}
    seen = []

    def run(chunk):
        seen.append({name: array.shape for name, array in chunk.items()})
        return {"action": chunk["obs"] * 2, "h_out": chunk["h_in"] + 1}

    out = observations.run_in_batches(run, feeds, 2, {"obs": 0, "h_in": 1, "action": 0, "h_out": 1})
    assert seen[0] == {"obs": (2, 1), "h_in": (1, 2, 2), "sr": ()} and len(seen) == 3
    assert np.array_equal(out["h_out"], feeds["h_in"] + 1) and np.array_equal(out["action"], feeds["obs"] * 2)


def test_run_in_batches_with_batch_zero_or_only_whole_inputs_is_one_call():
    calls = []

    def run(feeds):
        calls.append(True)
        return dict(feeds)

    feeds = {"obs": np.ones((5, 3))}
    assert observations.run_in_batches(run, feeds, 0, {"obs": 0})["obs"].shape == (5, 3) and len(calls) == 1
    scalar = {"scale": np.float32(3.0)}
    assert observations.run_in_batches(run, scalar, 2, {})["scale"] == 3.0 and len(calls) == 2


def test_side_inputs_are_fed_whole(load_policy):
    model = load_policy(policies.side_input_policy())
    assert model.batch_axes.keys() >= {"obs"} and batch_axes.fed_whole(model) == ["rng"]
    gru = load_policy(policies.gru_cell())
    assert {name: gru.batch_axes[name] for name in ("obs", "h")} == {"obs": 0, "h": 0}


def test_seeded_sets_are_reproducible_and_shaped_like_the_inputs(load_policy):
    model = load_policy(examples.pixel_cnn())
    first, again = observations.seeded(model, 10, seed=3), observations.seeded(model, 10, seed=3)
    assert first["obs"].shape == (10, 3, 32, 32) and first["obs"].dtype == np.float32
    assert np.array_equal(first["obs"], again["obs"])
    assert not np.array_equal(first["obs"], observations.seeded(model, 10, seed=4)["obs"])


# --- a user's file ---------------------------------------------------------------------------------

@pytest.fixture
def mlp(load_policy):
    return load_policy(examples.continuous_mlp())


def test_a_good_npy_loads_as_the_models_dtype(mlp, tmp_path):
    path = tmp_path / "obs.npy"
    np.save(path, np.ones((4, 17), np.float64))
    loaded = observations.load(path, mlp)
    assert loaded["obs"].dtype == np.float32 and loaded["obs"].shape == (4, 17)


@pytest.mark.parametrize("array, words", [
    (np.array([{"a": 1}], dtype=object), "pickled object array: refused"),
    (np.array([["a"] * 17]), "holds unicode strings"),
    (np.ones((2, 17), np.complex64), "holds complex numbers"),
    (np.ones((4, 5), np.float32), "has shape [4, 5], the model expects [N, 17]"),
    (np.ones((0, 17), np.float32), "holds 0 observations"),
])
def test_bad_arrays_are_one_clear_input_error(mlp, tmp_path, array, words):
    path = tmp_path / "obs.npy"
    np.save(path, array, allow_pickle=True)
    with pytest.raises(InputError) as raised:
        observations.load(path, mlp)
    assert words in str(raised.value)


def test_a_nan_is_refused_before_it_is_cast_to_an_integer_input(load_policy, tmp_path):
    """Cast to int64 a NaN became -9223372036854775808, silently: a discrete observation no one recorded."""
    discrete_obs = load_policy(examples.discrete_mlp())
    discrete_obs.inputs[0].dtype = "int64"  # as a Discrete observation space exports it
    rows = np.zeros((4, *discrete_obs.inputs[0].shape[1:]))
    rows[2, 0] = np.nan
    np.save(tmp_path / "obs.npy", rows)
    with pytest.raises(InputError, match="non-finite value at row 2 \\(as float64\\)"):
        observations.load(tmp_path / "obs.npy", discrete_obs)


@pytest.mark.parametrize("flag, words", [
    (np.array(np.nan, np.float32), "'deterministic' holds a non-finite value (as float32)"),
    (np.array(7), "'deterministic' holds 7, which a bool input cannot hold"),
])
def test_a_rank0_input_a_file_gives_is_checked_like_any_other(tmp_path, flag, words):
    """A side input's one value in a recorded file (a rank-0 bool `deterministic` beside the observation, as
    torch.onnx.export writes an actor's flag): NaN and 7 had been cast to true, silently. np.argwhere of a 0-d
    array has no element to count even where it holds."""
    flagged = model.load(rollout_policies.pendulum_with_flag(tmp_path / "flagged.onnx"))
    np.savez(tmp_path / "obs.npz", obs=np.zeros((4, 3), np.float32), deterministic=flag)
    with pytest.raises(InputError, match=re.escape(words)):
        observations.load(tmp_path / "obs.npz", flagged)


def test_a_file_disagreeing_with_the_side_input_option_is_said_in_json(tmp_path):
    """The option takes JSON (deterministic=true): the file's value had been said in numpy's words (False)."""
    flagged = model.load(rollout_policies.pendulum_with_flag(tmp_path / "flagged.onnx"))
    np.savez(tmp_path / "obs.npz", obs=np.zeros((4, 3), np.float32), deterministic=np.array(False))
    with pytest.raises(InputError, match="holds 'deterministic' = false, but --side-input gives true: give one"):
        observations.load(tmp_path / "obs.npz", flagged, side={"deterministic": np.array(True)})


@pytest.mark.parametrize("recorded, words", [
    (np.full((4, 3, 8, 8), 0.64, np.float32), "holds 0.64 at row 0, which a uint8 input cannot hold"),  # [0, 1] floats
    (np.full((4, 3, 8, 8), 300, np.int64), "holds 300 at row 0, which a uint8 input cannot hold"),
])
def test_pixels_a_uint8_input_cannot_hold_are_refused_not_cast(load_policy, tmp_path, recorded, words):
    """SB3's CnnPolicy takes uint8 pixels (it divides by 255 inside): [0, 1] floats were cast to all zeros and 300 to 44,
    silently, and every cell judged on images no one recorded."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Cast", ["obs"], ["action"], to=TensorProto.FLOAT)], "pixels",
                              [helper.make_tensor_value_info("obs", TensorProto.UINT8, ["batch", 3, 8, 8])],
                              [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 3, 8, 8])])
    pixels = load_policy(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    np.save(tmp_path / "obs.npy", recorded)
    with pytest.raises(InputError) as raised:
        observations.load(tmp_path / "obs.npy", pixels)
    assert words in str(raised.value) and "record observations as the policy receives them" in str(raised.value)
    np.save(tmp_path / "obs.npy", np.full((4, 3, 8, 8), 255.0))  # whole numbers in range load as they are
    assert observations.load(tmp_path / "obs.npy", pixels)["obs"].max() == 255


def test_a_trajectory_of_pixels_a_uint8_input_cannot_hold_is_refused(tmp_path):
    from matrix.run.rollouts import ObservationInput, RolloutPlan, load_trajectory

    plan = RolloutPlan(observations=[ObservationInput("obs", [3, 8, 8], "uint8")], action_output="action")
    np.save(tmp_path / "t.npy", np.full((5, 3, 8, 8), 0.5, np.float32))
    with pytest.raises(InputError, match="'obs' holds 0.5 at row 0, which a uint8 input cannot hold"):
        load_trajectory(tmp_path / "t.npy", plan)


def test_a_header_that_declares_more_rows_than_the_file_holds_is_refused(mlp, tmp_path):
    path = tmp_path / "obs.npy"
    np.save(path, np.ones((4, 17), np.float32))
    path.write_bytes(path.read_bytes().replace(b"(4, 17)", b"(9, 17)", 1))  # same header length, more rows
    with pytest.raises(InputError, match="header declares shape"):
        observations.load(path, mlp)


def test_npz_needs_an_array_per_input_with_the_same_rows(load_policy, tmp_path):
    gru = load_policy(policies.gru_cell())
    path = tmp_path / "obs.npz"
    np.savez(path, obs=np.ones((3, 6), np.float32))
    with pytest.raises(InputError, match="no array for model input 'h'"):
        observations.load(path, gru)
    np.savez(path, obs=np.ones((3, 6), np.float32), h=np.ones((2, 16), np.float32))
    with pytest.raises(InputError, match=r"different numbers of observations \('obs': 3 on axis 0, 'h': 2 on axis 0\); "
                                         "where an axis is not the batch, --batch-axis NAME=AXIS names it"):
        observations.load(path, gru)
    single = tmp_path / "obs.npy"
    np.save(single, np.ones((3, 6), np.float32))
    with pytest.raises(InputError, match="use .npz"):
        observations.load(single, gru)


def test_not_a_numpy_file_and_a_missing_file_are_input_errors(mlp, tmp_path):
    path = tmp_path / "obs.npy"
    path.write_text("obs = [1, 2]")
    with pytest.raises(InputError, match="not a readable .npy/.npz"):
        observations.load(path, mlp)
    with pytest.raises(InputError, match="no such observation file"):
        observations.load(tmp_path / "missing.npy", mlp)


def test_save_then_read_round_trips(tmp_path):
    feeds = {"obs": np.arange(6, dtype=np.float32).reshape(3, 2), "rng": np.array([1], np.int64)}
    observations.save(feeds, tmp_path / "o.npz")
    back = observations.read(tmp_path / "o.npz")
    assert back.keys() == feeds.keys() and all(np.array_equal(back[k], feeds[k]) for k in feeds)
    assert [p.name for p in tmp_path.iterdir()] == ["o.npz"]


# --- seeded rows where the graph says the input is pixels -------------------------------------------

@pytest.mark.parametrize("scale_op, divisor, affine, said", [
    ("Mul", 255, "", "Mul by 1/255"), ("Div", 255, "", "Div by 255"),
    ("Div", 127.5, "minus 1", "Div by 127.5"), ("Mul", 127.5, "minus 1", "Mul by 1/127.5"),
    ("Div", 255, "normalize", "Div by 255"),
])
def test_a_float_input_the_graph_scales_from_pixels_first_gets_pixel_values(load_policy, scale_op, divisor, affine, said):
    """SB3's CnnPolicy exported with a float dummy input (its docs' way) divides by 255 inside: N(0, 1) rows became
    images of -0.004..0.004 the policy never sees. Its rows are what a uint8 input gets: whole numbers in [0, 255].
    The same fact where the scaling goes to [-1, 1] (`x / 127.5 - 1`) or torchvision normalizes after it."""
    from matrix.inputs import graph_facts
    from matrix.inputs.observation_sources import choose

    model = load_policy(policies.pixels_scaled_in_graph(scale_op, divisor, affine))
    assert graph_facts.pixel_inputs(model.proto) == {"obs": said}
    rows = observations.seeded(model, 32, seed=0)["obs"]
    assert rows.dtype == np.float32 and rows.min() == 0 and rows.max() == 255 and np.array_equal(rows, rows.round())
    assert rows[0].max() == 0 and rows[1].min() == 255  # the range's ends, as a uint8 input's edge rows
    assert choose(None, None, model, 0).detail == (f"synthetic rows (seed 0: normal samples and edge values; 'obs': whole "
                                                   f"numbers in [0, 255], the pixels its graph scales first ({said})): "
                                                   "not states the policy visits")  # the seed read as the pixels' own


@pytest.mark.parametrize("lookup, said", [
    ("Gather", "the rows of the table 'emb.weight' its graph gathers from"),
    ("OneHot", "the classes of its graph's OneHot (depth 10)"),
])
def test_an_integer_input_the_graph_looks_up_gets_the_tables_indices(load_policy, lookup, said):
    """torch's nn.Embedding of a discrete observation, with either exporter: seeded with [0, 15], the rows past the
    10-row table stopped the run ("the float64 reference could not be computed: IndexError: index 15 is out of
    bounds for axis 0 with size 10"), and ONNX Runtime refuses them too."""
    from matrix.inputs import graph_facts
    from matrix.inputs.observation_sources import choose

    model = load_policy(policies.discrete_observation_looked_up(lookup, rows=10))
    assert graph_facts.index_inputs(model.proto) == {"cell": (10, said)}
    rows = observations.seeded(model, 32, seed=0)["cell"]
    assert rows.dtype == np.int64 and (rows[0], rows[1]) == (0, 9) and rows.max() == 9 and rows.min() == 0
    assert f"'cell': whole numbers in [0, 9], {said}" in choose(None, None, model, 0).detail


def test_a_policy_that_embeds_a_discrete_observation_runs_on_its_seeded_rows(tmp_path, policy_matrix):
    path = policies.save(policies.discrete_observation_looked_up("Gather", rows=10), tmp_path, "embedded")
    done = policy_matrix([path, "--targets", "ort-cpu", "--variants", "fp32", "--out", tmp_path / "out"])
    assert done.returncode == 0, done.lines[-3:]


def test_an_input_used_as_it_is_keeps_normal_samples(load_policy):
    from matrix.inputs import graph_facts

    for proto in (examples.pixel_cnn(), examples.continuous_mlp()):
        model = load_policy(proto)
        assert graph_facts.pixel_inputs(model.proto) == {}
        assert observations.seeded(model, 32, seed=0)["obs"].min() < 0


def test_a_ctrl_c_inside_a_saved_file_is_taken_once_it_is_written(tmp_path, monkeypatch, policy_matrix):
    """A Ctrl-C landing inside zipfile's member write (here: as a member is opened) made zipfile refuse to close
    "while there is an open writing handle": a ValueError's traceback and exit 1 (seen once in ~60 runs interrupted
    as the reference was saved). The interrupt is now taken once the file is written: 'interrupted', exit 130."""
    import signal
    import zipfile

    opened = zipfile._ZipWriteFile.__init__

    def interrupted_while_opening(self, *args, **kwargs):
        signal.raise_signal(signal.SIGINT)
        opened(self, *args, **kwargs)

    monkeypatch.setattr(zipfile._ZipWriteFile, "__init__", interrupted_while_opening)
    done = policy_matrix([examples.path("continuous_mlp"), "--targets", "ort-cpu", "--variants", "fp32",
                          "--out", tmp_path / "out"])
    assert done.returncode == 130 and done.lines == ["policy-matrix: interrupted"], done.lines
    assert observations.read(tmp_path / "out" / "observations.npz")  # written whole before the interrupt was taken
