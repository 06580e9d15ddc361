# policy-matrix: `make matrix` runs the bundled example (or MODEL=...), `make test` runs the tests.
# Setup is idempotent: stamps under .stamps/ are remade only when their inputs change.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
MODEL  ?= matrix/example_policies/continuous_mlp.onnx
ARGS   ?=
PYTEST_ARGS ?=
SHARDS ?=
OUT    ?= reports/merged
BASELINE ?=
# `make matrix` shows the report whatever the verdicts; FAIL_ON=fail makes FAILed cells fail make.
FAIL_ON ?= never

.PHONY: setup setup-core setup-web setup-tflite setup-coreml matrix examples test merge clean

setup: setup-core setup-web setup-tflite setup-coreml

setup-core: .stamps/core

.stamps/core: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,tflite,tract,assist]'
	@mkdir -p .stamps && touch $@

# --- CoreML targets: coreml, coreml-cpu/-gpu/-ne/-all (targets/coreml.py) -----
# Its own environment (torch CPU + onnx2torch + coremltools, ~1.1 GB under the cache),
# built once per pin set: the env is keyed by the requirements file's hash. An env
# missing from the cache (cleared, new machine) invalidates the stamp.
setup-coreml: setup-core
	@$(BIN)/python -c 'from targets.coreml import ENV_NAME, REQUIREMENTS; from matrix.isolated_env import env_python; raise SystemExit(env_python(ENV_NAME, REQUIREMENTS) is None)' || rm -f .stamps/coreml
	@$(MAKE) --no-print-directory .stamps/coreml

.stamps/coreml: .stamps/core targets/requirements/coreml.txt
	$(BIN)/python -c 'from targets.coreml import build_environment; print(build_environment())'
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
	$(BIN)/policy-matrix run $(MODEL) --fail-on $(FAIL_ON) $(ARGS)

examples: setup
	$(BIN)/python -m matrix.examples

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Merge shards (one results.json per host) into one report; BASELINE=old/results.json flags regressions.
merge: setup-core
	$(BIN)/policy-matrix merge $(SHARDS) --out $(OUT) $(if $(BASELINE),--baseline $(BASELINE))

clean:
	rm -rf reports .stamps build *.egg-info .pytest_cache

# --- web targets: ort-web-wasm, ort-web-webgl, ort-web-webgpu, ort-node ---------
# npm packages pinned by web_harness/package-lock.json (onnxruntime-node's
# postinstall would download CUDA files: skipped), Python Playwright, and
# Debian's Chromium where this machine can install it (root + apt-get).
# A missing node_modules/ invalidates the stamp.
setup-web: setup-core
	@[ -f web_harness/node_modules/onnxruntime-web/package.json ] || rm -f .stamps/web
	@$(MAKE) --no-print-directory .stamps/web

.stamps/web: web_harness/package.json web_harness/package-lock.json web_harness/requirements.txt
	@if command -v npm >/dev/null; then \
		cd web_harness && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund --loglevel=error; \
	else \
		echo "setup-web: npm not found; ort-node and ort-web-* stay unavailable (install Node.js >= 18, then make setup)"; \
	fi
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r web_harness/requirements.txt
	@if for b in chromium chromium-browser google-chrome; do command -v $$b; done | grep -q .; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else \
		echo "setup-web: no Chromium; see web_harness/README.md for how to install one"; \
	fi
	@if [ -f web_harness/node_modules/onnxruntime-web/package.json ]; then mkdir -p .stamps && touch $@; fi
