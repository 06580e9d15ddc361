"""`policy-matrix bisect`: the first release of a runtime where a measure of the policy changed.

The releases are the registry's, between OLD and NEW (both included, the target's floor
respected, pre-releases left out). OLD is measured first and is the yardstick; the search then
looks for the first release whose measure differs from OLD's, with NEW treated as changed until
measured. That visits 1 + ceil(log2(n)) of n releases, and NEW itself only when every release
before it looked like OLD (then "no change" is a measured answer, not an assumption).
As with any bisection, a measure that changes and changes back between two visits is not seen.

Each visited release is an ordinary run of one cell (`TARGET@RELEASE`, one variant) in its own
folder under the bisect's output, so its installation, worker, limits and verdict are exactly
those of `policy-matrix run`. A release that cannot run here (it does not install, the tool
failed: a SKIP) says nothing about the runtime: it is left out of the search and named.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..decide.compare import DRIFT_NOISE_FLOOR
from ..errors import InputError, printable
from ..errors import console_text as escape
from ..judge.noise import differs, ratio_band
from ..results import Cell, RunResults
from ..run.rollouts import RETURN_FLOOR

if TYPE_CHECKING:  # the orchestration (numpy, every target) is imported only when a bisect runs
    from ..run.orchestrate import RunConfig

RANGE_SEPARATOR = ".."


# --- what is compared -------------------------------------------------------------------


@dataclass(frozen=True)
class Measure:
    """One measure of a cell, how it reads, and when two values of it differ beyond `threshold`."""

    name: str
    read: Callable[[Cell], object]
    show: Callable[[object], str]
    changed: Callable[[object, object, float], bool]
    default_threshold: float
    threshold_means: str  # "" for a measure whose values are equal or not (verdict, placement)


def _drift(cell: Cell) -> float | None:
    return cell.max_drift


def _drift_changed(old: float | None, new: float | None, factor: float) -> bool:
    if old is None or new is None:
        return (old is None) != (new is None)  # one release measured drift, the other could not run the policy
    low, high = sorted((old, new))
    return high > DRIFT_NOISE_FLOOR and high > max(low, 1e-30) * factor


def _agreement(cell: Cell) -> float | None:
    shares = [p.agreement for p in cell.parity if p.agreement is not None]
    return min(shares) if shares else None


def _number_changed(old: float | None, new: float | None, threshold: float) -> bool:
    if old is None or new is None:
        return (old is None) != (new is None)
    return abs(new - old) > threshold


def _mean_return(cell: Cell) -> float | None:
    return cell.rollout.mean_return if cell.rollout else None


def _p50(cell: Cell):
    """The smallest timed batch's latency summary (the one a policy in a control loop pays)."""
    return min(cell.latency, key=lambda stats: stats.batch) if cell.latency else None


def _p50_changed(old, new, threshold: float) -> bool:
    if old is None or new is None:
        return (old is None) != (new is None)
    if old.p50_band is None or new.p50_band is None:
        raise InputError("the p50 measure needs results with a noise band (this policy-matrix writes them)")
    return differs(ratio_band(old.p50_band, new.p50_band), threshold)


def _show_p50(stats) -> str:
    if stats is None:
        return "no p50"
    return f"p50 {stats.p50_us:.1f} us ({stats.p50_low_us:.1f}-{stats.p50_high_us:.1f}) at batch {stats.batch}"


def _placement(cell: Cell) -> frozenset[str] | None:
    """The nodes that fell back (ran away from the requested device); None when placement was not reported."""
    return frozenset(row.node for row in cell.placement if row.fallback) if cell.placement else None


def _show_placement(nodes: frozenset[str] | None) -> str:
    if nodes is None:
        return "no placement"
    return f"{len(nodes)} fallback node(s){': ' + ', '.join(sorted(nodes)) if nodes else ''}"


def _show_number(label: str, form: str) -> Callable[[object], str]:
    return lambda value: f"no {label}" if value is None else f"{label} {value:{form}}"


