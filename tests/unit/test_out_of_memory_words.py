"""A runtime's or a library's allocation failure under the memory cap is named as the cap, in its own words."""

import pytest

from matrix.run import guarded


@pytest.mark.parametrize("words", [
    "fp16 conversion failed: MemoryError: ",
    "fp16 conversion failed: EncodeError: Failed to serialize proto",  # onnx.save when protobuf's arena cannot grow
    "[E:onnxruntime:, inference_session.cc] bad_alloc",
])
def test_an_allocation_failure_under_the_cap_names_the_cap(words):
    assert guarded.name_out_of_memory(words, 1 << 20) == f"out of memory (limit 1 MiB): {words}"


def test_without_a_cap_or_an_allocation_failure_the_words_stay_as_they_are():
    assert guarded.name_out_of_memory("EncodeError: Failed to serialize proto", None) == "EncodeError: Failed to serialize proto"
    assert guarded.name_out_of_memory("ValueError: bad axis", 1 << 20) == "ValueError: bad axis"
