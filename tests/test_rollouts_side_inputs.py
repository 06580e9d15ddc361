"""`--side-input NAME=VALUE`: a policy with an input fed whole beside its observation (a rank-0 `deterministic`
flag, `rng [1]`, silero-vad's rank-0 `sr`) in the matrix and in the loop.

The loop cannot guess a side input's value, the user can: given, it is fed on every step to the float64 reference,
every cell and the --source column alike, and it replaces the seeded value in the observation set, so the parity
rows are judged with it too. Real parts: onnxruntime, the float64 reference and Gymnasium's Pendulum; the
torch.onnx.export'ed flag policy (tests/source_policies.py) with its TorchScript twin as the --source column.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import policies
import rollout_policies
from conftest import load_results
from source_policies import TORCH_FLAG_EXPORT, cached_policies, torch_script_exports

from matrix.errors import InputError
from matrix.inputs import model as model_loader
from matrix.inputs import observations, side_inputs
from matrix.run import rollouts

FAST = ("--iters", "5", "--warmup", "1", "--batch-sizes", "1", "--variants", "fp32", "--targets", "ort-cpu")


@pytest.fixture
def flagged(tmp_path) -> Path:
    """The hand-written pendulum controller beside a rank-0 bool `deterministic`: true swings up, false hangs."""
    return rollout_policies.pendulum_with_flag(tmp_path / "flagged.onnx")


@pytest.fixture
def with_rng(tmp_path) -> Path:
    """obs [batch, 8] beside rng [1] (tests/policies.py): the action is scaled by rng."""
    return policies.save(policies.side_input_policy(), tmp_path, "with_rng")


def _ort_step(path: Path) -> rollouts.Step:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(names, feeds)))


def _returns(path: Path, given: str) -> tuple[list[float], list[float]]:
    """Per-episode returns of onnxruntime and of the float64 reference, the flag given as `given`."""
    info = model_loader.load(path)
    plan = rollouts.plan_for(info, side_inputs.conform(side_inputs.parse([given]), info), env="Pendulum-v1", episodes=2)
    measured, arrays = rollouts.drive(_ort_step(path), plan, lambda progress: None)
    reference = rollouts.reference_rollout(info, plan)
    record = rollouts.summarise(measured, arrays, reference, plan)
    return [e.episode_return for e in record.episodes], [e.reference_return for e in record.episodes]


# --- the value, checked against the input ------------------------------------------------------------

def test_a_value_is_cast_to_the_inputs_dtype_and_shape(flagged, with_rng):
    flag, rng = model_loader.load(flagged), model_loader.load(with_rng)
    assert side_inputs.conform(side_inputs.parse(["deterministic=1"]), flag)["deterministic"] == np.array(True)
    assert side_inputs.conform(side_inputs.parse(["deterministic=false"]), flag)["deterministic"].dtype == np.bool_
    for spec in ("rng=0.5", "rng=[0.5]"):  # one number for a one-element input
        value = side_inputs.conform(side_inputs.parse([spec]), rng)["rng"]
        assert value.dtype == np.float32 and value.tolist() == [0.5]


@pytest.mark.parametrize("policy, spec, words", [
    ("flagged", "deterministic=2", "--side-input 'deterministic': expected true/false (or 1/0); input 'deterministic' is bool [] (one value)"),
    ("flagged", "deterministic=[true]", "a value of shape [1]; input 'deterministic' is bool []"),
    ("flagged", 'deterministic="yes"', "expected a JSON number, true/false or nested lists of them"),
    ("flagged", "deterministic=True", "--side-input 'deterministic': not JSON"),
    ("flagged", "deterministic", "expected NAME=VALUE"),
    ("flagged", "seed=1", "--side-input 'seed': the model has no such input; its inputs fed whole are ['deterministic']"),
    ("flagged", "obs=[0,0,0]", "--side-input 'obs': this input carries the batch (axis 0)"),
    ("with_rng", "rng=[0.5,1]", "a value of shape [2]; input 'rng' is float32 [1]"),
    ("with_rng", "rng=NaN", "holds a non-finite value"),
    ("with_rng", "rng=1e39", "beyond what a float32 holds"),
])
def test_a_bad_value_is_one_line_naming_the_input_and_what_it_expects(policy, spec, words, request, tmp_path,
                                                                       policy_matrix):
    done = policy_matrix([request.getfixturevalue(policy), "--out", tmp_path / "out", "--side-input", spec])
    assert done.returncode == 2 and len(done.lines) == 1 and words in done.lines[0], done.lines[-3:]


@pytest.mark.parametrize("spec, words", [
    # JSON's words for what was typed, not Python's ('None', "{'a': 1}")
    ("deterministic=null", "expected a JSON number, true/false or nested lists of them (got null)"),
    ('deterministic={"a": 1}', 'nested lists of them (got {"a": 1})'),
    ("deterministic=[[1], null]", "nested lists of them (got [[1], null])"),
    # a whole number beyond 64 bits is a number, refused as one, not called "not a number"
    ("deterministic=1180591620717411303424", "expected true/false (or 1/0); input 'deterministic' is bool"),
])
def test_what_was_typed_is_said_in_json(flagged, spec, words):
    with pytest.raises(InputError) as refused:
        side_inputs.conform(side_inputs.parse([spec]), model_loader.load(flagged))
    assert words in str(refused.value), refused.value


def test_a_model_with_no_input_fed_whole_says_so(tmp_path):
    """SB3's PPO exported through a `deterministic` argument traces it away: the export takes obs alone."""
    info = model_loader.load(policies.save(policies.gemm_add_mlp(), tmp_path, "mlp"))
    with pytest.raises(InputError, match="'deterministic': the model has no such input; every input it has carries the batch$"):
        side_inputs.conform(side_inputs.parse(["deterministic=true"]), info)


