"""Scripts run by path (matrix/reference/source_runner.py in the user's interpreter, the converters' scripts in targets/)
put their own folder first on sys.path: a module there named like a standard-library one replaces it for
every import in that process (a matrix/bisect.py broke `import random` in the source runner)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("package", ["matrix", "targets"])
def test_no_module_shadows_the_standard_library(package):
    names = {path.stem for path in (ROOT / package).rglob("*.py")}  # each subpackage's folder is a script's first entry too
    assert names & sys.stdlib_module_names - {"__main__"} == set()
