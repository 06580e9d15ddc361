"""Keras (3, on TensorFlow): a functional MLP policy (greedy action over its logits on CartPole-v1,
a tanh action scaled to Pendulum-v1's torque), fitted to a controller with `model.fit` (seconds),
exported the way tf2onnx documents it: `tf2onnx.convert.from_keras` first; where Keras 3 breaks it,
a SavedModel (`model.export`) converted by the tf2onnx command line, kept as the fallback it needed.

The declarations at the top are read by policy-matrix; the rest runs in the framework's environment.
"""

import subprocess
import sys
from pathlib import Path

PACKAGE = "tf2onnx"
VERSION = "1.17.0"
REQUIREMENTS = ["tf2onnx=={version}"]  # TensorFlow 2.19 and Keras 3 are the onnx2tf environment's
BASE = "tensorflow"
POLICIES = {"mlp-cartpole": "CartPole-v1", "mlp-pendulum": "Pendulum-v1"}
EXPORT = "tf2onnx.convert.from_keras, else model.export + python -m tf2onnx.convert --saved-model"
HIDDEN = 64
MAX_TORQUE = 2.0


def _model(policy: str):
    """(policy, trainable): the policy outputs the action; the trainable view shares its layers."""
    import keras

    import tensorflow as tf

    class Greedy(keras.layers.Layer):
        """tf.argmax: keras.ops.argmax lowers to Bitcast/BitwiseAnd, which tf2onnx 1.17 leaves unconverted."""

        def call(self, logits):
            return tf.argmax(logits, axis=-1)

    discrete = policy == "mlp-cartpole"
    obs = keras.Input((4 if discrete else 3,), name="obs")
    hidden = keras.layers.Dense(HIDDEN, activation="relu")(obs)
    if discrete:
        logits = keras.layers.Dense(2)(hidden)
        return keras.Model(obs, Greedy()(logits)), keras.Model(obs, logits)
    action = keras.ops.multiply(keras.layers.Dense(1, activation="tanh")(hidden), MAX_TORQUE)
    model = keras.Model(obs, action)
    return model, model


def build(policy: str, folder: Path, seed: int) -> dict:
    import time

    import _kit
    import keras
    import onnx
    import tensorflow as tf
    import tf2onnx

    keras.utils.set_random_seed(seed)
    task = POLICIES[policy]
    model, trainable = _model(policy)
    discrete = task == "CartPole-v1"
    trainable.compile(optimizer=keras.optimizers.Adam(3e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True) if discrete else "mse")
    obs, target = _kit.imitation_data(task, 4096, seed)
    started = time.monotonic()
    history = trainable.fit(obs, target, batch_size=256, epochs=50, verbose=0, shuffle=True)
    training = (f"imitation of a hand-written controller, model.fit 50 epochs of 4096 sampled states "
                f"({time.monotonic() - started:.0f} s, loss {history.history['loss'][-1]:.3g})")
    model.save_weights(folder / "policy.weights.h5")
    fallbacks: list[str] = []
    signature = (tf.TensorSpec((None, _kit.OBS_SIZE[task]), tf.float32, name="obs"),)
    try:
        tf2onnx.convert.from_keras(model, input_signature=signature, output_path=str(folder / "policy.onnx"))
        onnx.checker.check_model(str(folder / "policy.onnx"), full_check=True)  # ops it left unconverted fail here
        path = "tf2onnx.convert.from_keras"
    except Exception as error:  # Keras 3 models lack what from_keras reads: the converter's own words
        fallbacks.append(f"tf2onnx.convert.from_keras failed: {type(error).__name__}: {' '.join(str(error).split())[:200]}")
        model.export(folder / "saved_model")
        command = [sys.executable, "-m", "tf2onnx.convert", "--saved-model", str(folder / "saved_model"),
                   "--output", str(folder / "policy.onnx")]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the tf2onnx command line failed: {done.stderr.strip().splitlines()[-1:]}")
        path = "model.export (SavedModel) + python -m tf2onnx.convert --saved-model"
    return {"task": task, "training": training, "export_path": path, "fallbacks": fallbacks,
            "version": f"tf2onnx {tf2onnx.__version__}, keras {keras.__version__}, tensorflow {tf.__version__}",
            "source": f"python:{Path(__file__).stem}:act"}


_LOADED = {}


def act(obs):
    """The Keras model called on the observations (its weights reloaded), as the training code evaluates it."""
    import _kit
    import numpy as np

    if "model" not in _LOADED:
        model, _ = _model(_kit.read_manifest(__file__)["policy"])
        model.load_weights(Path(__file__).with_name("policy.weights.h5"))
        _LOADED["model"] = model
    return np.asarray(_LOADED["model"](np.asarray(obs, np.float32), training=False))


if __name__ == "__main__":
    import _kit

    _kit.main(build)
