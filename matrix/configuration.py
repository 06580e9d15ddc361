"""A cell's configuration: every axis one cell of the grid varies on, in one frozen type.

The run builds the grid as Configurations (orchestrate.py), a cell's spec and its folder
come from one (protocol.CellInputs.for_cell, `dir_name`), and everything that reads results
(resume, merge, compare, the decision, assist, the report) asks a cell for its Configuration
instead of taking the cell's fields apart. An axis is added here: its field, its place in
`key`, and how `label`, `axes` and `dir_name` show it; results.Cell stores the fields.

How results.json spells the axes (kept, so every earlier file reads the same): the release is
part of the target's label (`ort-cpu@1.20.1`, targets/versions.py), the settings are a dict,
the candidate a file name. `of` and `target_label` translate between the two.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

RELEASE_SEPARATOR = "@"  # TARGET@RELEASE: the label of a pinned runtime release


def settings_label(settings: Mapping[str, str]) -> str:
    """'opt=basic,threads=2': the knobs in a stable order ('' for the target's defaults)."""
    return ",".join(f"{knob}={value}" for knob, value in sorted(settings.items()))


@dataclass(frozen=True)
class Configuration:
    target: str  # the registered runtime, e.g. "ort-cpu" (never with a release)
    variant: str  # the artifact's precision: fp32, fp16, int8
    release: str = ""  # a pinned release of the target's runtime, e.g. "1.20.1" ("": the project's default)
    candidate: str = ""  # --candidate: the model's file name ("": the first model, the one under test)
    settings: tuple[tuple[str, str], ...] = field(default=())  # runtime knobs, sorted (empty: the target's defaults)
    preparation: str = ""  # a graph preparation the model went through first ("": as exported)
    device: str = ""  # where the runtime ran when not on this host (room for a remote device; "": this host)

    def __post_init__(self) -> None:
        if isinstance(self.settings, Mapping):  # given as the dict results.json and --settings use
            object.__setattr__(self, "settings", tuple(sorted(self.settings.items())))

    @classmethod
    def of(cls, target_label: str, variant: str, candidate: str = "", settings: Mapping[str, str] | None = None) -> Configuration:
        """From the fields results.json stores: the release comes off the target's label."""
        target, _, release = target_label.partition(RELEASE_SEPARATOR)
        return cls(target, variant, release=release, candidate=candidate, settings=dict(settings or {}))

    @property
    def target_label(self) -> str:
        """The target as cells, tables and results.json name it: 'ort-cpu', or 'ort-cpu@1.20.1' for a release."""
        return f"{self.target}{RELEASE_SEPARATOR}{self.release}" if self.release else self.target

    @property
    def knobs(self) -> dict[str, str]:
        """The runtime settings as the target's `open` takes them."""
        return dict(self.settings)

    @property
    def settings_label(self) -> str:
        return settings_label(self.knobs)

    @property
    def key(self) -> tuple[str, ...]:
        """Its identity: two cells of one host with equal keys are the same cell."""
        return (self.target, self.release, self.variant, self.candidate, self.settings_label, self.preparation, self.device)

    @property
    def axes(self) -> str:
        """The axes beyond target and variant that are not their defaults, e.g. 'student.onnx · threads=2' ('' plain)."""
        return " · ".join(part for part in (self.candidate, self.settings_label, self.preparation, self.device) if part)

    @property
    def label(self) -> str:
        """One line naming the cell, e.g. 'ort-cpu@1.20.1 fp32 student.onnx threads=2'."""
        return " ".join(part for part in (self.target_label, self.variant, self.candidate, self.settings_label,
                                          self.preparation, self.device) if part)

    @property
    def first_model_as_exported(self) -> bool:
        """The first model's graph as exported, run here (any settings, any release of its runtime): what --diagnose
        and --assist rerun."""
        return not (self.candidate or self.preparation or self.device)

    @property
    def dir_name(self) -> str:
        """Its folder under the run's cells/: readable for a plain cell; other axes add a short hash of their
        values (a user's file name or knob value never becomes a path)."""
        name = f"{self.target_label}-{self.variant}"
        extra = [self.candidate, self.knobs] + [axis for axis in (self.preparation, self.device) if axis]
        if not any(extra):
            return name
        return f"{name}-{hashlib.sha256(json.dumps(extra, sort_keys=True).encode()).hexdigest()[:10]}"
