"""rsl_rl (rsl-rl-lib): its MLP and LSTM actor models (`MLPModel`, `RNNModel`, Gaussian output) on
Pendulum-v1, exported by rsl_rl's own exporter (`OnPolicyRunner.export_policy_to_onnx`: the model's
`as_onnx()` wrapper, opset 18, batch 1). rsl_rl trains on its own vectorised robot environments, not
Gymnasium: the actor is fitted to a controller instead (seconds), so the export is rsl_rl's own.

The declarations at the top are read by policy-matrix; the rest runs in the framework's environment.
"""

from pathlib import Path

PACKAGE = "rsl-rl-lib"
VERSION = "5.5.1"
REQUIREMENTS = ["rsl-rl-lib=={version}"]
BASE = "torch"
POLICIES = {"mlp-pendulum": "Pendulum-v1", "lstm-pendulum": "Pendulum-v1"}
EXPORT = "OnPolicyRunner.export_policy_to_onnx (the model's as_onnx(), opset 18)"
HIDDEN = [64, 64]


def _model(policy: str):
    import torch
    from rsl_rl.models import MLPModel, RNNModel
    from tensordict import TensorDict

    obs = TensorDict({"policy": torch.zeros(1, 3)}, batch_size=[1])
    arguments = {"obs": obs, "obs_groups": {"actor": ["policy"]}, "obs_set": "actor", "output_dim": 1,
                "hidden_dims": HIDDEN, "distribution_cfg": {"class_name": "rsl_rl.modules.GaussianDistribution"}}
    if policy == "lstm-pendulum":
        return RNNModel(**arguments, rnn_type="lstm", rnn_hidden_dim=32)
    return MLPModel(**arguments)


def _deterministic(model, obs):
    """The actor's mean for one step; the LSTM from a zero state (fitting on single states)."""
    import torch

    latent = model.obs_normalizer(obs)
    if hasattr(model, "rnn"):
        zeros = torch.zeros(1, len(obs), model.rnn.rnn.hidden_size)
        latent = model.rnn.rnn(latent.unsqueeze(0), (zeros, zeros))[0].squeeze(0)
    return model.distribution.deterministic_output(model.mlp(latent))


def build(policy: str, folder, seed: int) -> dict:
    from types import SimpleNamespace

    import _kit
    import torch
    from rsl_rl.runners import OnPolicyRunner

    torch.manual_seed(seed)
    model = _model(policy)
    training = _fit(model, seed)
    torch.save(model.state_dict(), folder / "model.pt")
    # rsl_rl's exporter, called as the runner calls it: only `alg.get_policy()` is read from the runner.
    runner = SimpleNamespace(alg=SimpleNamespace(get_policy=lambda: model))
    fallbacks: list[str] = []
    OnPolicyRunner.export_policy_to_onnx(runner, str(folder), "policy.onnx")
    source = "" if policy == "lstm-pendulum" else f"python:{Path(__file__).stem}:act"
    return {"task": POLICIES[policy], "training": training, "export_path": EXPORT, "fallbacks": fallbacks,
            "version": f"rsl-rl-lib {_kit.version('rsl-rl-lib')}, torch {torch.__version__}", "source": source}


def _fit(model, seed: int) -> str:
    """The controller's labels fitted through the actor's deterministic output (its mean)."""
    import _kit
    import torch

    class Mean(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, obs):
            return _deterministic(self.model, obs)

    return _kit.fit_torch(Mean(), "Pendulum-v1", seed)


_LOADED = {}


def act(obs):
    """The MLP actor as rsl_rl's inference policy runs it: the model called on a TensorDict of observations."""
    import _kit
    import torch
    from tensordict import TensorDict

    if "model" not in _LOADED:
        model = _model(_kit.read_manifest(__file__)["policy"])
        model.load_state_dict(torch.load(Path(__file__).with_name("model.pt")))
        _LOADED["model"] = model.eval()
    with torch.no_grad():
        batch = torch.as_tensor(obs, dtype=torch.float32)
        return _LOADED["model"](TensorDict({"policy": batch}, batch_size=[len(batch)])).numpy()


if __name__ == "__main__":
    import _kit

    _kit.main(build)
