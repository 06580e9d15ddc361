"""A goal-reaching point mass with a Dict observation, as goal-conditioned (HER) environments give it.

The observation is `Dict(observation=[x, y, vx, vy], achieved_goal=[x, y], desired_goal=[gx, gy])`, the
action a force in [-1, 1]^2, the reward minus the distance to the goal; an episode ends at the goal or
after `max_steps`. Plain Gymnasium and numpy, so the CLI can drive it as `--env goal_env:GoalPointMass` from
the folder that holds this file.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ARENA = 1.0
DT = 0.1
GOAL_RADIUS = 0.05


class GoalPointMass(gym.Env):
    action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self, max_steps: int = 50, goal_key: str = "desired_goal"):
        self.max_steps, self.goal_key = max_steps, goal_key  # goal_key: another key than the policy was exported with
        position = spaces.Box(-ARENA, ARENA, (2,), np.float32)
        self.observation_space = spaces.Dict({
            "observation": spaces.Box(np.array([-ARENA, -ARENA, -2, -2], np.float32), np.array([ARENA, ARENA, 2, 2], np.float32)),
            "achieved_goal": position, goal_key: position,
        })

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-ARENA, ARENA, 2).astype(np.float32)
        self.velocity = np.zeros(2, np.float32)
        self.goal = self.np_random.uniform(-ARENA, ARENA, 2).astype(np.float32)
        self.steps = 0
        return self._observation(), {}

    def step(self, action):
        self.velocity = np.clip(self.velocity + DT * np.asarray(action, np.float32), -2, 2).astype(np.float32)
        self.position = np.clip(self.position + DT * self.velocity, -ARENA, ARENA).astype(np.float32)
        self.steps += 1
        distance = float(np.linalg.norm(self.position - self.goal))
        return self._observation(), -distance, distance < GOAL_RADIUS, self.steps >= self.max_steps, {}

    def _observation(self) -> dict:
        return {"observation": np.concatenate([self.position, self.velocity]), "achieved_goal": self.position.copy(),
                self.goal_key: self.goal.copy()}


class NestedGoalPointMass(GoalPointMass):
    """The goals in a Dict inside the Dict: no one array per key to feed."""

    def __init__(self, max_steps: int = 50):
        super().__init__(max_steps)
        goals = spaces.Dict({"achieved_goal": self.observation_space["achieved_goal"],
                             "desired_goal": self.observation_space["desired_goal"]})
        self.observation_space = spaces.Dict({"observation": self.observation_space["observation"], "goals": goals})

    def _observation(self) -> dict:
        flat = super()._observation()
        return {"observation": flat["observation"], "goals": {key: flat[key] for key in ("achieved_goal", "desired_goal")}}
