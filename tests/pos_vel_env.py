"""A Dict observation `{pos: [3], vel: [2]}` and a 2-d action in [-1, 1], for assist_fixtures.sb3_multi_input_like
(the inputs of SB3's MultiInputPolicy on such a space). Plain Gymnasium and numpy, driven as `--env
pos_vel_env:PosVel` from the folder that holds this file."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class PosVel(gym.Env):
    observation_space = spaces.Dict({"pos": spaces.Box(-1, 1, (3,), np.float32), "vel": spaces.Box(-5, 5, (2,), np.float32)})
    action_space = spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.steps, self.pos = 0, self.np_random.uniform(-1, 1, 3).astype(np.float32)
        self.vel = np.zeros(2, np.float32)
        return self._observation(), {}

    def step(self, action):
        self.steps += 1
        self.vel = np.clip(np.asarray(action, np.float32) * 2, -5, 5).astype(np.float32)
        self.pos = np.clip(self.pos + 0.1 * np.float32(action[0]), -1, 1).astype(np.float32)
        return self._observation(), -float(np.abs(self.pos).sum()), False, self.steps >= 20, {}

    def _observation(self) -> dict:
        return {"pos": self.pos.copy(), "vel": self.vel.copy()}