def test_a_huge_integer_is_refused_by_what_an_integer_input_holds(tmp_path):
    info = model_loader.load(policies.save(policies.vad_with_sample_rate(), tmp_path, "vad"))  # rank-0 int64 `sr`
    with pytest.raises(InputError, match="expected whole numbers a int64 holds"):
        side_inputs.conform(side_inputs.parse([f"sr={2 ** 70}"]), info)


def test_an_integer_input_takes_whole_numbers_it_holds(tmp_path):
    info = model_loader.load(policies.save(policies.vad_with_sample_rate(), tmp_path, "vad"))  # rank-0 int64 `sr`
    assert side_inputs.conform(side_inputs.parse(["sr=16000"]), info)["sr"].dtype == np.int64
    with pytest.raises(InputError, match="expected whole numbers a int64 holds; input 'sr' is int64"):
        side_inputs.conform(side_inputs.parse(["sr=0.5"]), info)
    with pytest.raises(InputError, match="is given twice"):
        side_inputs.parse(["sr=1", "sr=2"])
    with pytest.raises(InputError, match="'state': a recurrent state input"):
        side_inputs.conform(side_inputs.parse(["state=0"]), info)


# --- in the loop -------------------------------------------------------------------------------------

def test_without_a_value_the_loop_refuses_naming_the_option(flagged, tmp_path, policy_matrix):
    done = policy_matrix([flagged, "--out", tmp_path / "out", "--env", "Pendulum-v1"])
    assert done.returncode == 2 and len(done.lines) == 1, done.lines[-3:]
    assert ("the input 'deterministic' (bool [], no batch axis: a side input beside the observation) one value on every "
            "step, which the tool cannot guess: give it with --side-input deterministic=VALUE (e.g. deterministic=true)"
            in done.lines[0])


# A Dict environment one of whose keys is named like the flag: `obs` and `deterministic`, as a wrapper might give both.
DICT_ENV = """
import gymnasium as gym
import numpy as np


class FlagInTheObservation(gym.Env):
    observation_space = gym.spaces.Dict({"obs": gym.spaces.Box(-1, 1, (3,), np.float32),
                                         "deterministic": gym.spaces.MultiBinary(1)})
    action_space = gym.spaces.Box(-2, 2, (1,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, True, {}
"""