MEASURES = {
    "verdict": Measure("verdict", lambda cell: cell.verdict, str, lambda old, new, _: old != new, 0.0, ""),
    "drift": Measure("drift", _drift, _show_number("drift", ".2g"), _drift_changed, 10.0,
                     "factor by which max-abs drift from the reference grows or shrinks"),
    "agreement": Measure("agreement", _agreement, _show_number("agreement", ".1%"), _number_changed, 0.01,
                         "difference in the share of discrete actions equal to the reference's"),
    "return": Measure("return", _mean_return, _show_number("return", ".4g"), _number_changed, math.nan,
                      "difference in mean episode return (default: 5% of |the old release's reference return|)"),
    "p50": Measure("p50", _p50, _show_p50, _p50_changed, 0.25,
                   "fraction by which the p50's noise band must lie beyond 1 on either side"),
    "placement": Measure("placement", _placement, _show_placement, lambda old, new, _: old != new, 0.0, ""),
}


def check_threshold(measure: Measure, given: float | None) -> None:
    """A threshold is a number >= 0, and only for a measure that has degrees."""
    if given is None:
        return
    if not measure.threshold_means:
        raise InputError(f"--threshold: the {measure.name} measure changes or not; it takes no threshold")
    if not given >= 0 or math.isinf(given):
        raise InputError(f"--threshold {given}: expected a finite number >= 0 ({measure.threshold_means})")


def threshold_for(measure: Measure, given: float | None, old: Cell) -> float:
    """The threshold given, else the measure's own default (return: relative to the old release's reference)."""
    if given is not None:
        return given
    if measure.name == "return" and old.rollout and old.rollout.reference_mean_return is not None:
        return 0.05 * max(abs(old.rollout.reference_mean_return), RETURN_FLOOR)
    return measure.default_threshold


# --- which releases --------------------------------------------------------------------


def parse_range(text: str) -> tuple[str, str]:
    """'1.20.1..1.23.0' -> ('1.20.1', '1.23.0')."""
    from targets.versions import BadRelease, check_version

    old, sep, new = text.partition(RANGE_SEPARATOR)
    if not sep or not old or not new:
        raise InputError(f"bisect range {text!r}: expected OLD..NEW, e.g. 1.20.1..1.23.0")
    try:
        return check_version(f"x@{old}"), check_version(f"x@{new}")
    except BadRelease as error:
        raise InputError(str(error)) from None


def offered(target_name: str) -> tuple[list[str], str]:
    """The releases the registry offers for the target from its floor on (oldest first), and that floor."""
    import subprocess

    import targets as registry
    from targets import versions

    target = registry.get(target_name)
    try:
        return versions.supported_versions(target), versions.release_of(target).floor
    except versions.BadRelease as error:
        raise InputError(str(error)) from None
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:  # the registry is out of reach
        raise InputError(f"bisect {target_name}: cannot list releases: {error}") from None


def releases_between(offered: list[str], old: str, new: str, floor: str) -> list[str]:
    """The offered releases from `old` to `new` (oldest first), both ends included."""
    for end in (old, new):
        if end not in offered:
            raise InputError(f"bisect: release {end} is not among the releases offered (the floor is {floor}): "
                             f"{offered[0] if offered else '-'} … {offered[-1] if offered else '-'}")
    first, last = offered.index(old), offered.index(new)
    if last - first < 1:
        raise InputError(f"bisect: {old}..{new} holds no later release to search: OLD must be older than NEW")
    return offered[first:last + 1]


# --- the search ----------------------------------------------------------------------


@dataclass
class Visit:
    release: str
    cell: Cell
    value: object = None
    changed: bool | None = None  # None: the release did not run here (SKIP), so it says nothing


@dataclass
class Outcome:
    releases: list[str]
    visits: list[Visit] = field(default_factory=list)
    last_same: Visit | None = None
    first_changed: Visit | None = None

    @property
    def untestable(self) -> list[Visit]:
        return [visit for visit in self.visits if visit.changed is None]


def visit_bound(count: int) -> int:
    """The most releases a search of `count` visits: the oldest, then a binary search over the rest."""
    return 1 + math.ceil(math.log2(count))


