"""What to ship per target: the cheapest measured configuration that meets every budget.

A configuration is one cell: (candidate, variant, settings) on a target. It
meets the quality bar when its verdict is PASS or WARN (drift within tolerance,
the action contract, and the return tolerance when rollouts ran), and it is not
an "int8" artifact with nothing quantized. Budgets add limits per target:
`--budget 'ort-cpu=p50:200us'`, `'*=p99:2ms'`, `'tflite=size:1MB'` (latency at
the smallest timed batch). Among configurations meeting all of them (a PASS
before a WARN), `--prefer` orders: latency (the fastest; p50s within SAME_SPEED of it count as equally
fast, and the smaller artifact wins among those), size, or accuracy. Emulated
adapters' latency never decides: it cannot meet a latency budget and does not
rank. When nothing meets the budget, the closest configuration is named with
what it misses.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections import defaultdict
from dataclasses import dataclass

from .errors import InputError
from .results import Cell, Decision, DecisionChoice, RunResults

PREFER = ("latency", "size", "accuracy")
METRICS = ("p50", "p99", "size")
SAME_SPEED = 0.10  # p50s within 10% of the fastest count as equally fast
_LATENCY_UNITS = {"ns": 1e-3, "us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6}
_SIZE_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
_AMOUNT = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e[-+]?\d+)?)\s*([a-zµ]*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Budget:
    targets: str  # a target name or glob
    metric: str  # p50 | p99 (µs) | size (bytes)
    limit: float

    def applies_to(self, target: str) -> bool:
        return fnmatch.fnmatchcase(target, self.targets)

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
    if not math.isfinite(limit) or limit <= 0:
        raise InputError(f"--budget {item!r}: the limit must be above 0")
    return Budget(pattern.strip(), metric, limit)


def check_budget_targets(budgets: list[Budget], targets: list[str]) -> None:
    for budget in budgets:
        if not any(budget.applies_to(name) for name in targets):
            raise InputError(f"--budget {budget.targets}={budget.metric}:…: matches none of the selected targets ({', '.join(targets)})")


def decide_all(results: RunResults, budgets: list[Budget], prefer: str = "latency") -> list[Decision]:
    by_target: dict[tuple[str, str], list[Cell]] = defaultdict(list)
    for cell in results.cells:
        if cell.verdict != "SKIP" and cell.predicts and cell.target != "source":  # the training framework is not shipped
            by_target[(cell.host, cell.target)].append(cell)
    behaviour = "rollout" in results.settings
    return [decide_target(host, target, cells, [b for b in budgets if b.applies_to(target)], prefer, behaviour)
            for (host, target), cells in sorted(by_target.items())]


def decide_target(host: str, target: str, cells: list[Cell], budgets: list[Budget], prefer: str,
                  behaviour: bool = False) -> Decision:
    choices = [_choice(cell, budgets) for cell in cells]
    meeting = [c for c in choices if not c.misses]
    ranked = _ranked(meeting, prefer)
    decision = Decision(host=host, target=target, prefer=prefer, budgets=[b.describe() for b in budgets],
                        considered=len(choices), quality_bar=_quality_bar(behaviour))
    if ranked:
        decision.chosen = ranked[0]
        decision.runner_up = ranked[1] if len(ranked) > 1 else None
    elif choices:
        decision.closest = min(choices, key=lambda choice: _distance(choice, budgets))
    return decision


def _quality_bar(behaviour: bool) -> str:
    if behaviour:
        return ("the return tolerance against the first model's float64 reference (a candidate's single-step drift "
                "is shown, not judged) and the action contract")
    return "the drift tolerance against the first model's float64 reference and the action contract (behaviour not measured: no --env)"


def _choice(cell: Cell, budgets: list[Budget]) -> DecisionChoice:
    timed = min(cell.latency, key=lambda s: s.batch) if cell.latency else None
    emulated = bool(cell.backend and cell.backend.emulated)
    choice = DecisionChoice(
        candidate=cell.candidate, variant=cell.variant, settings=cell.settings, verdict=cell.verdict,
        batch=timed.batch if timed else None, p50_us=timed.p50_us if timed else None, p99_us=timed.p99_us if timed else None,
        size_bytes=cell.artifact.size_bytes if cell.artifact else None, drift=_drift(cell),
        return_delta=cell.rollout.return_delta if cell.rollout else None, emulated=emulated,
    )
    choice.misses = _quality_misses(cell) + [miss for budget in budgets if (miss := _budget_miss(choice, budget))]
    return choice


def _drift(cell: Cell) -> float | None:
    """Continuous: max |Δ|; discrete only: the share of actions that differ from the reference."""
    if cell.max_drift is not None:
        return cell.max_drift
    agreement = [p.agreement for p in cell.parity if p.agreement is not None]
    return 1 - min(agreement) if agreement else None


def _quality_misses(cell: Cell) -> list[str]:
    if cell.verdict not in ("PASS", "WARN"):
        return [f"quality: {cell.verdict}" + (f" ({cell.reasons[0]})" if cell.reasons else "")]
    if any(check.ok is False for check in cell.contract):
        return ["quality: the action contract is broken"]
    if unquantized_int8(cell):
        return ["int8 in name only: nothing quantized"]
    return []


def unquantized_int8(cell: Cell) -> bool:
    """An "int8" artifact with nothing quantized is never recommended as int8."""
    counted = cell.artifact.quantization if cell.artifact else None
    return cell.variant == "int8" and counted is not None and not (counted.get("quantized_ops") or counted.get("quantized_weights"))


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


def _ranked(meeting: list[DecisionChoice], prefer: str) -> list[DecisionChoice]:
    """Best first: the best of all, then the best of the rest (the runner-up), and so on."""
    rest, ranked = list(meeting), []
    while rest:
        best = _best(rest, prefer)
        ranked.append(best)
        rest.remove(best)
    return ranked


def _best(choices: list[DecisionChoice], prefer: str) -> DecisionChoice:
    choices = [c for c in choices if c.verdict == "PASS"] or choices  # a clean PASS beats a WARN
    if prefer == "size":
        return min(choices, key=lambda c: (_or_inf(c.size_bytes), _p50(c), _quality_gap(c)))
    if prefer == "accuracy":
        return min(choices, key=lambda c: (_quality_gap(c), _p50(c), _or_inf(c.size_bytes)))
    fastest = min((_p50(c) for c in choices if not c.emulated), default=math.inf)
    fast_enough = [c for c in choices if c.emulated or _p50(c) <= fastest * (1 + SAME_SPEED)]
    return min(fast_enough, key=lambda c: (_or_inf(c.size_bytes), _p50(c), _quality_gap(c)))


def _p50(choice: DecisionChoice) -> float:
    """Emulated latency never decides: every emulated configuration counts as equally fast (as fast as any)."""
    return 0.0 if choice.emulated else _or_inf(choice.p50_us)


def _quality_gap(choice: DecisionChoice) -> float:
    """Distance from the reference's behaviour: the return delta when rollouts ran, else the drift."""
    if choice.return_delta is not None:
        return abs(choice.return_delta)
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
    return f"{nbytes:.0f} B"


