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

.PHONY: setup setup-core setup-tflite matrix examples test merge clean

setup: setup-core setup-tflite

setup-core: .stamps/core

.stamps/core: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,tflite]'
	@mkdir -p .stamps && touch $@

# The onnx2tf conversion environment (~2.6 GB, ~2 min), outside .venv because its pins
# clash with the core. It lives in the policy-matrix cache keyed by the requirements
# hash; the stamp holds its interpreter and is remade when the pins change or the
# cache was wiped. Linux only: onnx2tf 1.29.24 pins ai-edge-litert 2.1.0, which has
# no macOS wheel (the tflite targets then say so in `policy-matrix targets`).
TFLITE_PINS := targets/requirements/onnx2tf.txt

setup-tflite: setup-core
ifeq ($(shell uname -s),Linux)
	@test -x "$$(cat .stamps/tflite 2>/dev/null)" || rm -f .stamps/tflite
	@$(MAKE) --no-print-directory .stamps/tflite
else
	@echo "setup-tflite: skipped, the onnx2tf environment installs on Linux only"
endif

.stamps/tflite: $(TFLITE_PINS)
	@mkdir -p .stamps
	$(BIN)/python -c "from targets.tflite import build_environment; print(build_environment())" > $@.tmp
	@mv $@.tmp $@

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
