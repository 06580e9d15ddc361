"""The shapes real exporters write, fed the way each runtime needs them.

rsl_rl's LSTM actor keeps its state as [num_layers, batch, hidden] (the batch on
axis 1), silero-vad has `state [2, ?, 128]` beside a rank-0 int64 `sr`, skl2onnx
leaves the batch dim unnamed. Each input's batch axis is inferred once and used
by batching, feeding, rollouts, the lints and every target.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import policies
import targets
from source_policies import cached_policies
from matrix.run import action_range, rollouts
from matrix.inputs import batch_axes, model, observations
from matrix.reference import reference
from matrix import messages
from matrix.errors import InputError
from matrix.inputs.graph_facts import StatePair
from matrix.inputs.lint import lint

FAST = ("--n-obs", "16", "--iters", "5", "--warmup", "1", "--variants", "fp32")


@pytest.fixture
def exported(tmp_path_factory) -> dict[str, Path]:
    """Built per test (milliseconds): a module-wide fixture would keep this module's end-to-end runs on one
    pytest-xdist worker (tests/conftest.py)."""
    folder = tmp_path_factory.mktemp("exported")
    return {name: policies.save(getattr(policies, name)(), folder, name)
            for name in ("lstm_actor", "vad_with_sample_rate", "unnamed_batch_regressor")}


def _cells(out: Path) -> dict[str, dict]:
    return {cell["target"]: cell for cell in json.loads((out / "results.json").read_text())["cells"]}


# --- inferred once ----------------------------------------------------------------------------------

def test_an_lstm_state_has_its_batch_on_axis_1_and_pairs_with_its_next_value(exported):
    info = model.load(exported["lstm_actor"])
    assert info.state_pairs == [StatePair("h_in", "h_out", 1), StatePair("c_in", "c_out", 1)]
    assert info.batch_axes == {"obs": 0, "h_in": 1, "c_in": 1, "actions": 0, "h_out": 1, "c_out": 1}
    found = {item.id: item.message for item in lint(info)}
    assert "h_in -> h_out (batch on axis 1), c_in -> c_out (batch on axis 1)" in found["recurrent-state"]
    assert found["symbolic-batch"] == "batch dimension is symbolic on every input and output"
    assert found["side-inputs"] == "every input carries the batch dimension"


def test_at_rsl_rls_fixed_batch_of_1_the_lstm_layout_places_the_state_batch(tmp_path):
    """obs [1, 105], h_in [1, 1, 128]: both axes have size 1; the LSTM's initial_h says axis 1."""
    info = model.load(policies.save(policies.lstm_actor(batch=1), tmp_path, "fixed"))
    assert info.batch_axes["h_in"] == 1 and info.state_pairs[1] == StatePair("c_in", "c_out", 1)
    assert observations.seeded(info, 4, 0)["h_in"].shape == (1, 4, 128)


def test_silero_style_state_and_a_rank0_sample_rate(exported):
    info = model.load(exported["vad_with_sample_rate"])
    assert info.state_pairs == [StatePair("state", "stateN", 1)]  # state -> stateN, batch unnamed, on axis 1
    assert batch_axes.fed_whole(info) == ["sr"]
    feeds = observations.seeded(info, 8, 0)
    assert (feeds["input"].shape, feeds["state"].shape, feeds["sr"].shape) == ((8, 64), (2, 8, 128), ())
    assert observations.count(feeds, info.batch_axes) == 8


def test_batch_axis_given_by_the_user_wins_and_bad_ones_exit_2(exported, policy_matrix):
    info = model.load(exported["lstm_actor"], {"h_in": -1})
    assert "h_in" not in info.batch_axes and info.state_pairs[0] == StatePair("h_in", "h_out", None)
    with pytest.raises(InputError, match="not an input of the model"):
        model.load(exported["lstm_actor"], {"hidden": 1})
    with pytest.raises(InputError, match="has rank 3"):
        model.load(exported["lstm_actor"], {"h_in": 3})
    done = policy_matrix(["lint", exported["lstm_actor"], "--batch-axis", "h_in:1"])
    assert done.returncode == 2 and "expected NAME=AXIS" in "\n".join(done.lines), done.lines


