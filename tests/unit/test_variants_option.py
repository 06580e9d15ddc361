"""--variants and its old name --precisions (kept for scripts and matrix.toml files): the more direct one wins."""

from __future__ import annotations

import click
import pytest
from click.core import ParameterSource

from matrix.cli import cli, cli_args
from matrix.errors import InputError


def _resolve(variants: tuple[str, ParameterSource], precisions: tuple[str | None, ParameterSource]) -> str:
    ctx = click.Context(cli.run)
    ctx.set_parameter_source("variants", variants[1])
    ctx.set_parameter_source("precisions", precisions[1])
    with ctx:
        return cli_args._variants_option(variants[0], precisions[0])


DEFAULT = ("fp32,fp16,int8", ParameterSource.DEFAULT)


def test_the_old_name_still_selects_variants():
    assert _resolve(DEFAULT, ("fp16", ParameterSource.COMMANDLINE)) == "fp16"
    assert _resolve(DEFAULT, ("int8", ParameterSource.DEFAULT_MAP)) == "int8"  # precisions = ... in matrix.toml


def test_the_command_line_wins_over_the_old_name_in_a_file():
    assert _resolve(("fp32", ParameterSource.COMMANDLINE), ("int8", ParameterSource.DEFAULT_MAP)) == "fp32"
    assert _resolve(("fp16", ParameterSource.DEFAULT_MAP), (None, ParameterSource.DEFAULT)) == "fp16"


def test_both_names_on_the_command_line_must_agree():
    assert _resolve(("fp32,int8", ParameterSource.COMMANDLINE), ("fp32, int8", ParameterSource.COMMANDLINE)) == "fp32,int8"
    with pytest.raises(InputError, match="give one"):
        _resolve(("fp32", ParameterSource.COMMANDLINE), ("fp16", ParameterSource.COMMANDLINE))


def test_the_old_name_is_hidden_from_help():
    assert "--precisions" not in cli.run.get_help(click.Context(cli.run))
