"""Behaviour in the loop for a policy with a Dict observation space: Stable-Baselines3's MultiInputPolicy on a
goal-reaching point mass (tests/goal_env.py: HER's observation / achieved_goal / desired_goal), exported from the
framework's own interpreter as users export it: a wrapper that takes one tensor per key and builds the dict the
policy takes, torch.onnx.export with dynamo=False and the keys as input names. Each Dict key feeds the ONNX input
of the same name; what the rollouts record, sample and replay is one array per input. The --source column runs the
saved checkpoint in that interpreter, SB3's predict taking the dict of arrays keyed like the ONNX inputs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import load_results
from source_policies import sb3_exports

from matrix.errors import InputError
from matrix.frameworks import environments, load
from matrix.inputs import model as model_loader
from matrix.inputs import observations
from matrix.run import rollouts

pytestmark = pytest.mark.slow

GOAL_ENV = Path(__file__).with_name("goal_env.py")
KEYS = ["observation", "achieved_goal", "desired_goal"]
FAST = ("--iters", "5", "--warmup", "1", "--batch-sizes", "1")

EXPORT = '''
import numpy as np
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from goal_env import GoalPointMass

KEYS = ["observation", "achieved_goal", "desired_goal"]


class OnnxableMultiInputPolicy(th.nn.Module):
    """One tensor per Dict key in, the dict the policy takes built inside: ONNX inputs are tensors, named by key."""

    def __init__(self, policy):
        super().__init__()
        self.policy = policy

    def forward(self, observation, achieved_goal, desired_goal):
        obs = {"observation": observation, "achieved_goal": achieved_goal, "desired_goal": desired_goal}
        return self.policy(obs, deterministic=True)[0]


env = GoalPointMass()
model = PPO("MultiInputPolicy", env, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu")
model.learn(64)
with th.no_grad():  # a policy that pushes hard enough to move the point mass (an untrained one barely does)
    model.policy.action_net.weight.mul_(100)
examples = tuple(th.zeros(1, *env.observation_space[key].shape) for key in KEYS)
th.onnx.export(OnnxableMultiInputPolicy(model.policy), examples, "goal_ppo.onnx", opset_version=17, input_names=KEYS,
               output_names=["action"], dynamic_axes={**{key: {0: "batch"} for key in KEYS}, "action": {0: "batch"}},
               dynamo=False)
model.save("goal_ppo.zip")  # the checkpoint --source sb3: loads, pushed weights and all

# VecNormalize statistics of the observation key alone (norm_obs_keys), gathered as training gathers them
statistics = VecNormalize(DummyVecEnv([GoalPointMass]), norm_obs_keys=["observation"])
statistics.seed(0)
statistics.action_space.seed(0)
statistics.reset()
for _ in range(200):
    statistics.step(np.array([statistics.action_space.sample()]))
statistics.save("vecnormalize.pkl")
'''


@pytest.fixture(scope="module")
def exported() -> Path:
    return sb3_exports("sb3-goal-dict", EXPORT, (GOAL_ENV,)) / "goal_ppo.onnx"


@pytest.fixture
def beside_env(tmp_path, monkeypatch) -> Path:
    """The user's folder: the environment module beside them, where `--env goal_env:...` imports it from."""
    shutil.copy(GOAL_ENV, tmp_path / "goal_env.py")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _plan(policy: Path, env: str = "goal_env:GoalPointMass", episodes: int = 3, **settings) -> rollouts.RolloutPlan:
    return rollouts.plan_for(model_loader.load(policy), env=env, episodes=episodes, seed=0, **settings)


def ort_step(path: Path) -> rollouts.Step:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda feeds: {"action": session.run(["action"], feeds)[0]}


def test_each_dict_key_feeds_the_input_of_its_name_and_the_returns_pair_with_the_reference(exported, beside_env):
    plan = _plan(exported)
    assert plan.observation_names == KEYS
    rollouts.check(plan)
    measured, arrays = rollouts.drive(ort_step(exported), plan, lambda progress: None)
    reference = rollouts.reference_rollout(model_loader.load(exported), plan)
    record = rollouts.summarise(measured, arrays, reference, plan)
    returns = [e.episode_return for e in record.episodes]
    assert [e.seed for e in record.episodes] == [0, 1, 2] and len(set(returns)) == 3  # three different episodes
    assert np.allclose(returns, [e.reference_return for e in record.episodes], rtol=1e-5)
    assert record.action_agreement == 1.0 and all(e.divergence_step is None for e in record.episodes)
    for episode in reference.episodes:  # what the policy saw, one array per input, [T, *shape], as the env gave it
        assert {name: values.shape[1:] for name, values in episode.observations.items()} == \
            {"observation": (4,), "achieved_goal": (2,), "desired_goal": (2,)}
        assert np.array_equal(episode.observations["observation"][:, :2], episode.observations["achieved_goal"])
        assert np.ptp(episode.observations["achieved_goal"], axis=0).max() > 0.05  # the point mass moved
        assert len(set(map(tuple, episode.observations["desired_goal"]))) == 1  # one goal per episode


