# policy-matrix: `make matrix` runs the bundled example (or MODEL=...), `make test` runs the tests.
# Setup is idempotent: stamps under .stamps/ are remade only when their inputs change.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
MODEL  ?= matrix/examples/continuous_mlp.onnx
ARGS   ?=
PYTEST_ARGS ?=

.PHONY: setup matrix examples test merge clean

setup: .stamps/python

.stamps/python: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@mkdir -p .stamps && touch $@

matrix: setup
	$(BIN)/policy-matrix run $(MODEL) $(ARGS)

examples: setup
	$(BIN)/python -m matrix.examples

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf reports .stamps build *.egg-info .pytest_cache
