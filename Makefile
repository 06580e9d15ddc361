# policy-matrix: `make matrix` runs the bundled example (or MODEL=...), `make test` runs the tests.
# Setup is idempotent: the core is reinstalled when pyproject.toml changes (stamp under .stamps/);
# every other group is `policy-matrix setup GROUP`, which installs only what is missing.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
MODEL  ?= matrix/example_policies/continuous_mlp.onnx
ARGS   ?=
PYTEST_ARGS ?=
# `make test` runs on every core (pytest-xdist); a module whose tests share a module-scoped fixture stays on one
# worker (tests/conftest.py), so browsers, conversions and shared CLI runs are started once. `make test-fast` stays
# in one process: each worker collects the whole suite (~10 s of imports), more than the unit tier gains.
PYTEST_WORKERS ?= -n auto --dist loadgroup
SHARDS ?=
OUT    ?= reports/merged
BASELINE ?=
# `make matrix` shows the report whatever the verdicts; FAIL_ON=fail makes FAILed cells fail make.
FAIL_ON ?= never
# One path as one shell word, whatever it holds (a space, a quote): MODEL, OUT and BASELINE name one file each;
# ARGS and SHARDS are lists, split on spaces by design.
quote = '$(subst ','\'',$(1))'

.PHONY: setup setup-core setup-web setup-tflite setup-coreml setup-frameworks matrix examples frameworks test test-fast merge clean

setup: setup-core setup-web setup-tflite setup-coreml

# The package's own modules compiled once (only what changed since): a machine that sets PYTHONDONTWRITEBYTECODE
# (CI images do) would otherwise compile them from source in every process, ~0.3 s of each run.
setup-core: .stamps/core
	@$(BIN)/python -m compileall -q matrix targets

.stamps/core: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,tflite,tract,rl,assist]'
	@mkdir -p .stamps && touch $@

# Every group's setup is `policy-matrix setup GROUP` (the same command pip users run):
# it checks first and installs only what is missing, so a second `make setup` is quiet.
# web:    npm ci of web_harness/package-lock.json, Python Playwright, a Chromium
# tflite: the onnx2tf conversion environment (~2.6 GB, ~2 min; Linux only)
# coreml: the CoreML conversion environment (CPU torch + onnx2torch + coremltools, ~1.1 GB)
# The converter environments live in the policy-matrix cache, keyed by pins and Python.
setup-coreml: setup-core
	@$(BIN)/policy-matrix setup coreml

setup-tflite: setup-core
	@$(BIN)/policy-matrix setup tflite

# The RL framework dry-run: each framework's default policies, exported the way it documents, on every target.
# Its environments are opt-in (several GB, never part of `make setup`): `policy-matrix setup frameworks` builds them once.
setup-frameworks: setup
	@$(BIN)/policy-matrix setup frameworks

frameworks: setup-frameworks
	$(BIN)/policy-matrix frameworks $(ARGS)

matrix: setup
	$(BIN)/policy-matrix run $(call quote,$(MODEL)) --fail-on $(FAIL_ON) $(ARGS)

examples: setup
	$(BIN)/python -m matrix.inputs.examples

test: setup
	$(BIN)/python -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The unit tier: pure functions on saved fixtures (tests/unit, tests/fixtures), under a minute, with no
# browser, converter environment or CLI subprocess; only the core install is needed.
FAST_MARKERS := not browser and not tflite_env and not coreml_env and not slow
test-fast: setup-core
	$(BIN)/python -m pytest -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

# Merge shards (one results.json per host) into one report; BASELINE=old/results.json flags regressions.
merge: setup-core
	$(BIN)/policy-matrix merge $(SHARDS) --out $(call quote,$(OUT)) $(if $(BASELINE),--baseline $(call quote,$(BASELINE)))

clean:
	rm -rf reports .stamps build *.egg-info .pytest_cache

setup-web: setup-core
	@$(BIN)/policy-matrix setup web
