"""Option values, matrix.toml tables, target globs and rollout settings: each bad value is one InputError."""

from __future__ import annotations

import math

import click
import numpy as np
import pytest

from matrix.cli import config
from matrix import options
from matrix.run import rollouts
from matrix.errors import InputError
from matrix.judge.rules import ReturnTolerance
from matrix.run.selection import select_targets

KNOWN = ["ort-cpu", "ort-node", "ort-web-wasm", "ort-web-webgl", "ort-web-webgpu", "tflite"]


# --- selection -------------------------------------------------------------------------------------

def test_names_and_globs_keep_the_order_given_without_repeats():
    assert select_targets("tflite,ort-web-*,ort-web-wasm", "", KNOWN) == ["tflite", "ort-web-wasm", "ort-web-webgl", "ort-web-webgpu"]
    assert select_targets("all", "", KNOWN) == KNOWN


def test_skip_globs_remove_targets():
    assert select_targets("all", "ort-web-*, tflite", KNOWN) == ["ort-cpu", "ort-node"]
    assert select_targets("ort-*", "*-webgpu", KNOWN) == ["ort-cpu", "ort-node", "ort-web-wasm", "ort-web-webgl"]


@pytest.mark.parametrize("spec, skip, words", [
    ("nope", "", "--targets: unknown target 'nope'"),
    ("nope-*", "", "--targets: no target matches 'nope-*'"),
    ("all", "ort-cpux", "--skip: unknown target 'ort-cpux'"),
    ("ort-cpu", "ort-*", "leaves no target to run"),
])
def test_a_selection_that_names_nothing_is_refused(spec, skip, words):
    with pytest.raises(InputError, match="known: ort-cpu" if "leaves" not in words else "leaves") as raised:
        select_targets(spec, skip, KNOWN)
    assert words in str(raised.value)


# --- option values ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, size", [("4G", 4 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29), ("67108864", 64 << 20)])
def test_memory_sizes(text, size):
    assert options.memory_size(text) == size


@pytest.mark.parametrize("text, words", [("lots", "expected a size"), ("1M", "at least 64M"), ("-4G", "expected a size")])
def test_bad_memory_sizes(text, words):
    with pytest.raises(InputError, match=words):
        options.memory_size(text)


def test_number_options_name_the_option_and_the_bound():
    assert options.at_least(1, 1, "--iters") == 1
    with pytest.raises(InputError, match="--iters 0: must be at least 1"):
        options.at_least(0, 1, "--iters")
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(InputError, match="--timeout .*above 0"):
            options.seconds(bad, "--timeout")
    assert options.non_negative(0.0, "--tie-margin") == 0.0
    for bad in (-1e-9, math.nan):
        with pytest.raises(InputError, match="--tie-margin"):
            options.non_negative(bad, "--tie-margin")


@pytest.mark.parametrize("value, number", [(0, 0.0), ("1e-3", 1e-3), (math.inf, math.inf)])
def test_tolerance_values(value, number):
    assert options.tolerance_value(value, "x") == number


@pytest.mark.parametrize("value", [math.nan, "nan", -1, True, "x", [1], None])
def test_tolerance_values_that_would_hide_a_fail_are_refused(value):
    with pytest.raises(InputError, match="tolerance"):
        options.tolerance_value(value, "where")


@pytest.mark.parametrize("key", ["ort-cpu:int8", "ort-cpu:*", "*:fp16", "fp16", "tflite"])
def test_tolerance_keys_that_match_a_cell(key):
    options.tolerance_key(key, KNOWN, ("fp32", "fp16", "int8"), "--tolerance")


@pytest.mark.parametrize("key, words", [
    ("*:*", "'\\*:\\*' matches nothing"), ("nope:fp32", "no target 'nope'"), ("ort-cpu:fp8", "no variant 'fp8'"),
    ("fp8", "matches no target or variant"),
])
def test_tolerance_keys_that_match_nothing(key, words):
    with pytest.raises(InputError, match=words):
        options.tolerance_key(key, KNOWN, ("fp32", "fp16", "int8"), "--tolerance")



# --- matrix.toml -----------------------------------------------------------------------------------

@click.command()
@click.option("--targets", default="all")
@click.option("--iters", type=int, default=200)
@click.option("--obs", type=click.Path())
@click.option("--env-kwargs", default="")
@click.option("--config", type=click.Path())
@click.option("--tolerance", multiple=True)
def _run(**_):
    """Stands in for `run`: default_map reads only the command's option names."""


def test_config_values_become_option_defaults(tmp_path):
    table = {"targets": ["ort-cpu", "ort-web-*"], "iters": 50, "obs": "recorded.npy", "env-kwargs": {"g": 9.8}}
    defaults = config.default_map(_run, tmp_path / "matrix.toml", table)
    assert defaults == {"targets": "ort-cpu,ort-web-*", "iters": 50, "obs": str(tmp_path / "recorded.npy"),
                        "env_kwargs": '{"g": 9.8}'}


def _repeatable_run_options() -> list[str]:
    from matrix.cli.cli import run
    return sorted(flag[2:] for param in run.params if isinstance(param, click.Option) and param.multiple
                  for flag in param.opts if flag.startswith("--") and flag != "--tolerance")


