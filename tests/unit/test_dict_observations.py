"""A Dict observation in the loop, without a framework: tests/goal_env.py's point mass (HER's observation /
achieved_goal / desired_goal) driven by a hand-written PD controller with one ONNX input per key and a
recurrent step count (rollout_policies.goal_seeker), on onnxruntime and the float64 reference. The same
path as tests/test_dict_rollouts.py's SB3 MultiInputPolicy, where no SB3 environment is built."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import rollout_policies

from matrix.errors import InputError
from matrix.inputs import model as model_loader
from matrix.inputs import observation_sources, observations
from matrix.run import rollouts

ENV = "goal_env:GoalPointMass"  # tests/ is on sys.path, as a user's module beside them is


@pytest.fixture
def seeker(tmp_path):
    return rollout_policies.goal_seeker(tmp_path / "goal_seeker.onnx")


def _step(path) -> rollouts.Step:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(names, feeds)))


def test_each_key_feeds_its_input_the_state_is_carried_and_the_goal_is_reached(seeker):
    info = model_loader.load(seeker)
    plan = rollouts.plan_for(info, env=ENV, episodes=3, seed=0)
    assert plan.observation_names == ["observation", "achieved_goal", "desired_goal"]
    assert [s.input for s in plan.states] == ["h_in"]
    rollouts.check(plan)
    measured, arrays = rollouts.drive(_step(seeker), plan, lambda progress: None, with_states=True)
    episodes = rollouts.episodes_from(arrays, measured)
    for episode in episodes:
        assert episode.length < 50  # reached the goal: the controller saw the goal and where it is
        assert not episode.actions[0].any() and np.abs(episode.actions[1]).max() > 0.1  # h_in went 0, then 1
        assert {name: values.shape for name, values in episode.observations.items()} == {
            "observation": (episode.length, 4), "achieved_goal": (episode.length, 2), "desired_goal": (episode.length, 2)}
    record = rollouts.summarise(measured, arrays, rollouts.reference_rollout(info, plan), plan)
    assert [e.episode_return for e in record.episodes] == pytest.approx([e.reference_return for e in record.episodes], rel=1e-5)
    assert all(e.divergence_step is None for e in record.episodes)
    sampled = observation_sources.visited_feeds(rollouts.visited_runs(measured, arrays, plan), plan, 20)
    assert np.array_equal(sampled["observation"][:, :2], sampled["achieved_goal"])  # one step per row in every input


def test_a_policy_with_a_state_input_is_judged_on_visited_keys_with_the_step_count_it_carried(seeker):
    """The seeker's state counts its steps (h_out = h_in + 1): each sampled row's h_in is the step its keys were
    visited at."""
    info = model_loader.load(seeker)
    plan = rollouts.plan_for(info, env=ENV, episodes=3, seed=0)
    assert observation_sources.choose(None, plan, info, 0).kind == observation_sources.VISITED
    runs = rollouts.visited_runs(*rollouts.reference_drive(info, plan), plan)
    feeds = observation_sources.visited_feeds(runs, plan, 20)
    assert feeds["h_in"].shape == (20, 1) and feeds["h_in"].min() == 0 and feeds["h_in"].max() > 5
    for row, step in enumerate(feeds["h_in"][:, 0].astype(int)):
        assert any(np.allclose(run["desired_goal"][step], feeds["desired_goal"][row])
                   and np.allclose(run["observation"][step], feeds["observation"][row]) for run in runs if step < len(run["h_in"]))


@pytest.mark.parametrize("env, words", [
    ("Pendulum-v1", "is one value, but the model has 3 observation inputs"),
    ("goal_env:NestedGoalPointMass", "nested Dict/Tuple observations are not supported"),
])
def test_observations_that_cannot_feed_the_inputs_are_refused(seeker, env, words):
    with pytest.raises(InputError, match=words):
        rollouts.check(rollouts.plan_for(model_loader.load(seeker), env=env, episodes=1, seed=0))


def test_a_trajectory_holds_one_array_per_input_with_as_many_steps(seeker, tmp_path):
    plan = rollouts.plan_for(model_loader.load(seeker), trajectory=str(tmp_path / "t.npz"))
    steps = {"observation": np.zeros((5, 4), np.float32), "achieved_goal": np.zeros((5, 2)), "desired_goal": np.ones((5, 2))}
    np.savez(tmp_path / "t.npz", **steps)
    loaded = rollouts.load_trajectory(tmp_path / "t.npz", plan)
    assert {name: (values.shape, values.dtype) for name, values in loaded.items()} == {
        "observation": ((5, 4), np.float32), "achieved_goal": ((5, 2), np.float32), "desired_goal": ((5, 2), np.float32)}
    np.savez(tmp_path / "t.npz", **{**steps, "desired_goal": np.ones((4, 2))})
    with pytest.raises(InputError, match="different numbers of steps"):
        rollouts.load_trajectory(tmp_path / "t.npz", plan)
    np.savez(tmp_path / "t.npz", **{**steps, "desired_goal": np.ones((5, 3))})
    with pytest.raises(InputError, match=r"\('desired_goal'\): observations of shape \[3\], the model expects \[2\]"):
        rollouts.load_trajectory(tmp_path / "t.npz", plan)
