"""`matrix` imports `targets`, never the other way round: the runtime seam is the lower layer, and shared
types (the schema records a target reports, the cache location) live there. Read from the source with
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