def test_a_key_the_model_has_no_input_for_is_named_with_both_sides(exported, beside_env):
    plan = _plan(exported, env_kwargs={"goal_key": "goal"})
    with pytest.raises(InputError) as refused:
        rollouts.check(plan)
    assert ("its Dict observation has keys ['achieved_goal', 'goal', 'observation'], the model's observation inputs are "
            "['observation', 'achieved_goal', 'desired_goal']: no key for input 'desired_goal', no input for key 'goal' "
            "(each key feeds the input of the same name)") in str(refused.value)


@pytest.mark.parametrize("env, words", [
    ("goal_env:NestedGoalPointMass", "its Dict observation's entry 'goals' is Dict("),
    ("Pendulum-v1", "is one value, but the model has 3 observation inputs ['observation', 'achieved_goal', 'desired_goal']: "
                    "a Dict observation space feeds one input per key"),
])
def test_observations_that_cannot_feed_the_inputs_are_one_line_and_exit_2(exported, beside_env, env, words, policy_matrix):
    done = policy_matrix([exported, "--targets", "ort-cpu", "--env", env, "--out", beside_env / "out"])
    assert done.returncode == 2 and len(done.lines) == 1 and words in done.lines[0], done.lines[-5:]


def _source_cell(policy_matrix, policy: Path, out: Path, *args) -> dict:
    """The --source column beside ort-cpu for SB3's own checkpoint, in the framework's interpreter."""
    done = policy_matrix(["run", policy, *FAST, "--targets", "ort-cpu", "--variants", "fp32", "--env", "goal_env:GoalPointMass",
                          "--episodes", "3", "--source", f"sb3:{policy.with_name('goal_ppo.zip')}",
                          "--source-python", environments.python(load("sb3")), "--out", out, *args])
    assert done.returncode in (0, 1), done.lines[-5:]
    return next(cell for cell in load_results(out)["cells"] if cell["target"] == "source")


def test_the_source_column_predicts_with_the_dict_of_arrays_and_pairs_its_returns(exported, beside_env, policy_matrix):
    """SB3's predict takes the observation dict keyed like the ONNX inputs; the documented export computes what it
    does, and the framework drives the same seeded episodes through the Dict env."""
    cell = _source_cell(policy_matrix, exported, beside_env / "out")
    assert (cell["variant"], cell["verdict"]) == ("sb3", "PASS"), cell["reasons"]
    assert cell["parity"][0]["output"] == "action" and cell["parity"][0]["max_abs"] <= 1e-5
    episodes = cell["rollout"]["episodes"]
    assert [e["seed"] for e in episodes] == [0, 1, 2] and len({e["episode_return"] for e in episodes}) == 3
    assert [e["episode_return"] for e in episodes] == pytest.approx([e["reference_return"] for e in episodes], rel=1e-5)


def test_statistics_of_one_key_outside_the_export_are_named(exported, beside_env, policy_matrix):
    """VecNormalize on a Dict observation normalises its norm_obs_keys only (here 'observation'): the export without
    them is named by the reference on observations normalised per key, the other keys as they are."""
    cell = _source_cell(policy_matrix, exported, beside_env / "out", "--source-normalize",
                        exported.with_name("vecnormalize.pkl"))
    assert cell["reasons"][0].startswith("export: the source normalises observations with its statistics "
                                         "(--source-normalize); the ONNX graph does not (left after it: ")
    assert cell["parity"][0]["max_abs"] > 0.1  # the difference is real, and the fit closes it
    facts = json.loads((beside_env / "out" / "source" / "source.json").read_text())
    assert list(facts["normalizer"]["inputs"]) == ["observation"]


