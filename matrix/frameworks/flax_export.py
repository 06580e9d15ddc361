"""JAX/Flax: a `flax.nnx` MLP policy (argmax of its logits on CartPole-v1, a tanh action scaled to
Pendulum-v1's torque), fitted to a controller with optax (seconds), exported the way jax2onnx's README
shows: `to_onnx(module, [("B", obs)])` with its defaults (opset 23, a symbolic batch named B).

The declarations at the top are read by policy-matrix; the rest runs in the framework's environment.
"""

from pathlib import Path

PACKAGE = "jax2onnx"
VERSION = "0.17.1"
# The versions pip chose for jax2onnx 0.17.1 on Python 3.11, pinned so the environment is rebuilt the same.
REQUIREMENTS = ["jax2onnx=={version}", "jax==0.10.2", "jaxlib==0.10.2", "flax==0.12.8", "optax==0.2.8"]
BASE = None
POLICIES = {"mlp-cartpole": "CartPole-v1", "mlp-pendulum": "Pendulum-v1"}
EXPORT = "jax2onnx.to_onnx(module, [('B', obs)]) with its defaults"
HIDDEN = 64
MAX_TORQUE = 2.0


def _policy(policy: str, seed: int):
    import jax.numpy as jnp
    from flax import nnx

    discrete = policy == "mlp-cartpole"

    class Policy(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.hidden = nnx.Linear(4 if discrete else 3, HIDDEN, rngs=rngs)
            self.head = nnx.Linear(HIDDEN, 2 if discrete else 1, rngs=rngs)

        def raw(self, obs):
            return self.head(nnx.relu(self.hidden(obs)))

        def __call__(self, obs):
            return jnp.argmax(self.raw(obs), axis=-1) if discrete else MAX_TORQUE * jnp.tanh(self.raw(obs))

    return Policy(nnx.Rngs(seed))


def _fit(model, task: str, seed: int) -> str:
    import time

    import _kit
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    obs, target = _kit.imitation_data(task, 4096, seed)
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)

    def loss_of(module, x, y):
        if task == "CartPole-v1":
            return optax.softmax_cross_entropy_with_integer_labels(module.raw(x), y).mean()
        return jnp.mean((module(x) - y) ** 2)

    @nnx.jit
    def step(module, opt, x, y):
        loss, grads = nnx.value_and_grad(loss_of)(module, x, y)
        opt.update(module, grads)
        return loss

    rows, started, steps = jax.random.PRNGKey(seed), time.monotonic(), 800
    for _ in range(steps):
        rows, key = jax.random.split(rows)
        batch = jax.random.randint(key, (256,), 0, len(obs))
        loss = step(model, optimizer, jnp.asarray(obs)[batch], jnp.asarray(target)[batch])
    return _kit.imitation_line(steps, float(loss), time.monotonic() - started)


def _save(model, path: Path) -> None:
    import jax
    import numpy as np
    from flax import nnx

    leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
    np.savez(path, *[np.asarray(leaf) for leaf in leaves])


def _restore(policy: str, path: Path):
    import jax
    import numpy as np
    from flax import nnx

    model = _policy(policy, 0)
    state = nnx.state(model, nnx.Param)
    with np.load(path) as saved:
        leaves = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    nnx.update(model, jax.tree.unflatten(jax.tree.structure(state), leaves))
    return model


def build(policy: str, folder: Path, seed: int) -> dict:
    import _kit
    import flax
    import jax
    from jax2onnx import to_onnx

    task = POLICIES[policy]
    model = _policy(policy, seed)
    training = _fit(model, task, seed)
    _save(model, folder / "params.npz")
    to_onnx(model, [("B", _kit.OBS_SIZE[task])], return_mode="file", output_path=str(folder / "policy.onnx"),
            input_names=["obs"], output_names=["action"])
    return {"task": task, "training": training, "export_path": EXPORT, "fallbacks": [],
            "version": f"jax2onnx {_kit.version('jax2onnx')}, jax {jax.__version__}, flax {flax.__version__}",
            "source": f"python:{Path(__file__).stem}:act"}


_LOADED = {}


def act(obs):
    """The Flax module called on the observations, as the training code evaluates it."""
    import _kit
    import numpy as np

    if "model" not in _LOADED:
        _LOADED["model"] = _restore(_kit.read_manifest(__file__)["policy"], Path(__file__).with_name("params.npz"))
    return np.asarray(_LOADED["model"](np.asarray(obs, np.float32)))


if __name__ == "__main__":
    import _kit

    _kit.main(build)