def search(releases: list[str], probe: Callable[[str], Cell], measure: Measure, threshold: float | None,
           on_visit: Callable[[Visit, int, int], None] = lambda visit, step, bound: None) -> Outcome:
    """The first release whose measure differs from the oldest's; `probe(release)` runs the policy there,
    `on_visit(visit, step, bound)` hears of each visit as it ends (bound: the most visits the search can take)."""
    outcome = Outcome(releases)
    bound = visit_bound(len(releases))
    old = Visit(releases[0], probe(releases[0]))
    if old.cell.verdict == "SKIP":
        raise InputError(f"bisect: the old end {releases[0]} did not run here: {'; '.join(old.cell.reasons) or 'SKIP'}")
    old.value, old.changed = measure.read(old.cell), False
    limit = threshold_for(measure, threshold, old.cell)
    outcome.visits.append(old)
    outcome.last_same = old
    on_visit(old, 1, bound)
    low, high, skipped = 0, len(releases), set()
    while True:
        window = [i for i in range(low + 1, high) if i not in skipped]
        if not window:
            break
        middle = window[len(window) // 2]
        visit = Visit(releases[middle], probe(releases[middle]))
        if visit.cell.verdict == "SKIP":
            skipped.add(middle)
        else:
            visit.value = measure.read(visit.cell)
            visit.changed = measure.changed(old.value, visit.value, limit)
        outcome.visits.append(visit)
        on_visit(visit, len(outcome.visits), bound)
        if visit.changed is True:
            high, outcome.first_changed = middle, visit
        elif visit.changed is False:
            low, outcome.last_same = middle, visit
    return outcome


def describe(visit: Visit, measure: Measure) -> str:
    """'1.21.0: drift 0.56 FAIL' (the verdict measure: '1.21.0: FAIL, <its first reason>')."""
    if visit.changed is None:
        return f"{visit.release}: not run here ({_short('; '.join(visit.cell.reasons))})"
    reason = f", {_short(visit.cell.reasons[0])}" if visit.cell.reasons and visit.cell.verdict != "PASS" else ""
    if measure.name == "verdict":
        return f"{visit.release}: {visit.cell.verdict}{reason}"
    return f"{visit.release}: {measure.show(visit.value)} {visit.cell.verdict}"


def conclusion(outcome: Outcome, measure: Measure, package: str) -> str:
    """The one line a bisect ends with."""
    if outcome.first_changed is None:
        return (f"no change in {measure.name} from {package} {outcome.releases[0]} to {outcome.releases[-1]} "
                f"({describe(outcome.last_same, measure)})")
    position = outcome.releases.index
    between = sorted((v.release for v in outcome.untestable
                      if position(outcome.last_same.release) < position(v.release) < position(outcome.first_changed.release)),
                     key=position)
    untested = f"; {', '.join(between)} between them did not run here" if between else ""
    return (f"first changed in {package} {outcome.first_changed.release} "
            f"({describe(outcome.last_same, measure)}; {describe(outcome.first_changed, measure)}{untested})")


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


# --- one visited release is one ordinary run --------------------------------------------


RELEASES_FOLDER = "releases"  # <out>/releases/<release>/: each visited release's own run


def bisect(config: RunConfig, target: str, span: list[str], measure: Measure, threshold: float | None, console) -> bool:
    """Visit releases with a line each, then the one-line answer (stdout), the report; True when a change was found."""
    import click

    import targets as registry
    from targets import versions

    package = versions.release_of(registry.get(target)).package
    runs: dict[str, RunResults] = {}
    console.print(f"[bold]bisect[/]: {len(span)} releases of {package} ({span[0]} … {span[-1]}), "
                  f"measure {measure.name}: at most {visit_bound(len(span))} runs", highlight=False, soft_wrap=True)

    def probe(release: str) -> Cell:
        runs[release] = run_release(config, target, release, console)
        return runs[release].cells[0]

    def on_visit(visit: Visit, step: int, bound: int) -> None:
        against = {True: "changed", False: "same as the oldest", None: "skipped"}[visit.changed]
        console.print(f"  {step}/{bound} {escape(describe(visit, measure))} -> {against}", highlight=False, soft_wrap=True)

    outcome = search(span, probe, measure, threshold, on_visit)
    index = write_report(outcome, runs, measure, package, config.out)
    click.echo(conclusion(outcome, measure, package))
    console.print(f"bisect report: [bold]{escape(str(config.out / 'bisect.md'))}[/], "
                  f"{'neighbours' if outcome.first_changed else 'the two ends'}: [bold]{escape(str(index))}[/]", soft_wrap=True)
    return outcome.first_changed is not None


def run_release(config: RunConfig, target: str, release: str, console) -> RunResults:
    """One cell, TARGET@RELEASE at the config's one variant, run exactly as `policy-matrix run` runs it, in its own
    folder; a finished run of the same model and settings there (an earlier bisect in the same --out) is kept."""
    from dataclasses import replace

    from rich.console import Console

    from ..run.orchestrate import install_releases, run

    label = f"{target}@{release}"
    step = replace(config, targets=[label], out=config.out / RELEASES_FOLDER / release)
    kept = _finished_run(step)
    if kept is not None:
        console.print(f"[bold]release[/]: {label}: kept from an earlier bisect in {escape(str(step.out))}", highlight=False,
                      soft_wrap=True)
        return kept
    install_releases([label], console)
    results = run(step, Console(stderr=True, quiet=True))  # the bisect prints one line per release instead
    if results.interrupted is not None:  # Ctrl-C or SIGTERM inside the run: the bisect stops as a run would
        raise KeyboardInterrupt
    results.save(step.out / "results.json")
    return results


def _finished_run(step: RunConfig) -> RunResults | None:
    """The step folder's results when they were measured with this model and these settings, else None (also for a
    SKIP: a release that could not be installed then may be now)."""
    import json

    from ..run.orchestrate import RUN_FILE, run_identity
    from ..results import load

    try:
        recorded = json.loads((step.out / RUN_FILE).read_text())
        recorded.pop("run_id")
        results = load(step.out / "results.json")
    except (OSError, ValueError, KeyError, AttributeError, InputError):  # no earlier run there, or not one of ours
        return None
    same = recorded == json.loads(json.dumps(run_identity(step)))
    return results if same and len(results.cells) == 1 and results.cells[0].verdict != "SKIP" else None


def write_report(outcome: Outcome, runs: dict[str, RunResults], measure: Measure, package: str, out: Path) -> Path:
    """bisect.md (the visited releases) and index.html, the usual report of the two neighbours side by side (with no
    change found: of the oldest release and the newest that ran here)."""
    from ..report.report import write_all

    lines = [f"# bisect: {package} {outcome.releases[0]}..{outcome.releases[-1]}, measure {measure.name}", "",
             _markdown(conclusion(outcome, measure, package)), "",
             "| release | verdict | measure | against the oldest | run |", "|---|---|---|---|---|"]
    for release in outcome.releases:
        visit = next((v for v in outcome.visits if v.release == release), None)
        if visit is None:
            lines.append(f"| {release} | not visited | | | |")
            continue
        against = {True: "changed", False: "same", None: "not run here"}[visit.changed]
        lines.append(f"| {release} | {visit.cell.verdict} | {_markdown(measure.show(visit.value))} | {against} "
                     f"| {RELEASES_FOLDER}/{release}/results.json |")
    (out / "bisect.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    ends = (outcome.last_same, outcome.first_changed) if outcome.first_changed else (outcome.visits[0], outcome.last_same)
    shown = [runs[release] for release in dict.fromkeys(visit.release for visit in ends)]  # one, when only the oldest ran
    return write_all(shown[0].model_copy(update={"cells": [run.cells[0] for run in shown]}), out)


def _markdown(text: str) -> str:
    """A runtime's words in a Markdown table cell: no cell breaks, no markup."""
    import html

    return html.escape(printable(text)).replace("|", "\\|").replace("\n", " ")
