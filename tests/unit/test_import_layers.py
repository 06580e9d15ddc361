"""`matrix` imports `targets`, never the other way round: the runtime seam is the lower layer, and shared
types (the schema records a target reports, the cache location) live there. Inside `matrix`, the stages'
subpackages keep their order where it matters: the report is made from RunResults alone (it never runs,
references or loads anything), and no stage reaches up into the command line. Read from the source with
`ast`, function-local imports included, so a cycle cannot hide inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("matrix", "targets")


def _imported_packages(path: Path, package: str) -> set[str]:
    """The top-level packages a module imports (a relative import stays inside its own package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add(package if node.level else (node.module or "").partition(".")[0])
    return found & set(PACKAGES)


def package_edges() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) -> the modules that make that edge, for edges between the two packages."""
    edges: dict[tuple[str, str], list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for other in _imported_packages(path, package) - {package}:
                edges.setdefault((package, other), []).append(str(path.relative_to(ROOT)))
    return edges


def test_targets_never_import_matrix():
    assert package_edges().get(("targets", "matrix"), []) == []


def test_the_check_sees_an_import_made_inside_a_function(tmp_path):
    module = tmp_path / "late.py"
    module.write_text("def f():\n    from matrix.errors import InputError\n    return InputError\n")
    assert _imported_packages(module, "targets") == {"matrix"}


def _stage_imports(path: Path) -> set[str]:
    """The subpackages of `matrix` a module in it imports (relative and absolute imports alike)."""
    here = path.relative_to(ROOT).with_suffix("").parts[:-1]  # e.g. ("matrix", "report")
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(here[: len(here) - node.level + 1]) + (node.module.split(".") if node.module else [])
                names = [base + [alias.name] for alias in node.names]
            else:
                names = [(node.module or "").split(".") + [alias.name] for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name.split(".") for alias in node.names]
        else:
            continue
        found |= {f"matrix/{name[1]}" for name in names
                  if name[0] == "matrix" and len(name) > 1 and name[1] and (ROOT / "matrix" / name[1] / "__init__.py").exists()}
    return found


def stage_edges(stage: str) -> set[str]:
    """The `matrix/<subpackage>` folders that modules of `matrix/<stage>` import."""
    return {imported for path in (ROOT / "matrix" / stage).rglob("*.py") for imported in _stage_imports(path)} - {f"matrix/{stage}"}


def test_the_report_never_runs_references_or_loads():
    assert stage_edges("report") & {"matrix/inputs", "matrix/reference", "matrix/run", "matrix/cli"} == set()


def test_no_stage_reaches_up_into_the_command_line():
    stages = [path.name for path in (ROOT / "matrix").iterdir() if (path / "__init__.py").exists() and path.name != "cli"]
    assert {stage: sorted(edges) for stage in stages if (edges := stage_edges(stage) & {"matrix/cli"})} == {}


def test_the_stage_check_sees_relative_imports():
    module = ROOT / "matrix" / "report" / "report.py"
    assert "matrix/decide" in _stage_imports(module) and "matrix/judge" in _stage_imports(module)