def test_recorded_observations_keep_the_models_layout(exported, tmp_path):
    info = model.load(exported["lstm_actor"])
    path = tmp_path / "recorded.npz"
    np.savez(path, obs=np.ones((5, 105), np.float32), h_in=np.zeros((1, 5, 128), np.float32), c_in=np.zeros((1, 5, 128), np.float32))
    assert observations.load(path, info)["h_in"].shape == (1, 5, 128)
    np.savez(path, obs=np.ones((5, 105), np.float32), h_in=np.zeros((1, 4, 128), np.float32), c_in=np.zeros((1, 5, 128), np.float32))
    with pytest.raises(InputError, match="different numbers of observations"):
        observations.load(path, info)
    np.savez(path, obs=np.ones((5, 105), np.float32), h_in=np.zeros((5, 1, 128), np.float32), c_in=np.zeros((1, 5, 128), np.float32))
    with pytest.raises(InputError, match=r"the model expects \[1, N, 128\]"):
        observations.load(path, info)


def test_rollouts_carry_an_lstm_state_along_its_axis_and_take_an_initial_state(exported, tmp_path):
    plan = rollouts.plan_for(model.load(exported["lstm_actor"]), env="Pendulum-v1")
    assert {s.input: s.fed_shape for s in plan.states} == {"h_in": [1, 1, 128], "c_in": [1, 1, 128]}
    start = tmp_path / "h0.npz"
    np.savez(start, h_in=np.full((1, 128), 0.5, np.float32))  # without its batch of 1
    rollouts.set_initial_state(plan, start)
    state = rollouts.initial_state(plan)
    assert state["h_in"].shape == (1, 1, 128) and float(state["h_in"].max()) == 0.5 and not state["c_in"].any()


