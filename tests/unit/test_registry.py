"""The target registry (targets/__init__.py) names every target without importing it: a run pays only for the
targets it selects. Each name must lead to a target that calls itself by that name."""

from __future__ import annotations

import json
import subprocess
import sys

import targets


def test_each_registered_name_makes_the_target_of_that_name():
    assert [targets.REGISTRY[name].name for name in targets.REGISTRY] == list(targets.WHERE)
    assert targets.get("ort-cpu") is targets.get("ort-cpu")  # one instance per name: targets keep state (a started helper)


def test_listing_names_imports_no_target_module():
    probe = ("import json, sys, targets; names = list(targets.REGISTRY); targets.get('tract')\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.startswith('targets.'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    loaded = set(json.loads(done.stdout))
    assert "targets.tract_cpu" in loaded
    assert not loaded & {"targets.ort_cpu", "targets.ort_web", "targets.chromium", "targets.tflite", "targets.coreml"}, loaded
