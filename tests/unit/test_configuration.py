"""A cell's Configuration: one identity for the grid, resume, merge, compare, the decision and the report."""

from __future__ import annotations

from matrix.configuration import Configuration
from matrix.results import Cell


def test_the_release_is_an_axis_of_its_own_though_results_spell_it_in_the_targets_label():
    pinned = Configuration.of("ort-cpu@1.20.1", "fp32")
    assert (pinned.target, pinned.release, pinned.target_label) == ("ort-cpu", "1.20.1", "ort-cpu@1.20.1")
    assert pinned.key != Configuration.of("ort-cpu", "fp32").key
    assert pinned.first_model_as_exported  # a release of the runtime, the first model as exported


def test_settings_given_in_any_order_are_one_configuration_and_hash_like_a_value():
    one = Configuration.of("ort-cpu", "fp32", settings={"threads": "2", "opt": "basic"})
    other = Configuration("ort-cpu", "fp32", settings={"opt": "basic", "threads": "2"})
    assert one == other and hash(one) == hash(other) and {one: 1}[other] == 1
    assert one.knobs == {"opt": "basic", "threads": "2"} and one.settings_label == "opt=basic,threads=2"


def test_label_axes_and_folder_name_show_only_the_axes_that_are_not_their_defaults():
    plain = Configuration("tflite", "int8")
    assert (plain.label, plain.axes, plain.dir_name) == ("tflite int8", "", "tflite-int8")
    student = Configuration.of("ort-cpu", "fp16", "../student.onnx", {"threads": "2"})
    assert student.label == "ort-cpu fp16 ../student.onnx threads=2"
    assert student.axes == "../student.onnx · threads=2"
    assert student.dir_name.startswith("ort-cpu-fp16-") and "/" not in student.dir_name  # a user's name is never a path
    assert not student.first_model_as_exported and Configuration.of("ort-cpu", "fp16", settings={"threads": "2"}).first_model_as_exported


def test_a_cell_answers_with_its_configuration_and_is_keyed_by_host_and_it():
    cell = Cell(host="h", target="ort-cpu@1.20.1", variant="fp32", verdict="PASS", candidate="s.onnx",
                settings={"threads": "2"})
    assert cell.configuration == Configuration("ort-cpu", "fp32", release="1.20.1", candidate="s.onnx",
                                               settings={"threads": "2"})
    assert cell.key == ("h", *cell.configuration.key)
