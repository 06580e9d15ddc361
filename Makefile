# Minimal Makefile from the web branch; the lead's Makefile supersedes the
# generic parts (venv, test). Keep the "web targets" block when merging.
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
STAMPS := .stamps

.PHONY: setup test setup-web

setup: $(VENV)/bin/python setup-web

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[test]'

test: setup
	$(PYTHON) -m pytest -q

# --- web targets: ort-web-wasm, ort-web-webgl, ort-web-webgpu, ort-node --------
# npm packages (pinned by web_harness/package-lock.json; onnxruntime-node's
# postinstall would download CUDA files, so it is skipped), Python Playwright,
# and Debian's Chromium where this machine can install it (root + apt-get).
setup-web: $(VENV)/bin/python
	@[ -f web_harness/node_modules/onnxruntime-web/package.json ] || rm -f $(STAMPS)/web
	@$(MAKE) --no-print-directory $(STAMPS)/web

$(STAMPS)/web: web_harness/package.json web_harness/package-lock.json web_harness/requirements.txt
	@if command -v npm >/dev/null; then \
		cd web_harness && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund --loglevel=error; \
	else \
		echo "setup-web: npm not found; ort-node and ort-web-* stay unavailable (install Node.js >= 18, then rerun make setup)"; \
		exit 0; \
	fi
	$(VENV)/bin/pip install -q -r web_harness/requirements.txt
	@if command -v chromium >/dev/null || [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else \
		echo "setup-web: no Chromium; see web_harness/README.md for how to install one"; \
	fi
	@[ -f web_harness/node_modules/onnxruntime-web/package.json ] && mkdir -p $(STAMPS) && touch $@ || true
