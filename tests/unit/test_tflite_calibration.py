"""What onnx2tf's failures say in a tflite cell: its full-integer calibration, its traced errors (no conversion runs)."""

from __future__ import annotations

from pathlib import Path

import rollout_policies

from targets.tflite_conversion import calibration_words
from targets.tflite_convert import error_from_log

LITERT_WORDS = ("ValueError: Cannot set tensor: Got value of type FLOAT32 but expected type BOOL for input 0, name: "
                "serving_default_deterministic:0")


def test_a_bool_input_onnx2tf_cannot_calibrate_is_named_beside_litert_s_words(tmp_path):
    """An SB3 SAC actor exported with its rank-0 `deterministic` flag: tflite-int8-full FAILed on LiteRT's words
    alone, as if the model were broken; onnx2tf's representative dataset casts every input to float32."""
    flagged = rollout_policies.pendulum_with_flag(tmp_path / "flagged.onnx")
    assert calibration_words(LITERT_WORDS, flagged) == (
        f"{LITERT_WORDS} (onnx2tf's int8 calibration feeds every input as float32; this model also takes "
        "'deterministic' (bool), which it cannot calibrate)")
    assert calibration_words("onnx2tf: some other refusal", flagged) == "onnx2tf: some other refusal"


def test_a_model_of_float_inputs_keeps_the_converters_words_alone(tmp_path):
    pendulum = rollout_policies.pendulum(tmp_path / "pendulum.onnx")
    assert calibration_words(LITERT_WORDS, Path(pendulum)) == LITERT_WORDS


# As TensorFlow words an error raised while onnx2tf traces its Keras model (a GRU policy by torch's dynamo exporter).
TRACED = """in user code:

    File "/root/.cache/policy-matrix/envs/onnx2tf-py311/lib/python3.11/site-packages/onnx2tf/onnx2tf.py", line 2617, in None  *
        lambda *inputs : model(inputs)
    File "/root/.cache/policy-matrix/envs/onnx2tf-py311/lib/python3.11/site-packages/tf_keras/src/utils/traceback_utils.py", line 70, in error_handler  **
        raise e.with_traceback(filtered_tb) from None

    ValueError: Exception encountered when calling layer 'tf.compat.v1.squeeze_4' (type TFOpLambda).

    Can not squeeze dim[2], expected a dimension of 1, got 256 for '{{node model_1/tf.compat.v1.squeeze_4}}'

    Call arguments received by layer 'tf.compat.v1.squeeze_4' (type TFOpLambda):
      \u2022 input=tf.Tensor(shape=(1, 1, 256), dtype=float32)
"""


def test_an_error_tensorflow_traced_is_its_own_words_without_the_frames_around_it():
    words = error_from_log("", ValueError(TRACED))
    assert words.startswith("ValueError: Exception encountered when calling layer 'tf.compat.v1.squeeze_4'")
    assert "Can not squeeze dim[2], expected a dimension of 1, got 256" in words
    assert "File " not in words and "Call arguments" not in words
    assert error_from_log("", IndexError("list index out of range")) == "IndexError: list index out of range"