def test_one_key_the_export_scales_is_named_by_its_key(exported, beside_env, policy_matrix):
    """An export that multiplies one key by 255 (a pixel key's /255 left out the other way round): the reference
    on that key alone divided by 255 is what SB3's predict computes."""
    proto = onnx.load(str(exported))
    for node in proto.graph.node:
        node.input[:] = ["desired_goal_pixels" if name == "desired_goal" else name for name in node.input]
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array(255, np.float32), "pixel_scale"))
    proto.graph.node.insert(0, onnx.helper.make_node("Mul", ["desired_goal", "pixel_scale"], ["desired_goal_pixels"]))
    scaled = beside_env / "goal_ppo_scaled.onnx"
    onnx.save(proto, str(scaled))
    shutil.copy(exported.with_name("goal_ppo.zip"), beside_env)
    cell = _source_cell(policy_matrix, scaled, beside_env / "out")
    assert cell["reasons"][0].startswith("export: the source divides the observation 'desired_goal' by 255; the ONNX "
                                         "graph does not (left after it: ")


def test_cli_drives_the_dict_env_and_samples_visited_states_per_input(exported, beside_env, policy_matrix):
    done = policy_matrix(["run", exported, *FAST, "--targets", "ort-cpu", "--precisions", "fp32,int8",
                          "--env", "goal_env:GoalPointMass", "--episodes", "3", "--n-obs", "30", "--out", beside_env / "out"])
    assert done.returncode in (0, 1), done.stderr
    data = load_results(beside_env / "out")
    assert data["model"]["observation_kind"] == "visited"
    cells = {cell["variant"]: cell["rollout"] for cell in data["cells"]}
    fp32, int8 = cells["fp32"], cells["int8"]
    assert [e["seed"] for e in fp32["episodes"]] == [0, 1, 2]
    reference_returns = [e["reference_return"] for e in fp32["episodes"]]
    assert [e["episode_return"] for e in fp32["episodes"]] == pytest.approx(reference_returns, rel=1e-5)
    assert [e["reference_return"] for e in int8["episodes"]] == reference_returns  # paired: the same seeded episodes
    assert int8["action_agreement"] < 1.0  # int8 drifts on its own states, and the loop shows it
    visited = observations.read(beside_env / "out" / "observations.npz")
    assert {name: values.shape for name, values in visited.items()} == {"observation": (30, 4), "achieved_goal": (30, 2),
                                                                       "desired_goal": (30, 2)}
    assert np.array_equal(visited["observation"][:, :2], visited["achieved_goal"])  # the same steps in every input
    reference = observations.read(beside_env / "out" / "reference" / "rollout.npz")
    first_goal = reference["rollout/0/observations/desired_goal"][0]
    assert np.array_equal(visited["desired_goal"][0], first_goal)  # sampled from the reference's own episodes
    assert "### Behaviour (goal\\_env:GoalPointMass" in (beside_env / "out" / "summary.md").read_text()


def test_a_trajectory_replays_one_array_per_input(exported, beside_env, policy_matrix):
    plan = _plan(exported)
    recorded = rollouts.reference_rollout(model_loader.load(exported), plan).episodes[0].observations
    np.savez(beside_env / "trajectory.npz", **recorded)
    data = load_results(_ran(policy_matrix, exported, beside_env / "out", "--trajectory", beside_env / "trajectory.npz"))
    assert data["cells"][0]["rollout"]["mode"] == "open-loop"
    assert len(data["cells"][0]["rollout"]["step_drift"]) == len(recorded["observation"])
    assert data["cells"][0]["rollout"]["max_step_drift"] < 1e-5
    np.save(beside_env / "one.npy", recorded["observation"])
    with pytest.raises(InputError, match=r"one array, but the model has the observation inputs \['observation', "):
        rollouts.load_trajectory(beside_env / "one.npy", plan)
    np.savez(beside_env / "renamed.npz", goal=recorded["desired_goal"], observation=recorded["observation"],
             achieved_goal=recorded["achieved_goal"])
    with pytest.raises(InputError, match=r"holds the arrays \['achieved_goal', 'goal', 'observation'\]"):
        rollouts.load_trajectory(beside_env / "renamed.npz", plan)


def _ran(policy_matrix, policy: Path, out: Path, *args) -> Path:
    done = policy_matrix(["run", policy, *FAST, "--targets", "ort-cpu", "--precisions", "fp32", "--out", out, *args])
    assert done.returncode in (0, 1), done.stderr
    return out


def test_the_plan_travels_as_plain_data(exported):
    plan = _plan(exported)
    again = rollouts.RolloutPlan.from_dict(json.loads(json.dumps(plan.as_dict())))  # as a worker reads spec.json
    assert again == plan and again.observations[2] == rollouts.ObservationInput("desired_goal", [2], "float32")



