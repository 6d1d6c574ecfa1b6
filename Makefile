# The two commands: `make run` and `make test`. Each does its own set-up from a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test install services lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

services:
	bash scripts/ensure_services.sh

lint: install
	$(VENV)/bin/ruff check .
	$(PY) scripts/check_architecture.py

test: install services lint
	$(PY) -m pytest

run: install
	mkdir -p var
	$(VENV)/bin/tenure db upgrade
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/honcho start

clean:
	rm -rf $(VENV) var/*.db var/*.db-wal var/*.db-shm
