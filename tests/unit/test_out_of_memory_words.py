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


def test_a_parser_that_cannot_allocate_blames_memory_not_the_file(tmp_path, monkeypatch):
    # protobuf's own words when its arena cannot grow, seen from a variant step under a 1 MiB cap on CI
    from google.protobuf.message import DecodeError

    from matrix.errors import InputError
    from matrix.inputs import model

    def no_arena(serialized):
        raise DecodeError("Error parsing message with type 'onnx.ModelProto': Arena alloc failed")

    monkeypatch.setattr(model.onnx, "load_model_from_string", no_arena)
    with pytest.raises(InputError) as refused:
        model._parse(tmp_path / "policy.onnx", b"")
    assert "out of memory while parsing" in str(refused.value) and "not an ONNX model" not in str(refused.value)
    assert guarded.name_out_of_memory(f"fp16 conversion failed: InputError: {refused.value}", 1 << 20).startswith(
        "out of memory (limit 1 MiB): ")


def test_the_limit_is_said_in_one_unit_by_a_cell_and_by_a_refusal(policy_matrix):
    """A cell said 'out of memory (limit 23.5401 GiB)' and the up-front refusal of the same limit 'above the
    limit 25.3 GB': one unit (--memory-limit's binary ones) and 3 significant digits wherever a limit is named."""
    from matrix import options
    from matrix.inputs.examples import path as example

    limit = options.memory_size("23.5401G")
    assert guarded.name_out_of_memory("MemoryError: ", limit) == "out of memory (limit 23.5 GiB): MemoryError: "
    done = policy_matrix([example("continuous_mlp"), "--memory-limit", "23.5401G", "--n-obs", "100000000000"])
    assert done.returncode == 2 and "above the limit 23.5 GiB" in done.stderr, done.stderr
    assert [options.memory_text(size) for size in (1000 << 20, 1 << 20, 1536, 100)] == ["1000 MiB", "1 MiB", "1.5 KiB", "100 bytes"]