# --- a pixel key beside a float key: what VecNormalize normalises ------------------------------------------------------

PIXELS_EXPORT = '''
import gymnasium as gym
import numpy as np
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize


class PixelsAndState(gym.Env):
    """A uint8 camera image beside a float proprioceptive state: SB3's MultiInputPolicy scales the image by 255."""

    observation_space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (3, 36, 36), np.uint8),
                                         "state": gym.spaces.Box(-5, 5, (3,), np.float32)})
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


class OnnxablePixelPolicy(th.nn.Module):
    def __init__(self, policy):
        super().__init__()
        self.policy = policy

    def forward(self, image, state):
        return self.policy({"image": image, "state": state}, deterministic=True)[0]


model = PPO("MultiInputPolicy", PixelsAndState(), seed=0, device="cpu")  # seeded weights: nothing is trained
th.onnx.export(OnnxablePixelPolicy(model.policy), (th.zeros(1, 3, 36, 36, dtype=th.uint8), th.zeros(1, 3)),
               "pixels.onnx", opset_version=17, input_names=["image", "state"], output_names=["action"],
               dynamic_axes={"image": {0: "batch"}, "state": {0: "batch"}, "action": {0: "batch"}}, dynamo=False)
model.save("pixels.zip")

# Statistics gathered as training gathers them: of the state alone (norm_obs_keys, as SB3 advises for images), and of
# every key (VecNormalize's default, which turns the image into a float32 Box: a policy trained on it takes no pixels)
for name, keys in (("vec_state.pkl", ["state"]), ("vec_all.pkl", None)):
    statistics = VecNormalize(DummyVecEnv([PixelsAndState]), norm_obs_keys=keys)
    statistics.seed(0)
    statistics.reset()
    for _ in range(50):
        statistics.step(np.array([statistics.action_space.sample()]))
    statistics.save(name)
'''


@pytest.fixture(scope="module")
def pixels() -> Path:
    return sb3_exports("sb3-pixels-dict", PIXELS_EXPORT) / "pixels.onnx"


def _pixel_source_cell(policy_matrix, pixels: Path, out: Path, statistics: str) -> dict:
    done = policy_matrix(["run", pixels, *FAST, "--targets", "ort-cpu", "--variants", "fp32", "--n-obs", "8",
                          "--source", f"sb3:{pixels.with_name('pixels.zip')}", "--source-python",
                          environments.python(load("sb3")), "--source-normalize", pixels.with_name(statistics), "--out", out])
    assert done.returncode in (0, 1), done.lines[-5:]
    return next(cell for cell in load_results(out)["cells"] if cell["target"] == "source")


def test_statistics_of_the_float_key_leave_the_pixels_as_they_are(pixels, tmp_path, policy_matrix):
    """norm_obs_keys=['state']: SB3 normalises the state and gives the policy its uint8 pixels, which it divides by 255;
    the export (no normaliser) is named by the reference on the state normalised, the image as it is."""
    cell = _pixel_source_cell(policy_matrix, pixels, tmp_path / "out", "vec_state.pkl")
    assert cell["reasons"][0].startswith("export: the source normalises observations with its statistics "
                                         "(--source-normalize); the ONNX graph does not (left after it: "), cell["reasons"]
    facts = json.loads((tmp_path / "out" / "source" / "source.json").read_text())
    assert list(facts["normalizer"]["inputs"]) == ["state"]


def test_statistics_of_the_pixel_key_are_refused_for_a_policy_that_takes_pixels(pixels, tmp_path, policy_matrix):
    """VecNormalize's default normalises every key and makes the image a float32 Box: a checkpoint whose space still
    says uint8 pixels was not trained on those statistics (SB3 refuses such an env: 'Observation spaces do not match').
    They had been applied and cast back to uint8, pixels wrapped around, and the column compared that."""
    cell = _pixel_source_cell(policy_matrix, pixels, tmp_path / "out", "vec_all.pkl")
    assert cell["verdict"] == "FAIL" and len(cell["reasons"]) == 1, cell["reasons"]
    assert ("--source-normalize holds statistics for 'image', which the policy takes as image pixels (Box(0, 255, "
            "(3, 36, 36), uint8)): VecNormalize would have made it a float32 Box, so the policy was trained on the "
            "pixels") in cell["reasons"][0]
