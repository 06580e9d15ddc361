"""CleanRL-style policies: a plain `nn.Module` per algorithm, as CleanRL's single-file scripts write
them (dqn.py's QNetwork, td3_continuous_action.py's Actor with its action rescale as buffers), exported
with plain `torch.onnx.export`. CleanRL ships no exporter: torch's default is the documented path.

The declarations at the top are read by policy-matrix; the rest runs in the framework's environment.
"""

from pathlib import Path

PACKAGE = "torch"  # CleanRL is a set of scripts, not a package: the version shown is torch's
VERSION = ""  # the base environment's torch
REQUIREMENTS = ["onnxscript==0.7.2"]  # torch's default (dynamo) exporter needs it; torch is the base's
BASE = "torch"
POLICIES = {"dqn-cartpole": "CartPole-v1", "td3-pendulum": "Pendulum-v1"}
EXPORT = "torch.onnx.export of the nn.Module (CleanRL has no exporter of its own)"


def _modules():
    import torch
    from torch import nn

    class QNetwork(nn.Module):
        """dqn.py's network, with the greedy action its evaluation takes (argmax of the Q-values)."""

        def __init__(self):
            super().__init__()
            self.network = nn.Sequential(nn.Linear(4, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 2))

        def forward(self, x):
            return torch.argmax(self.network(x), dim=1)

    class Actor(nn.Module):
        """td3_continuous_action.py's actor: tanh scaled to the action space by registered buffers."""

        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc_mu = nn.Linear(3, 256), nn.Linear(256, 256), nn.Linear(256, 1)
            self.register_buffer("action_scale", torch.tensor([2.0]))
            self.register_buffer("action_bias", torch.tensor([0.0]))

        def forward(self, x):
            x = torch.relu(self.fc2(torch.relu(self.fc1(x))))
            return torch.tanh(self.fc_mu(x)) * self.action_scale + self.action_bias

    return {"dqn-cartpole": QNetwork, "td3-pendulum": Actor}


def build(policy: str, folder, seed: int) -> dict:
    import _kit
    import torch

    torch.manual_seed(seed)
    module = _modules()[policy]()
    task = POLICIES[policy]
    logits = module.network if policy == "dqn-cartpole" else None
    training = _kit.fit_torch(module, task, seed, logits=logits)
    module.eval()
    torch.save(module.state_dict(), folder / "policy.pt")
    fallbacks: list[str] = []
    documented = {"input_names": ["obs"], "output_names": ["action"], "dynamic_axes": {"obs": {0: "batch"}}}
    path = _kit.torch_export(module, torch.zeros(1, _kit.OBS_SIZE[task]), folder / "policy.onnx", documented, fallbacks)
    return {"task": task, "training": training, "export_path": path, "fallbacks": fallbacks,
            "version": f"torch {torch.__version__}", "source": f"torch:{Path(__file__).stem}:load"}


def load():
    """The trained module, as the training code would rebuild it from its checkpoint (the --source)."""
    import _kit
    import torch

    module = _modules()[_kit.read_manifest(__file__)["policy"]]()
    module.load_state_dict(torch.load(Path(__file__).with_name("policy.pt")))
    return module.eval()


if __name__ == "__main__":
    import _kit

    _kit.main(build)
