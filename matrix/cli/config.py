"""`run` options from a file: every command-line option of `run` has a key of the same name.

Looked up in this order: `--config FILE`, else `matrix.toml` in the current folder,
else `[tool.policy-matrix]` of `pyproject.toml` there. Options given on the command
line win over the file, the file wins over the built-in defaults (click's
`default_map`). The `[tolerance]` table keeps its own shape (see `tolerances`).

```toml
targets = ["ort-cpu", "ort-web-*"]   # or "ort-cpu,ort-web-*"
skip = ["*-webgpu"]
variants = ["fp32", "int8"]         # `precisions`, its old name, still works
side-input = "deterministic=true"    # a repeatable option takes a list, or one value as it is
iters = 100
out = "reports/nightly"              # relative paths are relative to this file

[tolerance]
"ort-cpu:int8" = 0.3
```
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from .. import options
from ..errors import InputError

CONFIG_FILE = "matrix.toml"
PYPROJECT_TABLE = ("tool", "policy-matrix")
# Options that are not run options in a file: the file itself, and the table kept apart.
NOT_FROM_FILE = ("config", "tolerance")


def find(explicit: Path | None) -> tuple[Path, dict] | None:
    """The config file in effect and its options table, or None."""
    if explicit is not None:
        return explicit, _read(explicit)
    if Path(CONFIG_FILE).is_file():
        return Path(CONFIG_FILE), _read(Path(CONFIG_FILE))
    if Path("pyproject.toml").is_file():
        table = _read(Path("pyproject.toml"))
        for key in PYPROJECT_TABLE:
            table = table.get(key, {})
        if table:
            return Path("pyproject.toml"), table
    return None


def _read(path: Path) -> dict:
    return options.read_toml(path)


def default_map(command: click.Command, path: Path, table: dict) -> dict:
    """The file's options as click defaults for `command`, keyed by parameter name.

    Lists become the comma-separated text the options take; relative paths are
    taken from the file's folder. An unknown key is an error, not a silent no-op.
    """
    params = _by_option_name(command)
    defaults = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name == "tolerance":
            continue
        if name not in params or name in NOT_FROM_FILE:
            known = ", ".join(sorted(n.replace("_", "-") for n in params if n not in NOT_FROM_FILE and not params[n].hidden))
            raise InputError(f"{path}: unknown setting {key!r}; known: {known}, and a [tolerance] table")
        value = _as_listed(value, params[name])
        _check_type(value, params[name], f"{path}: {key}")
        defaults[params[name].name] = _as_option_value(value, params[name], path.parent)
    return defaults


def _as_listed(value, param: click.Option):
    """A repeatable option given one value (`side-input = "deterministic=true"`) takes it as a one-item list,
    as `--side-input deterministic=true` once on the command line; click refuses a bare value as a default."""
    if param.multiple and not isinstance(value, list):
        return [value]
    return value


def _by_option_name(command: click.Command) -> dict[str, click.Option]:
    """Options by the name a user types (`--candidate` -> candidate), whatever the parameter is called in code."""
    params = {}
    for param in command.params:
        if isinstance(param, click.Option):
            for flag in param.opts:
                if flag.startswith("--"):
                    params[flag[2:].replace("-", "_")] = param
    return params


def _as_option_value(value, param: click.Option, base: Path):
    if isinstance(value, list) and param.multiple:  # repeatable options (candidate, settings, budget) take the list
        return [_as_option_value(item, param, base) for item in value]
    if isinstance(value, list):
        value = ",".join(str(item) for item in value)
    if isinstance(value, dict):  # a table given to a JSON option (env-kwargs)
        value = json.dumps(value)
    if isinstance(param.type, click.Path) and isinstance(value, str) and not Path(value).is_absolute():
        value = str(base / value)
    return value


def _check_type(value, param: click.Option, where: str) -> None:
    """A file's value has the option's type: `iters = 1.5` or `iters = true` would otherwise run as 1,
    `out = 5` fail deep inside click."""
    if isinstance(value, list) and param.multiple:
        for item in value:
            _check_type(item, param, where)
        return
    kind = param.type
    if isinstance(kind, click.types.BoolParamType) or param.is_flag:
        expected, fits = "true or false", isinstance(value, bool)
    elif isinstance(kind, click.types.IntParamType):
        expected, fits = "a whole number", isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(kind, click.types.FloatParamType):
        expected, fits = "a number", isinstance(value, (int, float)) and not isinstance(value, bool)
    elif isinstance(kind, (click.Path, click.Choice)):
        expected, fits = "a string", isinstance(value, str)
    else:  # text options take a string, a list (joined with commas) or a table (JSON options)
        expected = "a string or a list"
        fits = isinstance(value, (str, dict)) or (isinstance(value, list) and all(
            isinstance(item, (str, int, float)) and not isinstance(item, bool) for item in value))
    if not fits:
        raise InputError(f"{where} = {' '.join(repr(value).split())[:60]}: expected {expected}")


def tolerances(table: dict, path: Path) -> dict[str, float]:
    """The `[tolerance]` table: 'target:variant' (with '*' wildcards) -> max abs drift."""
    tolerance = options.config_table(table, "tolerance", path)
    return {key: options.tolerance_value(value, f"{path}: [tolerance] {key!r}") for key, value in tolerance.items()}


def load_into(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """Eager callback of `run --config`: the file's options become the other options' defaults."""
    found = find(value)
    if found is not None:
        path, table = found
        ctx.default_map = {**(ctx.default_map or {}), **default_map(ctx.command, path, table)}
        ctx.meta["config_tolerances"] = tolerances(table, path)
        ctx.meta["config_path"] = path
    return value
