"""The `policy-matrix` command line: commands, the `run` options in argument groups, matrix.toml, setup and bisect."""

from .cli import main  # the console script's entry point stays `matrix.cli:main`

__all__ = ["main"]
