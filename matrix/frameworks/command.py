"""`policy-matrix frameworks`: the command (cli.py adds it); the work is in dryrun.py."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from . import DEFAULT


@click.command(epilog="Writes OUT/index.html, OUT/frameworks.md (for a CI job summary) and OUT/frameworks.json; each "
                      "policy's folder (OUT/FRAMEWORK-RELEASE/POLICY) holds the recipe, the export and its full report. "
                      "Environments are built once (`policy-matrix setup frameworks`). Exit 0 when the table was written.")
@click.option("--frameworks", "chosen", default=",".join(DEFAULT), show_default=True,
              help="Frameworks, each at its pinned release or NAME@RELEASE: 'sb3@2.4.1,sb3' compares two releases.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("reports/frameworks"), show_default=True)
@click.option("--targets", default=None, help="Targets each export runs on (as `run --targets`).  [default: every deployment target]")
@click.option("--variants", default="fp32", show_default=True, help="Precisions (as `run --variants`).")
@click.option("--episodes", default=3, show_default=True, help="Episodes per policy on its task (behaviour and parity on its own states).")
@click.option("--seed", default=0, show_default=True, help="Seed of training and of the first episode.")
@click.option("--iters", default=50, show_default=True, help="Timed calls at batch 1 (latency is beside the point here: one batch size).")
@click.option("--jobs", default=1, show_default=True, help="Policies built and run at a time (each is its own processes).")
@click.option("--rebuild", is_flag=True, help="Train and export again where a policy folder or the build cache already holds a build.")
def frameworks(chosen, out, targets, variants, episodes, seed, iters, jobs, rebuild):
    """Each RL framework's default policies (CartPole-v1, Pendulum-v1, recurrent where it has one), trained
    for seconds and exported the way the framework documents, run on every target with --env, --source
    (export parity against the framework) and --assist: one measured table."""
    from rich.console import Console

    from .. import options, outdir
    from . import parse
    from .dryrun import DEFAULT_TARGETS, Plan, dry_run
    from .table import write

    console = Console(stderr=True, soft_wrap=not sys.stderr.isatty())
    plan = Plan(out=out, targets=targets or DEFAULT_TARGETS, variants=variants, episodes=options.at_least(episodes, 1, "--episodes"),
                seed=options.at_least(seed, 0, "--seed"), iters=options.at_least(iters, 1, "--iters"), jobs=options.at_least(jobs, 1, "--jobs"),
                rebuild=rebuild)
    outdir.claim(out)
    rows = dry_run(plan, parse(chosen), lambda line: console.print(line, highlight=False, markup=False))
    run_options = {"targets": plan.targets, "variants": plan.variants, "episodes": plan.episodes, "seed": plan.seed,
                "frameworks": chosen}
    write(rows, out, run_options)
    console.print(f"table: {out / 'index.html'} and {out / 'frameworks.md'}", highlight=False, markup=False)