@pytest.mark.parametrize("given", [(), ("--side-input", "deterministic=true")], ids=["without", "with-side-input"])
def test_a_dict_key_named_like_a_side_input_gets_one_advice_with_or_without_a_value(flagged, tmp_path, policy_matrix,
                                                                                     given):
    """The key cannot feed an input without a batch axis, and a --side-input value cannot make the key feed it: the
    same one line either way, naming both, not "give --side-input" and then the key mismatch once it is given."""
    (tmp_path / "flag_env.py").write_text(DICT_ENV)
    done = policy_matrix([flagged, "--out", tmp_path / "out", "--env", "flag_env:FlagInTheObservation", *given])
    assert done.returncode == 2 and len(done.lines) == 1, done.lines[-3:]
    assert ("its Dict observation's key 'deterministic' names the model's input 'deterministic', which has no batch "
            "axis (bool [], fed whole beside the observation)") in done.lines[0]
    assert "--side-input" in done.lines[0]


def test_the_given_value_is_fed_on_every_step_to_the_runtime_and_the_reference(flagged):
    """The flag decides the return: true swings up (about -145 a seed), false hangs (about -1000); the runtime and the
    reference fed the same value return the same."""
    swinging, swinging_reference = _returns(flagged, "deterministic=true")
    hanging, hanging_reference = _returns(flagged, "deterministic=false")
    assert np.allclose(swinging, swinging_reference, rtol=1e-5) and np.allclose(hanging, hanging_reference, rtol=1e-5)
    assert np.mean(swinging) > -400 and np.mean(hanging) < -600, (swinging, hanging)


def test_a_replayed_trajectory_feeds_the_value_on_every_step(flagged, tmp_path):
    np.save(tmp_path / "trajectory.npy", np.random.default_rng(0).uniform(-1, 1, (20, 3)).astype(np.float32))
    info = model_loader.load(flagged)
    for given, moves in (("deterministic=true", True), ("deterministic=false", False)):
        plan = rollouts.plan_for(info, side_inputs.conform(side_inputs.parse([given]), info),
                                 trajectory=str(tmp_path / "trajectory.npy"))
        actions, _ = rollouts.replay(_ort_step(flagged), plan)
        assert np.allclose(actions, rollouts.reference_rollout(info, plan).actions, atol=1e-5)
        assert bool(np.abs(actions).max() > 0.1) == moves  # false: no torque on any step


@pytest.mark.parametrize("recorded", [np.array(True), np.ones(20, bool)], ids=["the-value", "every-step"])
def test_a_trajectory_recording_the_side_input_replays_with_the_given_value(flagged, tmp_path, recorded):
    """np.savez(**feeds) keeps every input: the side input beside the observations, once or on every step."""
    np.savez(tmp_path / "trajectory.npz", obs=np.random.default_rng(0).uniform(-1, 1, (20, 3)).astype(np.float32),
             deterministic=recorded)
    info = model_loader.load(flagged)
    plan = rollouts.plan_for(info, side_inputs.conform(side_inputs.parse(["deterministic=true"]), info),
                             trajectory=str(tmp_path / "trajectory.npz"))
    assert set(rollouts.load_trajectory(tmp_path / "trajectory.npz", plan)) == {"obs"}
    actions, _ = rollouts.replay(_ort_step(flagged), plan)
    assert np.abs(actions).max() > 0.1  # true: it swings


def test_a_trajectory_recording_another_value_is_one_line(flagged, tmp_path, policy_matrix):
    np.savez(tmp_path / "trajectory.npz", obs=np.zeros((20, 3), np.float32), deterministic=np.zeros(20, bool))
    done = policy_matrix([flagged, "--out", tmp_path / "out", "--trajectory", tmp_path / "trajectory.npz",
                          "--side-input", "deterministic=true"])
    assert done.returncode == 2 and len(done.lines) == 1, done.lines[-3:]
    assert "holds 'deterministic' = [false, false, false" in done.lines[0]
    assert "but --side-input gives true: give one" in done.lines[0]


def test_a_trajectory_changing_the_side_input_along_its_steps_is_one_line(flagged, tmp_path, policy_matrix):
    np.savez(tmp_path / "trajectory.npz", obs=np.zeros((20, 3), np.float32), deterministic=np.arange(20) < 10)
    done = policy_matrix([flagged, "--out", tmp_path / "out", "--trajectory", tmp_path / "trajectory.npz"])
    assert done.returncode == 2 and len(done.lines) == 1, done.lines[-3:]
    assert "'deterministic' changes along the trajectory" in done.lines[0] and "--side-input" in done.lines[0]


