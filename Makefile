# policy-matrix: `make matrix` runs the bundled example (or MODEL=...), `make test` runs the tests.
# Setup is idempotent: stamps under .stamps/ are remade only when their inputs change.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
MODEL  ?= matrix/examples/continuous_mlp.onnx
ARGS   ?=
PYTEST_ARGS ?=
SHARDS ?=
OUT    ?= reports/merged
BASELINE ?=

.PHONY: setup setup-core setup-coreml matrix examples test merge clean

setup: setup-core setup-coreml

setup-core: .stamps/core

.stamps/core: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@mkdir -p .stamps && touch $@

# CoreML conversion environment (targets/coreml.py): torch CPU + onnx2torch + coremltools,
# ~1.1 GB under the cache, built once per pin set (the env is keyed by the file's hash).
setup-coreml: .stamps/coreml

.stamps/coreml: .stamps/core targets/requirements/coreml.txt targets/coreml.py
	$(BIN)/python -c 'from targets.coreml import build_environment; print(build_environment())'
	@mkdir -p .stamps && touch $@

matrix: setup
	$(BIN)/policy-matrix run $(MODEL) $(ARGS)

examples: setup
	$(BIN)/python -m matrix.examples

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Merge shards (one results.json per host) into one report; BASELINE=old/results.json flags regressions.
merge: setup-core
	$(BIN)/policy-matrix merge $(SHARDS) --out $(OUT) $(if $(BASELINE),--baseline $(BASELINE))

clean:
	rm -rf reports .stamps build *.egg-info .pytest_cache
