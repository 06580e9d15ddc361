"""The configurations a run measures: candidates x targets x variants x runtime settings.

A deterministic grid, printed before it starts, never a learned search. Settings
are real runtime knobs each target declares (`Target.knobs`): `--settings
ort-cpu:threads=1,2 'ort-*:opt=basic,all'` gives each matched target the
product of its knobs' values. The grid is pruned: a knob a target does not have
is not run on it (a glob may match targets without that knob); a knob that no
selected target has, or a value a knob does not take, is a typo and exit 2.
"""

from __future__ import annotations

import fnmatch
import itertools
from dataclasses import dataclass, field

from targets.base import Settings, Target

from ..errors import InputError
from ..runtime_versions import base_name


@dataclass
class SettingsSpec:
    """One `TARGET:KNOB=V1,V2` as given (TARGET may be a glob)."""

    targets: str
    knob: str
    values: list[str]
    text: str


def parse(specs: list[str]) -> list[SettingsSpec]:
    parsed = []
    for text in specs:
        for item in text.split():  # matrix.toml lists arrive joined; one option may carry several
            pattern, colon, assignment = item.partition(":")
            knob, equals, values = assignment.partition("=")
            choices = [v.strip() for v in values.split(",") if v.strip()]
            if not colon or not equals or not pattern or not knob or not choices:
                raise InputError(f"--settings {item!r}: expected TARGET:KNOB=VALUE[,VALUE...], e.g. ort-cpu:threads=1,2")
            parsed.append(SettingsSpec(pattern, knob.strip(), list(dict.fromkeys(choices)), item))
    return parsed


@dataclass
class Grid:
    settings: dict[str, list[Settings]]  # per target: every combination to run ([{}]: defaults only)
    pruned: list[str] = field(default_factory=list)  # "knob on target": asked for, cannot apply

    def for_target(self, name: str) -> list[Settings]:
        return self.settings.get(name, [{}])

    def size(self, n_candidates: int, targets: list[str], variants: list[str]) -> int:
        return n_candidates * len(variants) * sum(len(self.for_target(name)) for name in targets)

    def describe(self) -> dict:
        return {"settings": {name: combos for name, combos in self.settings.items() if combos != [{}]},
                "pruned": self.pruned}


def build(specs: list[SettingsSpec], selected: list[Target]) -> Grid:
    values: dict[str, dict[str, list[str]]] = {target.name: {} for target in selected}
    pruned = []
    for spec in specs:
        # `ort-cpu:threads=1,2` also sets ort-cpu@1.20.1: releases of one target are compared under the same settings
        matched = [t for t in selected if any(fnmatch.fnmatchcase(name, spec.targets) for name in (t.name, base_name(t.name)))]
        if not matched:
            raise InputError(f"--settings {spec.text!r}: {spec.targets!r} matches none of the selected targets "
                             f"({', '.join(t.name for t in selected)})")
        having = [t for t in matched if spec.knob in t.knobs]
        if not having:
            known = sorted({knob for t in matched for knob in t.knobs})
            raise InputError(f"--settings {spec.text!r}: no selected target {spec.targets!r} has a knob {spec.knob!r}; "
                             f"known: {', '.join(known) or 'none (these targets have no settings)'}")
        pruned += [f"{spec.knob} on {t.name}" for t in matched if spec.knob not in t.knobs]
        for target in having:
            for value in spec.values:
                if problem := target.knobs[spec.knob].problem(value):
                    raise InputError(f"--settings {spec.text!r}: {target.name} {spec.knob} takes {problem}, not {value!r}")
            # one cell per distinct value: threads=1,01 is one setting, not two cells measuring the same thing
            values[target.name][spec.knob] = list(dict.fromkeys(_normal(target.knobs[spec.knob], v) for v in spec.values))
    return Grid({name: _combinations(knobs) for name, knobs in values.items() if knobs}, pruned)


def _normal(knob, value: str) -> str:
    return value if knob.choices else str(int(value))


def _combinations(knobs: dict[str, list[str]]) -> list[Settings]:
    names = sorted(knobs)
    return [dict(zip(names, chosen)) for chosen in itertools.product(*(knobs[name] for name in names))]
