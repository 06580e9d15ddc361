"""Shards from several hosts -> one RunResults, the host a column of every table.

Shards must describe the same model (sha256) in the same schema version, measured on
the same inputs and judged alike (compare.input_differences; --allow-different-inputs), down to the
tolerance each configuration's cells were judged at (a release's rule may change it). One
host may have several shards (one CI job per target group on identical runners)
as long as they hold disjoint cells: a cell in two shards is refused, so no cell
is silently overwritten.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from .. import results as schema
from .compare import COMPARED_OPTIONS, checked_inputs, judged_differently, tolerance_said
from ..errors import InputError
from ..judge import rules
from ..results import Cell, RunResults


def shard_path(path: Path) -> Path:
    """A shard is a results.json, or a report folder holding one. A folder with results.jsonl alone holds a run that
    never finished (killed: a CI runner out of time): it is named so, with the command that finishes it."""
    path = Path(path)
    if not path.is_dir():
        return path
    if not (path / "results.json").exists() and (path / "results.jsonl").is_file():
        raise InputError(f"{path}: its run did not finish (results.jsonl, no results.json): `policy-matrix run MODEL "
                         f"--resume {path}` with the options it ran with runs its missing cells, or leave it out")
    return path / "results.json"


def merge(paths: list[Path], allow_different_inputs: bool = False, out: Path | None = None) -> RunResults:
    """The shards as one RunResults; with `out`, the merged report's folder, the files a shard saved beside its
    own report (--assist's fixes) are named from there."""
    if not paths:
        raise InputError("merge needs at least one shard (a results.json or its report folder)")
    shards = [(shard_path(p), schema.load(shard_path(p))) for p in paths]
    if out is not None:
        for path, shard in shards:
            _rebase_files(shard, path.parent, Path(out))
    first_path, merged = shards[0]
    merged = merged.model_copy(deep=True, update={"created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})
    merged.run_options = {**_shared_options(shards), "shards": [str(p) for p, _ in shards]}
    assisted = _assisted_targets(shards)
    if assisted and "assist" not in merged.run_options:  # the shards differ on --assist
        merged.run_options["assisted_targets"] = assisted
    seen = {host.label: first_path for host in merged.hosts}
    cells = {cell.key: first_path for cell in merged.cells}
    for path, shard in shards[1:]:
        if shard.model["sha256"] != merged.model["sha256"]:
            raise InputError(
                f"{path} is a run of {shard.model['name']} ({shard.model['sha256'][:12]}), "
                f"{first_path} of {merged.model['name']} ({merged.model['sha256'][:12]}): shards must share one model"
            )
        checked_inputs(merged, shard, allow_different_inputs, str(first_path), str(path))
        for cell in shard.cells:
            if cell.key in cells:
                raise InputError(
                    f"cell {' '.join(filter(None, (cell.target, cell.variant, cell.configuration.axes)))} of host {cell.host!r} is in both {cells[cell.key]} and {path}: "
                    "shards of one host must hold different cells (or rerun one with --host-label)"
                )
            cells[cell.key] = path
        for host in shard.hosts:
            if host.label not in seen:
                seen[host.label] = path
                merged.hosts.append(host)
        merged.cells += shard.cells
    merged.regressions = []
    merged.interrupted_shards = _interruptions(shards)
    merged.interrupted = next(iter(merged.interrupted_shards), None)
    merged.required_not_run = list(dict.fromkeys(name for _, shard in shards for name in shard.required_not_run))
    merged.required_on = _required_on(shards)
    merged.variant_errors = _by_variant(shards, "variant_errors")
    merged.variants_not_made = _by_variant(shards, "variants_not_made")
    merged.lints = _lints(shards)
    _judged_alike(merged, cells, allow_different_inputs)
    return merged


def _judged_alike(merged: RunResults, shard_of: dict, allowed: bool) -> None:
    """One configuration's cells on several hosts judged at different tolerances (a release before 05637b2 judged a
    user's int8 model at fp32's) are verdicts of different rules: refused, or with --allow-different-inputs said
    by a lint and, on each such cell, what the other host judged it at."""
    first: dict[tuple, Cell] = {}
    drifted = (cell for cell in merged.cells if cell.parity)  # a cell with no parity was judged on no tolerance
    differing = [(first[cell.configuration.key], cell) for cell in drifted
                 if judged_differently(first.setdefault(cell.configuration.key, cell), cell)]
    if not differing:
        return
    (earlier, later), more = differing[0], len(differing) - 1
    said = (f"{shard_of[earlier.key]} and {shard_of[later.key]} judged alike cells at different tolerances: "
            f"{later.configuration.label} at {tolerance_said(earlier)} on {earlier.host} vs {tolerance_said(later)} on "
            f"{later.host}" + (f" (and {more} more)" if more else ""))
    if not allowed:
        raise InputError(f"{said}; rerun the older shard with this release, or pass --allow-different-inputs")
    merged.lints.append(schema.LintResult(id="tolerances", level="warn", message=f"{said}: their verdicts follow different rules"))
    for earlier, later in differing:
        earlier.notes.append(f"judged at {tolerance_said(earlier)} here; {later.host} judged this configuration at {tolerance_said(later)}")
        later.notes.append(f"judged at {tolerance_said(later)} here; {earlier.host} judged this configuration at {tolerance_said(earlier)}")


def _lints(shards) -> list[schema.LintResult]:
    """Every shard's lints, each once, in shard order: the model is the same, but a shard's --candidate adds its
    own lint, and a shard of an older release lacks lints added since."""
    lints: list[schema.LintResult] = []
    for _, shard in shards:
        lints += [lint for lint in shard.lints if lint not in lints]
    return lints


def _rebase_files(shard: RunResults, folder: Path, out: Path) -> None:
    """A file a cell saved (a prepared fix, a workaround's copies) is named relative to its report's folder: the
    shard's, which the merged report is not; so is every word naming it (the fix's reason, the workaround note)."""
    def rebase(path: str) -> str:
        return Path(os.path.relpath(folder.absolute() / path, out.absolute())).as_posix()

    for cell in shard.cells:
        named = {}
        for fix in (fix for fix in cell.fixes if fix.prepared_onnx):
            old, fix.prepared_onnx = fix.prepared_onnx, rebase(fix.prepared_onnx)
            named[f"{rules.PREPARED_GRAPH}{old}"] = f"{rules.PREPARED_GRAPH}{fix.prepared_onnx}"
        for words in (cell.reasons, cell.notes, cell.artifact.notes if cell.artifact else []):
            words[:] = [_renamed(rules.rebased_saved(text, rebase), named) for text in words]


def _renamed(text: str, named: dict[str, str]) -> str:
    for old, new in named.items():
        text = text.replace(old, new)
    return text


def _required_on(shards) -> dict[str, list[str]]:
    """Each `--require`d target that did not run -> the hosts whose shard required it."""
    hosts: dict[str, list[str]] = {}
    for _, shard in shards:
        for name in shard.required_not_run:
            labels = shard.required_on.get(name, [host.label for host in shard.hosts])
            hosts[name] = list(dict.fromkeys(hosts.get(name, []) + labels))
    return hosts


def _assisted_targets(shards) -> list[list[str]]:
    """[host, target] of every cell whose shard ran --assist: where shards differ on it, the merged decision says per
    target what --assist did there, and "try --assist" only where it did not run."""
    return sorted(map(list, {(cell.host, cell.target) for _, shard in shards if shard.run_options.get("assist")
                             for cell in shard.cells}))


def _by_variant(shards, field: str) -> dict[str, str]:
    """Each variant the tool could not make (or did not make), with every host that said so and its words."""
    said: dict[str, list[str]] = {}
    for _, shard in shards:
        for variant, why in getattr(shard, field).items():
            said.setdefault(variant, []).append(f"{_labels(shard)}: {why}")
    return {variant: "; ".join(words) for variant, words in said.items()}


def _labels(shard: RunResults) -> str:
    return ", ".join(host.label for host in shard.hosts)


def _shared_options(shards) -> dict:
    """The run options of the merged report: those every shard shares; one the shards set differently (their
    targets, iters, run id) is listed per shard under `per_shard`, with the time the shard was made (the merged
    report's `created` is the merge's). How cells were judged stays the first shard's: it is the same in every
    shard unless --allow-different-inputs, and the budgets decide over every host's cells."""
    first = shards[0][1].run_options
    keys = set().union(*(shard.run_options for _, shard in shards)) - {"decision", "rollout", *COMPARED_OPTIONS}
    differing = sorted(key for key in keys if any(shard.run_options.get(key) != first.get(key) for _, shard in shards))
    options = {key: value for key, value in first.items() if key not in differing}
    options["per_shard"] = {str(path): {"created": shard.created, **{key: shard.run_options.get(key) for key in differing}}
                            for path, shard in shards}
    return options


def _interruptions(shards) -> list[schema.Interruption]:
    """The merged report holds the finished cells of every shard: each interrupted one is named with its host."""
    return [interruption.model_copy(update={"host": interruption.host or _labels(shard)})
            for _, shard in shards for interruption in shard.interruptions()]
