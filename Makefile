# Two commands do everything on a fresh machine: `make reproduce` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.pipelab-installed

.PHONY: install test reproduce lab lint clean browser-deps notebooks

install: $(STAMP)

# torch/torchvision are pinned to the releases that install from this machine's disk (pip only).
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[notebooks,dev]'
	@touch $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy pipelab

# Debian's headless Chromium for tests/browser (installed if missing; those tests skip, saying why,
# when it cannot be installed, so a failure here does not stop `make test`).
browser-deps:
	-sh tests/browser/ensure_chromium.sh

test: $(STAMP) browser-deps
	$(PY) -m ruff check .
	$(PY) -m mypy pipelab
	OMP_NUM_THREADS=1 $(PY) -m pytest

reproduce: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pipelab.cli reproduce

# --allow-root only where we are root (containers); a person's browser opens on the printed URL.
# PYTHONPATH: the reproductions' notebooks import ``reproductions.*`` from the checkout's root.
lab: $(STAMP)
	PYTHONPATH=$(CURDIR) $(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) notebooks

# The notebooks' sources are the jupytext percent-format .py files beside them (jupytext.toml pairs
# them); this rewrites each stored .ipynb from its source, keeping cell ids and leaving outputs out.
NOTEBOOK_SOURCES = $(shell grep -l '^\#       format_name: percent' notebooks/*.py reproductions/*/*.py)

notebooks: $(STAMP)
	$(VENV)/bin/jupytext --to ipynb --update $(NOTEBOOK_SOURCES)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