def test_an_lstm_policy_drives_episodes_with_its_state_carried_on_axis_1(tmp_path):
    """One Pendulum episode by ORT and by the float64 reference, each carrying h/c [1, 1, 8] from step to step."""
    import onnxruntime as ort

    path = policies.save(policies.lstm_actor(obs_n=3, hidden=8, actions=1), tmp_path, "small_lstm")
    info = model.load(path)
    plan = rollouts.plan_for(info, env="Pendulum-v1", episodes=1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    seen = []

    def step(feeds):
        seen.append(feeds["h_in"].shape)
        return dict(zip(names, session.run(names, feeds)))

    measured, arrays = rollouts.drive(step, plan, lambda progress: None)
    reference = rollouts.reference_rollout(info, plan)
    assert set(seen) == {(1, 1, 8)} and len(seen) == 200
    assert np.allclose(arrays["rollout/0/actions"], reference.episodes[0].actions, atol=1e-4)


def test_a_replayed_trajectory_judges_an_lstm_on_the_states_the_reference_carried(tmp_path, policy_matrix):
    """A trajectory recorded from a Pendulum episode, replayed open loop: each observation row comes with the h/c the
    float64 reference carried into that step, as --env's visited states do (the reference had refused the run:
    "Unable to find input 'h_in'")."""
    import onnxruntime as ort

    path = policies.save(policies.lstm_actor(obs_n=3, hidden=8, actions=1), tmp_path, "small_lstm")
    info = model.load(path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    [episode] = rollouts.run_episodes(lambda feeds: dict(zip(names, session.run(names, feeds))),
                                      rollouts.plan_for(info, env="Pendulum-v1", episodes=1))
    np.save(tmp_path / "trajectory.npy", episode.observations["obs"])  # 200 recorded steps
    out = tmp_path / "out"
    done = policy_matrix([path, "--trajectory", tmp_path / "trajectory.npy", "--targets", "ort-cpu", *FAST, "--out", out])
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["model"]["observation_kind"] == "trajectory" and results["cells"][0]["verdict"] == "PASS"
    feeds = observations.read(out / "observations.npz")
    assert feeds["obs"].shape == (16, 3) and feeds["h_in"].shape == feeds["c_in"].shape == (1, 16, 8)
    steps = [int(np.flatnonzero((episode.observations["obs"] == row).all(axis=1))[0]) for row in feeds["obs"]]
    carried = {"h_in": np.zeros((1, 1, 8), np.float32), "c_in": np.zeros((1, 1, 8), np.float32)}
    for t in range(max(steps) + 1):  # ORT's own replay: the state fed at each recorded step
        for row in [i for i, step in enumerate(steps) if step == t]:
            assert np.allclose(feeds["h_in"][:, row], carried["h_in"][:, 0], atol=1e-5)
            assert np.allclose(feeds["c_in"][:, row], carried["c_in"][:, 0], atol=1e-5)
        outputs = dict(zip(names, session.run(names, {"obs": episode.observations["obs"][t : t + 1], **carried})))
        carried = {"h_in": outputs["h_out"], "c_in": outputs["c_out"]}
    assert np.abs(feeds["h_in"]).max() > 0.01  # not the zeros every step starts from


# --- fed right on every runtime -------------------------------------------------------------------------

@pytest.mark.slow
def test_lstm_actor_passes_on_ort_cpu_and_tract_at_batch_1_and_64(exported, tmp_path, policy_matrix):
    done = policy_matrix(["run", exported["lstm_actor"], "--targets", "ort-cpu,tract", "--batch-sizes", "1,64",
                          *FAST, "--out", tmp_path])
    assert done.returncode == 0, done.stderr
    cells = _cells(tmp_path)
    for target in ("ort-cpu", "tract"):
        cell = cells[target]
        assert cell["verdict"] == "PASS", cell["reasons"]
        assert [stats["batch"] for stats in cell["latency"]] == [1, 64]
        checks = {check["name"]: check["ok"] for check in cell["contract"]}
        assert checks["recurrent state h_in -> h_out"] and checks["recurrent state c_in -> c_out"] and checks["batch 1/2/7"]


@pytest.mark.slow
def test_a_rank0_side_input_and_an_unnamed_batch_run_on_ort_cpu_and_tract(exported, tmp_path, policy_matrix):
    """tract gets input facts from the shapes it is fed: unnamed dims no longer stop it."""
    for name in ("vad_with_sample_rate", "unnamed_batch_regressor"):
        out = tmp_path / name
        done = policy_matrix(["run", exported[name], "--targets", "ort-cpu,tract", "--batch-sizes", "1,7", *FAST,
                              "--out", out])
        assert done.returncode == 0, done.stderr
        for cell in _cells(out).values():
            assert cell["verdict"] == "PASS", (name, cell["target"], cell["reasons"])
        assert "input facts from the fed shapes" in _cells(out)["tract"]["backend"]["detail"]


RSL_RL_LSTM_EXPORT = Path(__file__).parent / "fixtures" / "export_rsl_rl_lstm.py"


def _export_rsl_rl_lstm(folder: Path, python: Path) -> None:
    done = subprocess.run([python, RSL_RL_LSTM_EXPORT, folder / "rsl_rl_actor.onnx"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.coreml_env  # torch lives in the CoreML converter environment
def test_an_lstm_actor_exported_by_torch_passes_on_ort_cpu_tract_and_wasm(tmp_path, policy_matrix):
    from targets import isolated_env
    from targets.coreml_conversion import ENV_NAME, REQUIREMENTS

    # torch exports once per script into the cache; the tool is measured on a copy of that file
    python = isolated_env.env_python(ENV_NAME, REQUIREMENTS)
    exported = cached_policies("rsl-rl-lstm", RSL_RL_LSTM_EXPORT.read_text(), python, _export_rsl_rl_lstm)
    path = Path(shutil.copytree(exported, tmp_path / "export")) / "rsl_rl_actor.onnx"
    info = model.load(path)
    assert info.state_pairs == [StatePair("h_in", "h_out", 1), StatePair("c_in", "c_out", 1)]
    done = policy_matrix(["run", path, "--targets", "ort-cpu,tract,ort-web-wasm", "--batch-sizes", "1,64", *FAST,
                          "--out", tmp_path / "out"])
    assert done.returncode == 0, done.stderr
    for cell in _cells(tmp_path / "out").values():
        assert cell["verdict"] == "PASS", (cell["target"], cell["reasons"])
        assert [stats["batch"] for stats in cell["latency"]] == [1, 64]


@pytest.mark.slow
@pytest.mark.browser
def test_lstm_actor_passes_on_the_browsers_wasm_backend(exported, tmp_path, policy_matrix):
    done = policy_matrix(["run", exported["lstm_actor"], "--targets", "ort-web-wasm", "--batch-sizes", "1,64", *FAST,
                          "--out", tmp_path])
    assert done.returncode == 0, done.stderr
    cell = _cells(tmp_path)["ort-web-wasm"]
    assert cell["verdict"] == "PASS", cell["reasons"]
    assert [stats["batch"] for stats in cell["latency"]] == [1, 64]


# --- outputs that are not tensors ---------------------------------------------------------------------

def test_a_zipmap_output_is_left_out_with_the_fix_named_and_the_dense_output_runs(tmp_path, policy_matrix):
    path = policies.save(policies.zipmap_classifier(), tmp_path, "classifier")
    info = model.load(path)
    assert [spec.name for spec in info.outputs] == ["output_label"]
    assert info.excluded_outputs == {"output_probability": "a sequence of maps"}
    found = {item.id: (item.level, item.message) for item in lint(info)}
    assert found["tensor-outputs"][0] == "warn" and "output_probability is a sequence of maps (ZipMap)" in found["tensor-outputs"][1]
    assert "{'zipmap': False}" in found["tensor-outputs"][1]
    assert policy_matrix(["lint", path]).returncode == 0


def test_a_model_whose_only_output_is_not_a_tensor_is_bad_input(tmp_path, policy_matrix):
    proto = policies.zipmap_classifier()
    del proto.graph.output[0]  # output_label
    proto.graph.node.remove(next(node for node in proto.graph.node if node.op_type == "Identity"))
    path = policies.save(proto, tmp_path, "only_zipmap")
    done = policy_matrix(["lint", path])
    assert done.returncode == 2 and "no output of the model is a tensor" in "\n".join(done.lines), done.lines


@pytest.mark.slow
def test_a_zipmap_classifier_runs_its_dense_output_on_ort_cpu(tmp_path, policy_matrix):
    path = policies.save(policies.zipmap_classifier(), tmp_path, "classifier")
    done = policy_matrix(["run", path, "--targets", "ort-cpu", *FAST, "--out", tmp_path / "out"])
    assert done.returncode == 0, done.stderr
    cell = _cells(tmp_path / "out")["ort-cpu"]
    assert cell["verdict"] == "PASS", cell["reasons"]
    assert [output["output"] for output in cell["parity"]] == ["output_label"]


# --- action range against the environment ----------------------------------------------------------

def _tanh_actor(folder: Path) -> Path:
    """SB3's SAC actor as exported: ends in Tanh ([-1, 1]); SB3 rescales to the env's bounds outside the graph."""
    proto = policies._model(
        [helper.make_node("Gemm", ["obs", "fc_w", "fc_b"], ["mean"]), helper.make_node("Tanh", ["mean"], ["action"])],
        [policies._float("obs", ["batch", 3])], [policies._float("action", ["batch", 1])],
        policies._weights(np.random.default_rng(3), "fc", 3, 1),
    )
    return policies.save(proto, folder, "sac_actor")


def test_a_tanh_policy_driving_a_wider_action_space_gets_an_action_range_lint(tmp_path):
    plan = rollouts.plan_for(model.load(_tanh_actor(tmp_path)), env="Pendulum-v1", episodes=1)
    rollouts.check(plan)
    assert (plan.action_low, plan.action_high) == ([-2.0], [2.0])
    found = action_range.reach_lint(model.load(_tanh_actor(tmp_path)), plan, None)
    assert found.level == "warn" and "reach only [-1, 1] (graph: final Tanh)" in found.message
    assert "Pendulum-v1's action space is [-2, 2]: it covers 50% of it" in found.message

    import rollout_policies

    full = model.load(rollout_policies.pendulum(tmp_path / "pendulum.onnx"))  # 2 * tanh, no bound the graph states
    reference = rollouts.reference_rollout(full, plan)
    assert action_range.reach_lint(full, plan, reference) is None  # its actions spread, they do not pile up inside


def test_observed_actions_that_saturate_inside_the_space_count_as_its_reach(tmp_path):
    plan = rollouts.RolloutPlan(observations=[rollouts.ObservationInput("obs", [3], "float32")], action_output="action",
                                env="Pendulum-v1", action_low=[-2.0], action_high=[2.0])
    actions = np.concatenate([np.full(30, 1.0), np.linspace(-1.0, 1.0, 70)]).reshape(-1, 1)
    saturated = rollouts.ReferenceRollout([rollouts.Episode(0, {"obs": np.zeros((100, 3))}, actions, np.zeros(100), 0, False)])
    found = action_range.reach_lint(model.load(policies.save(policies.unnamed_batch_regressor(), tmp_path, "regressor")), plan, saturated)
    assert found.level == "warn" and "reach only [-2, 1] (observed" in found.message and "covers 75%" in found.message


@pytest.mark.slow
def test_the_action_range_note_reaches_the_lints_and_the_behaviour_section(tmp_path, policy_matrix):
    done = policy_matrix(["run", _tanh_actor(tmp_path), "--targets", "ort-cpu", "--env", "Pendulum-v1", "--episodes", "1",
                          "--batch-sizes", "1", *FAST, "--out", tmp_path / "out"])
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    lints = {item["id"]: item for item in results["lints"]}
    assert lints["action-range"]["level"] == "warn" and "covers 50%" in lints["action-range"]["message"]
    assert "Action range:</b> the policy&#39;s actions reach only [-1, 1]" in (tmp_path / "out" / "index.html").read_text()


# --- hints that are true -----------------------------------------------------------------------------

def test_the_coreml_route_names_the_converter_onnx2torch_lacks_without_an_opset_hint():
    """onnx2torch reports LSTM at its schema version (14 on an opset 17 model) and has no LSTM converter at all."""
    words = ("RuntimeError: NotImplementedError: onnx2torch has no LSTM converter at any opset (Converter is not "
             "implemented (OperationDescription(domain='', operation_type='LSTM', version=14)))")
    line = messages.explain("coreml", words, policies.lstm_actor())
    assert line == ("cause: onnx2torch (the CoreML route's ONNX reader) has no LSTM converter at all: no opset conversion "
                    "makes this graph convert; node: /memory/rnn/LSTM")


@pytest.mark.slow
@pytest.mark.coreml_env
def test_the_lstm_actor_fails_on_the_coreml_route_naming_the_missing_converter(exported, tmp_path):
    from targets.base import PrepareContext
    from targets.paths import cache_dir

    # The shared cache, as tests/test_coreml.py's conversions use it: the converter's refusal of these bytes is kept by
    # content (the model, the pins, the conversion script that writes these words), so it runs again when any of them
    # changes and costs no torch process (~10 CPU s) when none did; test_coreml's refusal test runs it every session.
    info = model.load(exported["lstm_actor"])
    ctx = PrepareContext(onnx_variants={"fp32": info.path}, calibration=observations.seeded(info, 8, 0),
                         batch_axes=info.batch_axes, workdir=tmp_path, cache_dir=cache_dir())
    with pytest.raises(RuntimeError, match="onnx2torch has no LSTM converter at any opset"):
        targets.get("coreml").prepare(ctx, "fp32")


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.tflite_env
@pytest.mark.coreml_env
def test_a_rank0_side_input_model_runs_on_every_linux_target_without_a_tool_crash(exported, tmp_path, policy_matrix):
    """silero-vad's interface on every target: the tool's own steps (feeding, the int8 calibration sets of
    the full-integer LiteRT and Core ML routes, WebGL's fixed-batch copy) never crash on `sr` or the axis-1
    state; what a converter or runtime cannot do is a cell with its own words."""
    linux = "ort-cpu,ort-node,ort-web-wasm,ort-web-webgl,ort-web-webgpu,tract,tflite,tflite-noxnn,tflite-int8-full,coreml"
    done = policy_matrix(["run", exported["vad_with_sample_rate"], "--targets", linux, "--variants", "fp32,int8", "--n-obs", "16",
                          "--iters", "5", "--warmup", "1", "--batch-sizes", "1,7", "--out", tmp_path, "--fail-on", "never"])
    assert done.returncode == 0, done.stderr
    cells = json.loads((tmp_path / "results.json").read_text())["cells"]
    assert {cell["target"] for cell in cells} == set(linux.split(","))
    for cell in cells:
        words = " ".join(cell["reasons"])
        assert "IndexError" not in words and "0-dimensional" not in words and "Traceback" not in words, (cell["target"], words)
    verdicts = {(cell["target"], cell["variant"]): cell["verdict"] for cell in cells}
    for target in ("ort-cpu", "ort-node", "ort-web-wasm", "tract"):
        assert verdicts[(target, "fp32")] == "PASS", (target, verdicts)


@pytest.mark.slow
@pytest.mark.browser
def test_a_zipmap_classifier_runs_its_dense_output_in_node_and_the_browser(tmp_path, policy_matrix):
    """onnxruntime-web cannot read a sequence of maps back: the harness fetches the tensor outputs only."""
    path = policies.save(policies.zipmap_classifier(), tmp_path, "classifier")
    done = policy_matrix(["run", path, "--targets", "ort-node,ort-web-wasm", *FAST, "--out", tmp_path / "out"])
    assert done.returncode == 0, done.stderr
    for cell in _cells(tmp_path / "out").values():
        assert cell["verdict"] == "PASS", (cell["target"], cell["reasons"])
        assert [output["output"] for output in cell["parity"]] == ["output_label"]


def test_tracts_reasons_are_its_own_words_without_the_rust_backtrace(tmp_path):
    from targets.base import Artifact

    path = policies.save(policies.zipmap_classifier(), tmp_path, "classifier")  # tract has no ZipMap
    session = targets.get("tract").open(Artifact(path=path), 1)
    with pytest.raises(RuntimeError) as raised:
        session.run({"float_input": np.ones((2, 4), np.float32)})  # dims unnamed: the plan is made for these shapes
    assert "Unimplemented(ZipMap)" in str(raised.value) and "backtrace" not in str(raised.value).lower()


def test_tract_reads_an_action_cast_to_int64_back_as_the_int64_the_reference_computes(tmp_path):
    """tract's ONNX loader types every Cast to int64 as its TDim, which its Python API does not hand back: a
    discrete action ArgMax -> Cast FAILed 'Unsupported DatumType in the public API TDim' in any graph built so,
    while an action straight from ArgMax (int64 too) passed. tract converts the TDim to int64 exactly."""
    from targets.base import Artifact

    path = policies.save(policies.cast_action_discrete(), tmp_path, "cast_action")
    info = model.load(path)
    feeds = observations.seeded(info, 64, 0)
    with targets.get("tract").open(Artifact(path=path), 1) as session:
        action = session.run(feeds)["action"]
        assert "output 'action' converted to the declared int64" in session.backend().detail
        assert len(session.time(feeds, 1, 3)) == 3  # a timed call reads the action back as run() does
    expected = reference.compute(info, feeds, 0).outputs["action"]
    assert action.dtype == np.int64 and len(np.unique(expected)) > 1
    np.testing.assert_array_equal(action, expected)


def _cast_to_int64_declared(tmp_path: Path, declared: int) -> Path:
    """obs cast to int64, the output declared `declared`: a file onnx's checker refuses, which tract loads."""
    import onnx
    from onnx import TensorProto

    graph = helper.make_graph([helper.make_node("Cast", ["obs"], ["action"], to=TensorProto.INT64)], "cast",
                              [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 2])],
                              [helper.make_tensor_value_info("action", declared, ["batch", 2])])
    path = tmp_path / "cast.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_tract_refuses_to_read_back_an_int64_it_would_have_to_change_to_fit_the_declared_type(tmp_path):
    from onnx import TensorProto
    from targets.base import Artifact

    with targets.get("tract").open(Artifact(path=_cast_to_int64_declared(tmp_path, TensorProto.UINT8)), 1) as session:
        np.testing.assert_array_equal(session.run({"obs": np.array([[0, 255]], np.float32)})["action"], [[0, 255]])
        with pytest.raises(RuntimeError, match="as int64, 2 of its 4 values do not fit the declared uint8"):
            session.run({"obs": np.array([[-1, 2], [256, 3]], np.float32)})


def test_tract_says_so_where_an_output_it_holds_as_tdim_is_declared_no_integer_type(tmp_path):
    from onnx import TensorProto
    from targets.base import Artifact

    with targets.get("tract").open(Artifact(path=_cast_to_int64_declared(tmp_path, TensorProto.FLOAT)), 1) as session:
        with pytest.raises(RuntimeError) as raised:
            session.run({"obs": np.ones((1, 2), np.float32)})
    assert str(raised.value) == ("output 'action': Unsupported DatumType in the public API TDim; the graph declares it "
                                 "float32, not an integer type to read it back as")


def test_an_input_that_is_also_an_output_runs_on_tract(tmp_path, policy_matrix):
    """An export that passes its observation through as an output: tract's loader drops that input's declared
    shape ('Source node without a determined fact. Help: provide explicit input facts'), and the cell FAILed
    on what tract's own examples always do: give it the input facts."""
    import onnx
    from onnx import TensorProto

    obs = helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])
    action = helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Tanh", ["obs"], ["action"])], "passthrough", [obs], [action, obs])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "passthrough.onnx")
    done = policy_matrix(["run", tmp_path / "passthrough.onnx", "--targets", "ort-cpu,tract", "--batch-sizes", "1,7", *FAST,
                          "--out", tmp_path / "out"])
    cells = _cells(tmp_path / "out")
    assert done.returncode == 0 and cells["tract"]["verdict"] == "PASS", cells["tract"]["reasons"]
    assert cells["tract"]["backend"]["detail"] == ("input facts from the fed shapes (an input is also an output, whose "
                                                   "declared shape tract's loader drops)")