def configuration(choice: DecisionChoice, model_name: str) -> str:
    """e.g. "student.onnx fp32 threads=2": the first model is named by its file."""
    settings = ",".join(f"{knob}={value}" for knob, value in sorted(choice.settings.items()))
    return " ".join(part for part in (choice.candidate or model_name, choice.variant, settings) if part)


def evidence(choice: DecisionChoice) -> str:
    parts = []
    if choice.p50_us is not None:
        parts.append(f"p50 {duration(choice.p50_us)} / p99 {duration(choice.p99_us)} at batch {choice.batch}"
                     + (" (emulated: not a real latency)" if choice.emulated else ""))
    if choice.size_bytes is not None:
        parts.append(f"size {size_text(choice.size_bytes)}")
    if choice.drift is not None:
        parts.append(f"drift {choice.drift:.1e}")
    if choice.return_delta is not None:
        parts.append(f"return delta {choice.return_delta:+.3g}")
    return ", ".join(parts)


def summary_lines(results: RunResults) -> list[str]:
    """One plain line per target: what to ship, or that nothing meets the budget and what came closest."""
    name = str(results.model.get("name", "the model"))
    multi_host = len(results.hosts) > 1
    lines = []
    for decision in results.decision:
        where = f"{decision.host} {decision.target}" if multi_host else decision.target
        if decision.chosen:
            line = f"decision {where}: ship {configuration(decision.chosen, name)} ({evidence(decision.chosen)})"
            if decision.runner_up:
                line += f"; runner-up {configuration(decision.runner_up, name)}"
        elif decision.closest:
            line = (f"decision {where}: nothing meets the budget; closest: {configuration(decision.closest, name)} "
                    f"({'; '.join(decision.closest.misses)})")
        else:
            line = f"decision {where}: nothing measured"
        lines.append(line)
    return lines
