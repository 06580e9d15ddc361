"""Stable-Baselines3: PPO and DQN on CartPole-v1, SAC on Pendulum-v1, trained briefly with SB3 itself
and exported as its guide ("Exporting models") writes it: the policy (PPO, DQN) or the actor (SAC)
wrapped in a module called with deterministic=True, `th.onnx.export(..., opset_version=17,
input_names=["input"])`, batch 1 and no dynamic axes. The guide names no exporter: torch's default
is tried first and the TorchScript exporter is the fallback it needs.

The declarations at the top are read by policy-matrix; the rest runs in the framework's environment.
"""

from pathlib import Path

PACKAGE = "stable-baselines3"
VERSION = "2.9.2"
REQUIREMENTS = ["stable-baselines3=={version}", "onnxscript==0.7.2"]
BASE = "torch"
POLICIES = {"ppo-cartpole": "CartPole-v1", "dqn-cartpole": "CartPole-v1", "sac-pendulum": "Pendulum-v1"}
EXPORT = "th.onnx.export of OnnxableSB3Policy / the SAC actor, opset 17, input 'input' (SB3's export guide)"
TRAINING = {  # (algorithm, keyword arguments, timesteps): short seeded runs, seconds on an idle core
    "ppo-cartpole": ("PPO", {"n_steps": 256, "batch_size": 64, "n_epochs": 4}, 2048),
    "dqn-cartpole": ("DQN", {"learning_starts": 500, "exploration_fraction": 0.3, "target_update_interval": 250}, 4000),
    "sac-pendulum": ("SAC", {"learning_starts": 200}, 800),
}


def build(policy: str, folder, seed: int) -> dict:
    import time

    import _kit
    import stable_baselines3
    import torch as th
    from stable_baselines3.common.logger import Logger

    class OnnxableSB3Policy(th.nn.Module):
        def __init__(self, policy):
            super().__init__()
            self.policy = policy

        def forward(self, observation):
            return self.policy(observation, deterministic=True)

    class OnnxablePolicy(th.nn.Module):  # the guide's SAC wrapper: the actor alone
        def __init__(self, actor):
            super().__init__()
            self.actor = actor

        def forward(self, observation):
            return self.actor(observation, deterministic=True)

    th.set_num_threads(1)  # seconds of training on a shared machine: one thread, no oversubscription
    algorithm, hyperparameters, steps = TRAINING[policy]
    task = POLICIES[policy]
    started = time.monotonic()
    model = getattr(stable_baselines3, algorithm)("MlpPolicy", task, seed=seed, device="cpu", **hyperparameters)
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's default logger makes /tmp/SB3-<date> even logging nothing
    model.learn(steps)
    training = f"{algorithm} {steps} timesteps ({time.monotonic() - started:.0f} s)"
    model.save(folder / "model.zip")
    model = getattr(stable_baselines3, algorithm).load(folder / "model.zip", device="cpu")
    wrapped = OnnxablePolicy(model.policy.actor) if algorithm == "SAC" else OnnxableSB3Policy(model.policy)
    fallbacks: list[str] = []
    dummy_input = th.randn(1, *model.observation_space.shape)
    path = _kit.torch_export(wrapped, dummy_input, folder / "policy.onnx", {"opset_version": 17, "input_names": ["input"]},
                             fallbacks)
    return {"task": task, "training": training, "export_path": path, "fallbacks": fallbacks,
            "version": f"stable-baselines3 {stable_baselines3.__version__}, torch {th.__version__}", "source": "sb3:model.zip"}


if __name__ == "__main__":
    import _kit

    _kit.main(build)
