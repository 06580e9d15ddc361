"""The bundled policies are reproducible and are what they claim to be."""

import numpy as np
import onnxruntime as ort

from matrix.inputs import examples, model


def test_examples_regenerate_byte_for_byte(tmp_path):
    for written in examples.write_all(tmp_path):
        assert written.read_bytes() == examples.path(written.stem).read_bytes(), written.name


def test_continuous_policy_shape_and_bounds():
    info = model.load(examples.path("continuous_mlp"))
    assert [(s.name, s.shape) for s in info.inputs] == [("obs", ["batch", 17])]
    assert [(s.name, s.shape) for s in info.outputs] == [("action", ["batch", 6])]
    session = ort.InferenceSession(str(info.path))
    action = session.run(None, {"obs": np.random.default_rng(0).normal(size=(5, 17)).astype(np.float32)})[0]
    assert action.shape == (5, 6) and np.all(np.abs(action) <= 1)


def test_discrete_policy_returns_int64_indices():
    info = model.load(examples.path("discrete_mlp"))
    assert info.outputs[0].dtype == "int64" and info.metadata["action_n"] == "4"
    session = ort.InferenceSession(str(info.path))
    action = session.run(None, {"obs": np.zeros((3, 8), np.float32)})[0]
    assert action.dtype == np.int64 and action.shape == (3,)


def test_pixel_policy_is_a_cnn():
    info = model.load(examples.path("pixel_cnn"))
    assert info.inputs[0].shape == ["batch", 3, 32, 32]
    assert "Conv" in {node.op_type for node in info.nodes}