def test_every_repeatable_option_takes_one_value_as_a_string(tmp_path):
    """`side-input = "deterministic=true"` is one value, as on the command line: click itself refused it
    ("Value must be an iterable")."""
    from matrix.cli.cli import run
    keys = _repeatable_run_options()
    assert {"side-input", "batch-axis", "settings", "budget", "candidate"} <= set(keys)
    defaults = config.default_map(run, tmp_path / "matrix.toml", {key: "x=1" for key in keys})
    context = run.make_context("run", ["policy.onnx"], default_map=defaults, resilient_parsing=True)
    for key in keys:
        param = next(p for p in run.params if f"--{key}" in p.opts)
        value = param.type_cast_value(context, param.get_default(context))  # what click does with a default
        assert len(value) == 1 and str(value[0]).endswith("x=1"), (key, value)


@pytest.mark.parametrize("key", ["side-input", "batch-axis", "candidate"])
@pytest.mark.parametrize("value", [5, True, 1.5])
def test_a_repeatable_option_of_the_wrong_type_names_its_key(tmp_path, key, value):
    from matrix.cli.cli import run
    with pytest.raises(InputError, match=f"matrix.toml: {key} = .*: expected a string"):
        config.default_map(run, tmp_path / "matrix.toml", {key: value})


@pytest.mark.parametrize("key", ["itres", "config"])
def test_unknown_or_file_only_keys_are_refused(tmp_path, key):
    with pytest.raises(InputError, match=f"unknown setting '{key}'"):
        config.default_map(_run, tmp_path / "matrix.toml", {key: 1})


def test_tolerance_tables_are_validated(tmp_path):
    path = tmp_path / "matrix.toml"
    assert config.tolerances({"tolerance": {"ort-cpu:int8": 0.3}}, path) == {"ort-cpu:int8": 0.3}
    with pytest.raises(InputError, match="must be a table"):
        config.tolerances({"tolerance": 5}, path)
    with pytest.raises(InputError, match=r"\[tolerance\] 'fp16': tolerance 'x' is not a number"):
        config.tolerances({"tolerance": {"fp16": "x"}}, path)


def test_unreadable_toml_is_one_input_error(tmp_path):
    path = tmp_path / "matrix.toml"
    path.write_text("iters = \n")
    with pytest.raises(InputError, match="cannot read the config"):
        options.read_toml(path)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(InputError, match="not UTF-8"):
        options.read_toml(path)


# --- rollout settings and comparisons --------------------------------------------------------------

@pytest.mark.parametrize("text, value, relative", [("0.05", 0.05, True), ("5%", 0.05, True), (" abs:10 ", 10.0, False),
                                                    ("0", 0.0, True), ("1", 1.0, True), ("250%", 2.5, True)])
def test_return_tolerances(text, value, relative):
    tolerance = ReturnTolerance.parse(text)
    assert tolerance.value == pytest.approx(value) and tolerance.relative is relative


@pytest.mark.parametrize("text", ["five", "-1", "abs:", "nan", "inf", "abs:-2%"])
def test_bad_return_tolerances(text):
    with pytest.raises(InputError, match="--return-tolerance"):
        ReturnTolerance.parse(text)


def test_a_bare_return_tolerance_above_one_is_refused_with_both_meanings():
    """`--return-tolerance 5` used to mean 500 %: now it is bad input that says how to write either meaning."""
    with pytest.raises(InputError, match=r"at most 1\); write 5% for a percentage or abs:5 in return units"):
        ReturnTolerance.parse("5")


def test_divergence_is_the_first_step_beyond_epsilon_or_where_an_episode_ended():
    reference = np.zeros((5, 2))
    moved = reference.copy()
    moved[3, 1] = 2 * rollouts.DIVERGENCE_EPSILON
    moved[4] = 1.0
    assert rollouts.divergence_step({"obs": moved}, {"obs": reference}) == 3
    assert rollouts.divergence_step({"obs": reference + rollouts.DIVERGENCE_EPSILON / 2}, {"obs": reference}) is None
    assert rollouts.divergence_step({"obs": reference[:3]}, {"obs": reference}) == 3  # ended early, no step apart before
    # several inputs (a Dict observation): the first step where any of them leaves the reference's
    image = np.zeros((5, 2, 2), np.uint8)
    brighter = image.copy()
    brighter[2, 1, 0] = 1  # one pixel one level brighter
    assert rollouts.divergence_step({"obs": reference, "image": image}, {"obs": reference, "image": brighter}) == 2


def test_action_agreement_and_step_drift():
    reference = np.array([[0.0], [1.0], [2.0], [3.0]])
    actions = reference + np.array([[0.0], [rollouts.ACTION_EPSILON / 2], [1.0], [0.0]])
    assert rollouts.action_agreement(actions, reference, discrete=False) == 0.75
    assert rollouts.action_agreement(actions, reference, discrete=True) == 0.5
    assert rollouts.action_agreement(actions[:0], reference, discrete=True) is None
    assert rollouts.step_drift(actions, reference) == pytest.approx([0.0, rollouts.ACTION_EPSILON / 2, 1.0, 0.0])


def test_relative_return_delta_has_a_floor():
    assert rollouts.relative_delta(-330.0, -300.0) == pytest.approx(-0.1)
    assert rollouts.relative_delta(0.5, 0.0) == 0.5  # |reference| below the floor of 1