@pytest.mark.parametrize("recorded, words", [
    (np.full(20, 0.5, np.float32), "expected true/false (or 1/0)"),
    (np.full(20, 2, np.int64), "expected true/false (or 1/0)"),
])
def test_a_trajectory_recording_a_value_the_input_cannot_take_names_the_file_not_the_option(flagged, tmp_path,
                                                                                            policy_matrix, recorded,
                                                                                            words):
    """The user gave no --side-input: the value is the trajectory's, and the line named the option all the same."""
    np.savez(tmp_path / "trajectory.npz", obs=np.zeros((20, 3), np.float32), deterministic=recorded)
    done = policy_matrix([flagged, "--out", tmp_path / "out", "--trajectory", tmp_path / "trajectory.npz"])
    assert done.returncode == 2 and len(done.lines) == 1, done.lines[-3:]
    assert done.lines[0] == (f"policy-matrix: error: {tmp_path / 'trajectory.npz'}: 'deterministic': {words}; input "
                             "'deterministic' is bool [] (one value)")


@pytest.mark.slow
def test_a_trajectory_holding_the_only_value_of_the_side_input_gives_it(flagged, tmp_path, policy_matrix):
    """Without --side-input the recorded value is the value, as --obs takes it: fed on every step and in the rows."""
    np.savez(tmp_path / "trajectory.npz", obs=np.random.default_rng(0).uniform(-1, 1, (20, 3)).astype(np.float32),
             deterministic=np.ones(20, bool))
    done = policy_matrix([flagged, *FAST, "--out", tmp_path / "out", "--trajectory", tmp_path / "trajectory.npz"])
    assert done.returncode == 0, done.stderr
    assert observations.read(tmp_path / "out" / "observations.npz")["deterministic"] == np.array(True)
    cell = load_results(tmp_path / "out")["cells"][0]
    assert cell["verdict"] == "PASS" and cell["rollout"]["steps"] == 20 and cell["rollout"]["max_step_drift"] < 1e-5


@pytest.mark.slow
def test_env_runs_with_the_value_and_the_observation_set_holds_it(flagged, tmp_path, policy_matrix):
    out = tmp_path / "out"
    done = policy_matrix([flagged, *FAST, "--out", out, "--env", "Pendulum-v1", "--episodes", "2",
                          "--side-input", "deterministic=true"])
    assert done.returncode == 0, done.stderr
    results = load_results(out)
    cell = results["cells"][0]
    assert cell["verdict"] == "PASS" and cell["rollout"]["mean_return"] > -400, cell["reasons"]
    assert abs(cell["rollout"]["return_delta"]) < 1e-3
    assert results["model"]["observation_kind"] == "visited"  # the side input no longer stands in the way
    assert results["model"]["observation_source"].endswith("; deterministic = true as given")
    assert results["settings"]["rollout"]["side_inputs"] == {"deterministic": True}
    assert observations.read(out / "observations.npz")["deterministic"] == np.array(True)


# --- the matrix's rows -------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_seeded_rows_and_a_recorded_file_without_it_hold_the_given_value(with_rng, tmp_path, policy_matrix):
    seeded = policy_matrix([with_rng, *FAST, "--out", tmp_path / "seeded", "--side-input", "rng=0.25"])
    assert seeded.returncode == 0, seeded.stderr
    assert observations.read(tmp_path / "seeded" / "observations.npz")["rng"].tolist() == [0.25]
    recorded = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    np.save(tmp_path / "obs.npy", recorded)  # the observation alone: the side input comes from the option
    done = policy_matrix([with_rng, *FAST, "--out", tmp_path / "recorded", "--obs", tmp_path / "obs.npy",
                          "--side-input", "rng=0.25"])
    assert done.returncode == 0, done.stderr
    fed = observations.read(tmp_path / "recorded" / "observations.npz")
    assert fed["rng"].tolist() == [0.25] and np.array_equal(fed["obs"], recorded)
    assert load_results(tmp_path / "recorded")["cells"][0]["verdict"] == "PASS"


