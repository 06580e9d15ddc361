"""`policy-matrix frameworks`: which RL framework's default policies, exported the way it documents,
reach which runtimes — measured, not recalled.

One module per framework (`*_export.py` beside this file) declares at its top what policy-matrix
reads (PACKAGE, VERSION, REQUIREMENTS, BASE, POLICIES, EXPORT) and below it how to build, train and
export each policy inside the framework's own environment (frameworks/environments.py). The module
and `_kit.py` are copied into each policy's folder and run there as scripts, so a folder is the
whole recipe: rerun it with that environment's python to rebuild the policy. Module names end in
`_export` so that, run as a script, a module never shadows the package it imports (keras, tianshou).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import InputError

MODULES = {
    "sb3": "sb3_export",
    "cleanrl": "cleanrl_export",
    "tianshou": "tianshou_export",
    "rsl_rl": "rsl_rl_export",
    "flax": "flax_export",
    "keras": "keras_export",
    "rllib": "rllib_export",
}
DEFAULT = tuple(MODULES)
FOLDER = Path(__file__).parent
KIT = FOLDER / "_kit.py"


@dataclass(frozen=True)
class Framework:
    name: str  # as on the command line: sb3, cleanrl, ...
    module: str  # its *_export module (file stem in this folder)
    package: str  # the pip package whose version is the variable (`sb3@2.4.1`)
    version: str  # pinned release ("" where the base environment's package is the version, as CleanRL's torch)
    requirements: tuple[str, ...]  # pins beyond the base environment, {version} replaced
    base: str | None  # "torch" (the Core ML environment's CPU torch), "tensorflow" (the onnx2tf environment) or None
    policies: dict[str, str]  # policy name -> Gymnasium task
    export: str  # the documented export path, in words
    unavailable: str = ""  # why this framework is a row without policies here (declared by its module)
    folder: Path = FOLDER  # where its module lives

    @property
    def label(self) -> str:
        """`rsl_rl 5.5.1`, `sb3 (stable-baselines3 2.9.2)`, `cleanrl (torch of the base)`."""
        if not self.version:
            return f"{self.name} ({self.package} of the base)"
        same = self.package.replace("-", "_").startswith(self.name) or self.name.startswith(self.package)
        return f"{self.name} {self.version}" if same else f"{self.name} ({self.package} {self.version})"

    @property
    def file(self) -> Path:
        return self.folder / f"{self.module}.py"

    def pins(self) -> list[str]:
        return [line.format(version=self.version) for line in self.requirements]


def load(name: str) -> Framework:
    module = importlib.import_module(f"{__name__}.{MODULES[name]}")
    return Framework(name=name, module=MODULES[name], package=module.PACKAGE, version=module.VERSION,
                     requirements=tuple(module.REQUIREMENTS), base=module.BASE, policies=dict(module.POLICIES),
                     export=module.EXPORT, unavailable=getattr(module, "UNAVAILABLE", ""))


def parse(text: str) -> list[Framework]:
    """`sb3@2.4.1,sb3,keras` -> frameworks, each at the release asked for (default: its pinned one)."""
    chosen = []
    for item in (part.strip() for part in text.split(",")):
        name, _, release = item.partition("@")
        if name not in MODULES:
            raise InputError(f"--frameworks {item!r}: unknown framework; known: {', '.join(MODULES)}")
        framework = load(name)
        if release:
            if not framework.version:
                raise InputError(f"--frameworks {item!r}: {name}'s version is its base environment's; no release to choose")
            if not all(part.isalnum() for part in release.split(".")):
                raise InputError(f"--frameworks {item!r}: a release is dotted numbers, e.g. {name}@{framework.version}")
            framework = replace(framework, version=release)
        chosen.append(framework)
    if not chosen or len({f.label for f in chosen}) != len(chosen):
        raise InputError(f"--frameworks {text!r}: name each framework (and release) once")
    return chosen
