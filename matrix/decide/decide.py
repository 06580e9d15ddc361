"""What to ship per target: the cheapest measured configuration that meets every budget.

A configuration is one cell: (candidate, variant, settings) on a target, or
such a cell after a graph preparation that made it pass (--assist). It meets
the quality bar when its verdict is PASS or WARN (drift within tolerance, the
action contract, and the return tolerance when rollouts ran), and it is not an
"int8" artifact with nothing quantized. Budgets add limits per target:
`--budget 'ort-cpu=p50:200us'`, `'*=p99:2ms'`, `'tflite=size:1MB'` (latency at
the smallest timed batch). Among configurations meeting all of them (those
needing no preparation first, then a PASS before a WARN), `--prefer` orders:
latency, size or accuracy. Latency is compared with its noise: p50s whose
noise bands (matrix/judge/noise.py) do not show a difference beyond SAME_SPEED count
as equally fast, a p99 above TAIL_FACTOR times the best cannot
win, and equals go to the simpler configuration (order_rule: the one sentence the
report and summary.md print). Emulated adapters' latency never decides. Every
configuration leaves with its outcome: why it ships, why it lost to the one ranked
above it, or what it misses.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections import defaultdict
from dataclasses import dataclass

from ..judge import noise, rules
from ..errors import InputError
from ..configuration import settings_label
from ..results import Cell, Decision, DecisionChoice, FixAttempt, RunResults
from ..runtime_versions import base_name

PREFER = ("latency", "size", "accuracy")
METRICS = ("p50", "p99", "size")
SAME_SPEED = 0.10  # p50s within 10% of the fastest count as equally fast
TAIL_FACTOR = 3.0  # a p99 more than 3x the best qualifying p99 cannot win on latency
# The p99 of n timed calls (numpy's, linear) lies at rank 0.99 (n - 1): from the two slowest calls while n <= 100, so
# one call the machine preempted decides it. A tail is compared only where both rest on this many calls (the default
# --iters, 200, does); a faster p50 with fewer is not set aside for a tail nobody measured.
TAIL_CALLS = 101
QUALIFIES = ("PASS", "WARN")
VARIANT_ORDER = {"fp32": 0, "fp16": 1, "int8": 2}  # simpler first: the tie-break after speed
TIE_RULE = ("ties go to the simpler configuration: no graph preparation, the first model before a candidate, fp32 before "
            "fp16 before int8, fewer threads, fewer settings away from the runtime's default (opt=all, xnnpack=on)")
_MEASURE = {  # what --prefer weighs, in the order _best applies it
    "latency": (f"the fastest p50 at the smallest timed batch (p50s whose noise bands, 95% bootstrap, cannot tell them "
                f"apart beyond {SAME_SPEED:.0%} are equally fast; a p99 more than {TAIL_FACTOR:g}x the best cannot win, "
                f"compared where each rests on at least {TAIL_CALLS} timed calls)"),
    "size": "the smallest file",
    "accuracy": ("the closest to the reference (|return delta| where episodes ran, else drift, else disagreement; return "
                 "deltas whose paired intervals overlap the closest's are equally close)"),
}
_LATENCY_UNITS = {"ns": 1e-3, "us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6}
_SIZE_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
# ASCII digits only: a str pattern's \d matches any script's digits ("１ms" read as 1 ms), which float() then takes.
_AMOUNT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?)\s*([a-zµ]*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Budget:
    targets: str  # a target name or glob
    metric: str  # p50 | p99 (µs) | size (bytes)
    limit: float

    def applies_to(self, target: str) -> bool:
        """`ort-cpu` covers its pinned releases (`ort-cpu@1.20.1`); `ort-cpu@1.20.1` only that one."""
        return any(fnmatch.fnmatchcase(name, self.targets) for name in (target, base_name(target)))

    def names(self, target: str) -> bool:
        """The budget's pattern is this target's name, no glob: `*=p50:1ms` asks of whatever ran, not of every target."""
        return not any(glob in self.targets for glob in "*?[") and self.applies_to(target)

    def describe(self) -> str:
        shown = duration(self.limit) if self.metric != "size" else size_text(self.limit)
        return f"{self.metric} ≤ {shown}"


def parse_budgets(specs: list[str]) -> list[Budget]:
    """`TARGET=METRIC:VALUE[,METRIC:VALUE]`, e.g. `ort-cpu=p50:200us`, `*=p99:2ms`, `tflite=size:1MB`."""
    budgets = []
    for text in specs:
        for item in text.split():
            pattern, equals, limits = item.partition("=")
            if not equals or not pattern or not limits:
                raise InputError(f"--budget {item!r}: expected TARGET=METRIC:VALUE, e.g. ort-cpu=p50:200us or '*=size:1MB'")
            budgets += [_budget(pattern, part, item) for part in limits.split(",") if part.strip()]
    return budgets


def _budget(pattern: str, part: str, item: str) -> Budget:
    metric, colon, value = part.strip().partition(":")
    if metric not in METRICS or not colon:
        raise InputError(f"--budget {item!r}: the metric is one of {', '.join(METRICS)} (p50:200us, p99:2ms, size:1MB)")
    found = _AMOUNT.match(value)
    units = _SIZE_UNITS if metric == "size" else _LATENCY_UNITS
    unit = found.group(2).lower() if found else ""
    if not found or unit not in units:
        raise InputError(f"--budget {item!r}: {value!r} is not an amount with a unit ({', '.join(units)})")
    limit = float(found.group(1)) * units[unit]
    if not math.isfinite(limit):  # 1e400us: float() reads it as infinity, no limit at all
        raise InputError(f"--budget {item!r}: {value!r} is too large to be a limit")
    if limit <= 0:
        raise InputError(f"--budget {item!r}: the limit must be above 0")
    if metric == "size" and limit < 1:  # a file is whole bytes: size:0.5B is met by nothing, and read "size <= 0 B"
        raise InputError(f"--budget {item!r}: a size limit is at least 1 B")
    return Budget(pattern.strip(), metric, limit)


def check_budget_targets(budgets: list[Budget], targets: list[str]) -> None:
    for budget in budgets:
        if not any(budget.applies_to(name) for name in targets):
            raise InputError(f"--budget {budget.targets}={budget.metric}:…: matches none of the selected targets ({', '.join(targets)})")


@dataclass(frozen=True)
class Request:
    """What the decision was asked for (--budget, --prefer): part of the run's configuration, recorded in
    results.run_options["decision"], so a merge and the report decide and show what the run was asked."""

    budget_specs: tuple[str, ...] = ()  # as given, e.g. "ort-cpu=p50:200us"
    prefer: str = "latency"

    @property
    def budgets(self) -> list[Budget]:
        return parse_budgets(list(self.budget_specs))

    @classmethod
    def recorded(cls, run_options: dict) -> Request:
        """The request a results file records (the first shard's, in a merge); none recorded: no budgets."""
        asked = run_options.get("decision") or {}
        return cls(tuple(asked.get("budgets", [])), asked.get("prefer", "latency"))

    def record(self) -> dict:
        return {"budgets": list(self.budget_specs), "prefer": self.prefer}

    def decide(self, results: RunResults) -> list[Decision]:
        return decide_all(results, self.budgets, self.prefer)


def decide_all(results: RunResults, budgets: list[Budget], prefer: str = "latency") -> list[Decision]:
    """A decision per host and target that ran the policy, and per target a budget names (not by a glob) even where
    nothing ran it (every cell SKIP or CONVERTED): a budget the user gave for that target is answered, never dropped."""
    by_target: dict[tuple[str, str], list[Cell]] = defaultdict(list)
    for cell in (c for c in results.cells if c.target != "source"):  # the training framework is not shipped
        measured = by_target[(cell.host, cell.target)]
        if cell.verdict != "SKIP" and cell.predicts:
            measured.append(cell)
    behaviour = rules.returns_judged(results.run_options)
    not_ready = [f"{lint.id}: {lint.message}" for lint in results.lints if lint.level == "error"]
    decided = {key: cells for key, cells in by_target.items() if cells or any(b.names(key[1]) for b in budgets)}
    return [decide_target(host, target, cells, [b for b in budgets if b.applies_to(target)], prefer, behaviour, not_ready,
                          _assisted(results.run_options, host, target))
            for (host, target), cells in sorted(decided.items())]


def _assisted(run_options: dict, host: str, target: str) -> bool:
    """Whether --assist ran on this host's target: a run's own option, or, in a merge of shards that differ on it,
    the targets of the shards that ran it (merge._assisted_targets)."""
    return bool(run_options.get("assist")) or [host, target] in run_options.get("assisted_targets", [])


def decide_target(host: str, target: str, cells: list[Cell], budgets: list[Budget], prefer: str,
                  behaviour: bool = False, not_ready: list[str] | None = None, assisted: bool = False) -> Decision:
    choices = [_choice(cell, budgets) for cell in cells]
    choices += [_fixed_choice(cell, fix, budgets, behaviour) for cell in cells for fix in cell.fixes if fix.verdict in QUALIFIES]
    _flag_larger_than_fp32(choices)
    ranked = _ranked([c for c in choices if not c.misses], prefer, _knob_defaults(target))
    decision = Decision(host=host, target=target, prefer=prefer, budgets=[b.describe() for b in budgets],
                        considered=len(choices), quality_bar=_quality_bar(behaviour, assisted), tie_rule=order_rule(prefer),
                        not_ready=list(not_ready or []), assisted=assisted, fixes_tried=_fixes_tried(cells))
    if ranked:
        decision.chosen = ranked[0]
        decision.runner_up = ranked[1] if len(ranked) > 1 else None
    elif choices:
        decision.closest = min(choices, key=lambda choice: _distance(choice, budgets))
    decision.configurations = ranked + [c for c in choices if c.misses]
    return decision


def _fixes_tried(cells: list[Cell]) -> dict[str, list[str]]:
    """What --assist tried, per configuration: the words "found no fix" name them."""
    tried: dict[str, list[str]] = {}
    for cell in (c for c in cells if c.fixes):
        label = " ".join(part for part in (cell.variant, cell.configuration.settings_label) if part)
        names = tried.setdefault(label, [])
        names += [fix.preparation for fix in cell.fixes if fix.preparation not in names]
    return tried


def order_rule(prefer: str) -> str:
    """How the configurations that qualify are ordered under `--prefer`: recorded as Decision.tie_rule."""
    return (f"a configuration needing no graph preparation (--assist) before one that does, a PASS before a WARN, "
            f"then {_MEASURE[prefer]}; {TIE_RULE}")


def order_line(decision: Decision) -> str:
    """The order as a sentence, one source for the report's note and summary.md's "Order:" line."""
    return f"Order among those that qualify, by {decision.prefer} (--prefer): {decision.tie_rule}"


def _quality_bar(behaviour: bool, assisted: bool) -> str:
    if behaviour:
        fixes = f"; a fix from --assist is {rules.FIX_JUDGED_ON}" if assisted else ""
        return ("the paired return difference against the first model's float64 reference within the return tolerance "
                f"(single-step drift is shown, not judged) and the action contract{fixes}")
    return "the drift tolerance against the first model's float64 reference and the action contract (behaviour not measured: no --env)"


def _choice(cell: Cell, budgets: list[Budget]) -> DecisionChoice:
    timed = min(cell.latency, key=lambda s: s.batch) if cell.latency else None
    discrete = [p for p in cell.parity if p.kind == "discrete" and p.agreement is not None]
    choice = DecisionChoice(
        candidate=cell.candidate, variant=cell.variant, settings=cell.settings, verdict=cell.verdict,
        batch=timed.batch if timed else None, p50_us=timed.p50_us if timed else None, p99_us=timed.p99_us if timed else None,
        timed_calls=timed.n if timed else None,
        p50_low_us=timed.p50_low_us if timed else None, p50_high_us=timed.p50_high_us if timed else None,
        size_bytes=cell.artifact.size_bytes if cell.artifact else None, drift=cell.max_drift,
        agreement=min(p.agreement for p in discrete) if discrete else None,
        flips=sum(p.flips or 0 for p in discrete) if discrete else None,
        return_delta=cell.rollout.return_delta if cell.rollout else None, emulated=bool(cell.backend and cell.backend.emulated),
        return_delta_low=cell.rollout.return_delta_low if cell.rollout else None,
        return_delta_high=cell.rollout.return_delta_high if cell.rollout else None,
    )
    choice.fix, choice.prepared_onnx = rules.workaround(cell.artifact.notes if cell.artifact else [])
    choice.misses = rules.quality_misses(cell) + [miss for budget in budgets if (miss := _budget_miss(choice, budget))]
    return choice


def _fixed_choice(cell: Cell, fix: FixAttempt, budgets: list[Budget], behaviour: bool) -> DecisionChoice:
    """A configuration that passes only after a graph preparation (--assist): it can ship, as that fix. Under
    --env it was judged on drift, not on a return (rules.FIX_JUDGED_ON): its row says so."""
    choice = DecisionChoice(
        candidate=cell.candidate, variant=cell.variant, settings=cell.settings, verdict=fix.verdict, batch=fix.batch,
        p50_us=fix.p50_us, p99_us=fix.p99_us, timed_calls=fix.timed_calls, drift=fix.drift, emulated=fix.emulated, fix=fix.preparation, prepared_onnx=fix.prepared_onnx,
        size_bytes=fix.size_bytes,
    )
    choice.misses = [miss for budget in budgets if (miss := _budget_miss(choice, budget))]
    if behaviour:
        choice.flags.append(rules.FIX_JUDGED_ON)
    return choice


def _flag_larger_than_fp32(choices: list[DecisionChoice]) -> None:
    """A reduced-precision file larger than its fp32 buys nothing on disk: say so wherever it shows."""
    fp32 = {(c.candidate, settings_label(c.settings)): c.size_bytes for c in choices if c.variant == "fp32" and not c.fix}
    for choice in choices:
        base = fp32.get((choice.candidate, settings_label(choice.settings)))
        if choice.variant != "fp32" and choice.size_bytes and base and choice.size_bytes > base:
            choice.flags.append(f"{choice.variant} file {choice.size_bytes / base:.2g}x the size of its fp32")


def _measured(choice: DecisionChoice, metric: str) -> float | None:
    return {"p50": choice.p50_us, "p99": choice.p99_us, "size": choice.size_bytes}[metric]


def _budget_miss(choice: DecisionChoice, budget: Budget) -> str:
    if budget.metric != "size" and choice.emulated:
        return f"{budget.describe()}: latency on an emulated adapter is not a real latency"
    value = _measured(choice, budget.metric)
    if value is None:
        return f"{budget.describe()}: not measured"
    if value > budget.limit:
        shown = size_text(value) if budget.metric == "size" else duration(value)
        return f"{budget.describe()}: measured {shown}"
    return ""


def _ranked(meeting: list[DecisionChoice], prefer: str, defaults: dict[str, str]) -> list[DecisionChoice]:
    """Best first: the best of all, then the best of the rest (the runner-up), and so on. Each choice
    after the first says why it lost to the one ranked just above it; the first says why it won."""
    rest, ranked = list(meeting), []
    while rest:
        best = _best(rest, prefer, defaults)
        ranked.append(best)
        rest.remove(best)
    if ranked:  # only the chosen has a `why`: a later round's (e.g. "the only configuration that qualifies") misleads
        ranked[0].why = _why_best(ranked[0], meeting, prefer)
    for better, worse in zip(ranked, ranked[1:]):
        worse.lost = _why_not(worse, better, prefer)
    return ranked


def _best(choices: list[DecisionChoice], prefer: str, defaults: dict[str, str]) -> DecisionChoice:
    choices = _weighed(choices)

    def simplicity(choice: DecisionChoice) -> tuple:
        return _simplicity(choice, defaults)

    if prefer == "size":
        return min(choices, key=lambda c: (_or_inf(c.size_bytes), simplicity(c)))
    if prefer == "accuracy":
        return min(_equally_close(choices), key=simplicity)
    return min(_equally_fast(choices), key=simplicity)


def _weighed(choices: list[DecisionChoice]) -> list[DecisionChoice]:
    """The choices weighed on the preferred measure: a fix ranks after anything that needs none, a clean PASS
    beats a WARN."""
    choices = [c for c in choices if not c.fix] or choices
    return [c for c in choices if c.verdict == "PASS"] or choices


def _equally_fast(choices: list[DecisionChoice]) -> list[DecisionChoice]:
    """The configurations that count as the fastest: a steady tail, and a p50 the fastest's cannot be told
    apart from (matrix/judge/noise.py: their noise bands' ratio does not lie beyond SAME_SPEED). Emulated
    adapters' latency is no latency: they all count as equally fast."""
    timed = [c for c in choices if not c.emulated and c.p50_us is not None]
    if not timed:
        return choices
    steady = [c for c in timed if not _unsteady(c, timed)]
    fastest = min(steady, key=_p50)
    return [c for c in steady if not _slower(c, fastest)]


def _equally_close(choices: list[DecisionChoice]) -> list[DecisionChoice]:
    """The configurations that count as the closest to the reference: those whose distance from it can be as small
    as the closest's can be large. Return deltas are judged with their paired intervals (0.00351 and 0.00352, each
    within about [-0.004, +0.011], cannot be told apart); drift and disagreement are exact, so only equal ones tie."""
    reach = _gap_band(min(choices, key=_quality_gap))[1]
    return [c for c in choices if _gap_band(c)[0] <= reach]


def _gap_band(choice: DecisionChoice) -> tuple[float, float]:
    """The nearest and farthest the configuration's distance from the reference can be: |return delta| over its
    paired interval (0 when the interval holds 0), else its quality gap both ways."""
    low, high = choice.return_delta_low, choice.return_delta_high
    if choice.return_delta is None or low is None or high is None:
        gap = _quality_gap(choice)
        return gap, gap
    return (0.0 if low <= 0 <= high else min(abs(low), abs(high))), max(abs(low), abs(high))


def _slower(choice: DecisionChoice, fastest: DecisionChoice) -> bool:
    """Measurably slower than `fastest`: by the noise bands when both have one, else by SAME_SPEED alone."""
    bands = [_band(c) for c in (fastest, choice)]
    if None in bands:
        return _p50(choice) > _p50(fastest) * (1 + SAME_SPEED)
    return noise.differs(noise.ratio_band(*bands), SAME_SPEED)


def _band(choice: DecisionChoice) -> tuple[float, float] | None:
    low, high = choice.p50_low_us, choice.p50_high_us
    return (low, high) if low is not None and high is not None else None


def _unsteady(choice: DecisionChoice, timed: list[DecisionChoice]) -> bool:
    best_tail = min((c.p99_us for c in timed if _tail_measured(c)), default=None)
    return bool(best_tail and _tail_measured(choice) and choice.p99_us > TAIL_FACTOR * best_tail)


def _tail_measured(choice: DecisionChoice) -> bool:
    """Its p99 is more than its slowest call (TAIL_CALLS); a choice read from results written before the count was
    recorded is judged as it was then."""
    return bool(choice.p99_us) and (choice.timed_calls is None or choice.timed_calls >= TAIL_CALLS)


def _simplicity(choice: DecisionChoice, defaults: dict[str, str]) -> tuple:
    """Ties go to the simpler configuration: no preparation, the first model before a candidate, fp32 before
    fp16 before int8, fewer threads, fewer knobs away from the runtime's own default (`defaults`: ort's opt=all,
    LiteRT's xnnpack=on); then the smaller file, then the faster p50."""
    threads = choice.settings.get("threads", "")
    away = sum(value != defaults.get(knob) for knob, value in choice.settings.items())
    return (bool(choice.fix), bool(choice.candidate), VARIANT_ORDER.get(choice.variant, len(VARIANT_ORDER)),
            int(threads) if threads.isdigit() else 0, away, _or_inf(choice.size_bytes), _p50(choice))


def _knob_defaults(target: str) -> dict[str, str]:
    """The value each of the target's runtime knobs takes when unset (targets.base.Knob.default); {} for a target
    this tool does not know (a merged shard's from another release of it)."""
    import targets  # the registry imports a target's module on lookup: only for a target that ran

    name = base_name(target)
    if name not in targets.WHERE:
        return {}
    return {knob: spec.default for knob, spec in targets.get(name).knobs.items() if spec.default}


def _why_best(best: DecisionChoice, rivals: list[DecisionChoice], prefer: str) -> str:
    others = [c for c in rivals if c is not best]
    if not others:
        return "the only configuration left that qualifies" if best.fix else "the only configuration that qualifies"
    if prefer == "size":
        return f"smallest file of {len(rivals)} that qualify"
    if prefer == "accuracy":
        tied = [c for c in _equally_close(_weighed(rivals)) if c is not best]
        if tied:
            within = " (return deltas within each other's intervals)" if best.return_delta is not None else ""
            return f"as close to the reference as {len(tied)} other{'s' if len(tied) > 1 else ''}{within}; the simplest"
        return f"closest to the reference of {len(rivals)} that qualify"
    if best.emulated:
        return "emulated latency does not rank: the simplest configuration of those that qualify"
    weighed = _weighed(rivals)
    below = f" ({len(rivals) - len(weighed)} more rank lower: a WARN or a graph preparation)" if len(weighed) < len(rivals) else ""
    if len(weighed) == 1:
        return f"the best placed of {len(rivals)} that qualify{below}"
    notes = below + _tails_not_compared(weighed)
    tied = [c for c in _equally_fast(weighed) if c is not best]
    if tied:
        return f"as fast as {len(tied)} other{'s' if len(tied) > 1 else ''} (p50s within their noise); the simplest{notes}"
    faster = [c for c in weighed if not c.emulated and _p50(c) < _p50(best)]  # set aside for their tail
    if faster:
        return (f"fastest p50 with a steady tail: {len(faster)} with a faster p50 had a p99 more than "
                f"{TAIL_FACTOR:g}x the best{notes}")
    return f"fastest p50 of {len(weighed)} that qualify{notes}"


def _tails_not_compared(choices: list[DecisionChoice]) -> str:
    few = sorted({c.timed_calls for c in choices if c.p99_us and not c.emulated and not _tail_measured(c)})
    if not few:
        return ""
    calls = f"{few[0]}" if len(few) == 1 else f"{few[0]}-{few[-1]}"
    return f"; tails not compared where a p99 rests on {calls} timed calls, fewer than {TAIL_CALLS} (--iters)"


def _why_not(worse: DecisionChoice, better: DecisionChoice, prefer: str) -> str:
    """Why `worse` ranks below `better`, in the order _best applies its rules."""
    if worse.fix and not better.fix:
        return "needs a graph preparation; one that needs none qualifies"
    if worse.verdict != "PASS" and better.verdict == "PASS":
        return f"{worse.verdict}, and a PASS qualifies"
    if prefer == "size" and _or_inf(worse.size_bytes) > _or_inf(better.size_bytes):
        return f"larger: {_size_or_dash(worse.size_bytes)} vs {_size_or_dash(better.size_bytes)}"
    if prefer == "accuracy" and _gap_band(worse)[0] > _gap_band(better)[1]:
        return f"further from the reference: {_gap_text(worse)} vs {_gap_text(better)}"
    if prefer == "latency" and not worse.emulated and worse.p50_us is not None:
        if _unsteady(worse, [worse, better]):
            return f"p99 {duration(worse.p99_us)} vs {duration(better.p99_us)}: a tail more than {TAIL_FACTOR:g}x worse"
        if better.p50_us is not None and _slower(worse, better):
            return f"slower: p50 {duration(worse.p50_us)} vs {duration(better.p50_us)}"
    return "as good on the preferred measure; the simpler configuration wins the tie"


def _gap_text(choice: DecisionChoice) -> str:
    if choice.return_delta is not None:
        return f"|return delta| {abs(choice.return_delta):.3g}"
    if choice.drift is not None:
        return f"drift {choice.drift:.1e}"
    return f"disagreement {_quality_gap(choice):.2%}"


def _size_or_dash(nbytes: float | None) -> str:
    return "–" if nbytes is None else size_text(nbytes)


def _p50(choice: DecisionChoice) -> float:
    """Emulated latency never decides: every emulated configuration counts as equally fast (as fast as any)."""
    return 0.0 if choice.emulated else _or_inf(choice.p50_us)


def _quality_gap(choice: DecisionChoice) -> float:
    """Distance from the reference's behaviour: the return delta when rollouts ran, else the drift
    (or, for a discrete policy, the share of actions that differ)."""
    if choice.return_delta is not None:
        return abs(choice.return_delta)
    if choice.drift is None and choice.agreement is not None:
        return 1 - choice.agreement
    return _or_inf(choice.drift)


def _or_inf(value: float | None) -> float:
    return math.inf if value is None else value


def _distance(choice: DecisionChoice, budgets: list[Budget]) -> tuple:
    """Closest to the budget: quality first, then fewest misses, then the smallest relative overshoot."""
    quality = any(miss.startswith(("quality", "int8")) for miss in choice.misses)
    return (quality, len(choice.misses), _overshoot(choice, budgets), _p50(choice))


def _overshoot(choice: DecisionChoice, budgets: list[Budget]) -> float:
    measured = [(_measured(choice, b.metric), b.limit) for b in budgets]
    return sum(max(0.0, value / limit - 1) for value, limit in measured if value is not None)


def duration(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    return f"{us / 1e3:.3g} ms" if us >= 1e3 else f"{us:.3g} µs"


def size_text(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.3g} B"  # a limit of 1.5 B is not "2 B"


def configuration(choice: DecisionChoice, model_name: str) -> str:
    """e.g. "student.onnx fp32 threads=2": the first model is named by its file."""
    return " ".join(part for part in (choice.candidate or model_name, choice.variant, settings_label(choice.settings)) if part)


def evidence(choice: DecisionChoice) -> str:
    parts = []
    if choice.p50_us is not None:
        tail = f" / p99 {duration(choice.p99_us)}" if choice.p99_us is not None else ""
        parts.append(f"p50 {duration(choice.p50_us)}{tail} at batch {choice.batch}"
                     + (" (emulated: not a real latency)" if choice.emulated else ""))
    if choice.size_bytes is not None:
        parts.append(f"size {size_text(choice.size_bytes)}")
    if choice.drift is not None:
        parts.append(f"drift {choice.drift:.1e}")
    if choice.agreement is not None:  # a discrete action: agreement and flips, never "drift"
        parts.append(f"agreement {choice.agreement:.1%} ({choice.flips} flip{'s' if choice.flips != 1 else ''})")
    if choice.return_delta is not None:
        parts.append(f"return delta {return_delta_text(choice)}")
    return ", ".join(parts + choice.flags)


def return_delta_text(choice: DecisionChoice) -> str:
    """e.g. "+0.3 [-1.2, +1.8]": the mean paired return difference and its interval, when there is one."""
    mean, bounds = return_delta_parts(choice)
    return f"{mean} [{bounds[0]}, {bounds[1]}]" if bounds else mean


def return_delta_parts(choice: DecisionChoice) -> tuple[str, tuple[str, ...]]:
    """("+0.3", ("-1.2", "+1.8")): the mean paired return difference ("–" when none) and its interval's bounds
    (none when there is no interval)."""
    if choice.return_delta is None:
        return "–", ()
    if choice.return_delta_low is None or choice.return_delta_high is None:
        return f"{choice.return_delta:+.3g}", ()
    return f"{choice.return_delta:+.3g}", (f"{choice.return_delta_low:+.3g}", f"{choice.return_delta_high:+.3g}")


def shipped_as(choice: DecisionChoice, model_name: str) -> str:
    """What ships: the configuration, and the preparation it needs when it passes only after one."""
    shown = configuration(choice, model_name)
    return f"{shown} after {choice.fix} -> {choice.prepared_onnx}" if choice.fix else shown


def headline(decision: Decision, model_name: str) -> str:
    """The decision in one line: what ships and why, or why nothing does."""
    if decision.chosen:
        line = f"ship {shipped_as(decision.chosen, model_name)} ({evidence(decision.chosen)}): {decision.chosen.why}"
        return f"not deployment-ready ({'; '.join(decision.not_ready)}); best measured: {line}" if decision.not_ready else line
    if decision.closest:
        nothing = "nothing meets the budget" if decision.budgets else "nothing passes"
        hint = "" if decision.budgets else f" ({_assist_hint(decision)})"
        return (f"{nothing}; closest: {shipped_as(decision.closest, model_name)} "
                f"({'; '.join(decision.closest.misses)}){hint}")
    # only a target a budget names is decided with no cell that ran the policy (decide_all); each cell's row says why
    return f"nothing ran the policy on this target (every cell SKIP or CONVERTED): no configuration was held to {', '.join(decision.budgets)}"


def _assist_hint(decision: Decision) -> str:
    """What --assist can still do when nothing passes: try it, or what it tried and found no fix in."""
    if decision.fixes_tried:
        tried = "; ".join(f"on {label}: {', '.join(names)}" for label, names in decision.fixes_tried.items())
        said = f"--assist found no fix: tried {tried}"
    elif decision.assisted:
        said = "--assist tried no graph preparation on these cells"
    else:
        return "try --assist"
    return said + ("; a candidate's cells are not prepared" if any(c.candidate for c in decision.configurations) else "")


def runner_up_line(decision: Decision, model_name: str) -> str:
    runner_up = decision.runner_up
    return f"runner-up {shipped_as(runner_up, model_name)}: {runner_up.lost}" if runner_up else ""


def summary_lines(results: RunResults) -> list[str]:
    """One plain line per target: what to ship and why (and the runner-up and why it lost), or why nothing ships."""
    name = str(results.model.get("name", "the model"))
    multi_host = len(results.hosts) > 1
    lines = []
    for decision in results.decision:
        where = f"{decision.host} {decision.target}" if multi_host else decision.target
        line = f"decision {where}: {headline(decision, name)}"
        if decision.runner_up:
            line += f"; {runner_up_line(decision, name)}"
        lines.append(line)
    return lines