def test_a_recorded_file_that_holds_another_value_is_refused(with_rng, tmp_path, policy_matrix):
    np.savez(tmp_path / "obs.npz", obs=np.zeros((4, 8), np.float32), rng=np.array([0.5], np.float32))
    done = policy_matrix([with_rng, "--out", tmp_path / "out", "--obs", tmp_path / "obs.npz", "--side-input", "rng=0.25"])
    assert done.returncode == 2 and len(done.lines) == 1, done.lines[-3:]
    assert "holds 'rng' = [0.5], but --side-input gives [0.25]: give one" in done.lines[0]


# --- what to ship ----------------------------------------------------------------------------------

def test_a_training_named_input_with_its_value_given_is_no_blocker_and_the_lint_names_the_value(flagged, tmp_path,
                                                                                             policy_matrix):
    """The no-training-inputs lint catches an export that still takes rng/key/params by mistake; a flag fed on purpose
    with its value given is a deployment input: it stops blocking what to ship, and the lints say the value."""
    given = policy_matrix([flagged, *FAST, "--out", tmp_path / "given", "--side-input", "deterministic=true"])
    assert given.returncode == 0, given.stderr
    lints = {item["id"]: item for item in load_results(tmp_path / "given")["lints"]}
    assert lints["no-training-inputs"]["level"] == "warn"
    assert "['deterministic']" in lints["no-training-inputs"]["message"]
    assert "deterministic = true as given: ship the model with that value" in lints["no-training-inputs"]["message"]
    assert "deterministic = true as given" in lints["side-inputs"]["message"]
    assert "seeded rows give them random values" not in lints["side-inputs"]["message"]
    assert "not deployment-ready" not in given.stderr and "decision ort-cpu: ship" in given.stderr
    guessed = policy_matrix([flagged, *FAST, "--out", tmp_path / "guessed"])
    assert {item["id"]: item for item in load_results(tmp_path / "guessed")["lints"]}["no-training-inputs"]["level"] == "error"
    assert "decision ort-cpu: not deployment-ready (no-training-inputs: " in guessed.stderr


# --- a real export, and its training framework's column ---------------------------------------------------

@pytest.mark.slow
@pytest.mark.coreml_env  # torch lives in the Core ML converter environment
def test_a_torch_export_with_a_rank0_flag_drives_pendulum_and_the_source_gets_the_value(tmp_path, policy_matrix,
                                                                                       monkeypatch):
    """torch.onnx.export wrote `deterministic` as a rank-0 bool beside `obs`: the ONNX policy on ort-cpu, the float64
    reference and the TorchScript source are all fed false (its shifted action), in the parity rows and the episodes."""
    from targets import coreml_conversion
    from targets.isolated_env import env_python

    python = env_python(coreml_conversion.ENV_NAME, coreml_conversion.REQUIREMENTS)
    if python is None:
        pytest.skip("needs the Core ML environment's torch: policy-matrix setup coreml")
    folder = cached_policies("torch-flag", TORCH_FLAG_EXPORT, python, torch_script_exports("flag_policy", TORCH_FLAG_EXPORT))
    for name in ("flag_policy.onnx", "flag_policy.pt"):
        (tmp_path / name).symlink_to(folder / name)
    monkeypatch.chdir(tmp_path)
    done = policy_matrix([tmp_path / "flag_policy.onnx", *FAST, "--out", tmp_path / "out", "--env", "Pendulum-v1",
                          "--episodes", "2", "--side-input", "deterministic=false", "--source", "torchscript:flag_policy.pt",
                          "--source-python", python, "--tolerance", "source:*=1e-5"])
    assert done.returncode == 0, done.stderr
    cells = {cell["target"]: cell for cell in load_results(tmp_path / "out")["cells"]}
    for target in ("ort-cpu", "source"):
        cell = cells[target]
        assert cell["verdict"] == "PASS" and cell["error"] is None, (target, cell["reasons"])
        assert abs(cell["rollout"]["return_delta"]) < 1e-3, (target, cell["rollout"])
    assert cells["source"]["parity"][0]["max_abs"] <= 1e-5
    assert observations.read(tmp_path / "out" / "observations.npz")["deterministic"] == np.array(False)
