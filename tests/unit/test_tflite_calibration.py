"""onnx2tf's full-integer calibration, as the tflite-int8-full cell says what it cannot do (no conversion runs)."""

from __future__ import annotations

from pathlib import Path

import rollout_policies

from targets.tflite_conversion import calibration_words

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
