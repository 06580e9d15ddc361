"""Tianshou: its default actor networks (`Net` + `DiscreteActor` with softmax output for CartPole-v1,
`Net` + `ContinuousActorDeterministic` for Pendulum-v1, DDPG's actor) inside its policies
(`DiscreteActorPolicy` with deterministic evaluation, `ContinuousDeterministicPolicy`), fitted to a
controller (seconds). Tianshou documents no ONNX export: the actor network is exported with plain
`torch.onnx.export`, the discrete one with the mode its policy takes (argmax over the softmax). The
policy's `map_action` (clip and rescale to the action space, applied by its Collector) stays outside.

The declarations at the top are read by policy-matrix; the rest runs in the framework's environment.
"""

from pathlib import Path

PACKAGE = "tianshou"
VERSION = "2.0.1"
REQUIREMENTS = ["tianshou=={version}", "onnxscript==0.7.2"]
BASE = "torch"
POLICIES = {"ppo-cartpole": "CartPole-v1", "ddpg-pendulum": "Pendulum-v1"}
EXPORT = "torch.onnx.export of the actor network (Tianshou has no exporter); discrete: argmax of its softmax"
HIDDEN = (64, 64)


def _policy(policy: str):
    import gymnasium as gym
    import torch
    from tianshou.algorithm.modelfree.ddpg import ContinuousDeterministicPolicy
    from tianshou.algorithm.modelfree.reinforce import DiscreteActorPolicy
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.continuous import ContinuousActorDeterministic
    from tianshou.utils.net.discrete import DiscreteActor

    env = gym.make(POLICIES[policy])
    state_shape = env.observation_space.shape
    if policy == "ppo-cartpole":
        actor = DiscreteActor(preprocess_net=Net(state_shape=state_shape, hidden_sizes=HIDDEN), action_shape=2)
        return DiscreteActorPolicy(actor=actor, deterministic_eval=True, action_space=env.action_space,
                                   observation_space=env.observation_space)
    actor = ContinuousActorDeterministic(preprocess_net=Net(state_shape=state_shape, hidden_sizes=HIDDEN), action_shape=1)
    return ContinuousDeterministicPolicy(actor=actor, action_space=env.action_space, observation_space=env.observation_space)


class _Views:
    """The actor as torch.onnx.export sees it (`exported`) and as the controller's labels fit it (`fitted`)."""

    def __init__(self, policy: str, actor):
        import torch

        discrete = policy == "ppo-cartpole"

        class Exported(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.actor = actor

            def forward(self, obs):  # discrete: the policy's mode, the most probable action
                output = self.actor(obs)[0]
                return torch.argmax(output, dim=-1) if discrete else output

        class Fitted(Exported):
            def forward(self, obs):  # discrete: log-probabilities; continuous: [-1, 1] in the controller's units
                output = self.actor(obs)[0]
                return torch.log(output + 1e-8) if discrete else output * PENDULUM_MAX_TORQUE

        self.exported, self.fitted = Exported(), Fitted()


PENDULUM_MAX_TORQUE = 2.0  # the actor ends in tanh ([-1, 1]); the policy's map_action rescales to [-2, 2] outside it


def build(policy: str, folder, seed: int) -> dict:
    import _kit
    import tianshou
    import torch

    torch.manual_seed(seed)
    actor = _policy(policy).actor
    views = _Views(policy, actor)
    task = POLICIES[policy]
    training = _kit.fit_torch(views.fitted, task, seed, logits=views.fitted)
    torch.save(actor.state_dict(), folder / "actor.pt")
    fallbacks: list[str] = []
    documented = {"input_names": ["obs"], "output_names": ["action"], "dynamic_axes": {"obs": {0: "batch"}}}
    path = _kit.torch_export(views.exported.eval(), torch.zeros(1, _kit.OBS_SIZE[task]), folder / "policy.onnx",
                             documented, fallbacks)
    return {"task": task, "training": training, "export_path": path, "fallbacks": fallbacks,
            "version": f"tianshou {tianshou.__version__}, torch {torch.__version__}",
            "source": f"python:{Path(__file__).stem}:act"}


_LOADED = {}


def act(obs):
    """What Tianshou's Collector sends to the environment: the policy's action (deterministic
    evaluation), through `map_action`."""
    import _kit
    import torch
    from tianshou.data import Batch

    if "policy" not in _LOADED:
        chosen = _policy(_kit.read_manifest(__file__)["policy"])
        chosen.actor.load_state_dict(torch.load(Path(__file__).with_name("actor.pt")))
        _LOADED["policy"] = chosen.eval()
    chosen = _LOADED["policy"]
    with torch.no_grad():
        answer = chosen(Batch(obs=obs, info={})).act
    return chosen.map_action(answer.numpy() if hasattr(answer, "numpy") else answer)


if __name__ == "__main__":
    import _kit

    _kit.main(build)
