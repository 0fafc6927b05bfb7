# reroll — the two commands a new user needs: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
UV := $(BIN)/uv
# pytest-xdist workers of `make test`; --dist loadfile runs each module on one worker, so its
# module fixtures (a recorded run, an installed agent) are built once, save the modules run in parts
# (one per sandbox backend, or per task: tests/conftest.py SPLIT_MODULES); --no-loadscope-reorder
# keeps the collection's order, which starts the slowest first (tests/conftest.py: SLOWEST_UNITS).
TEST_WORKERS ?= 3
# uv itself is bootstrapped with pip at the version uv.lock pins for it (the dev extra lists it).
UV_VERSION := $(shell sed -n '/^name = "uv"$$/{n;s/^version = "\(.*\)"$$/\1/p;}' uv.lock)

.PHONY: env bytecode sandbox-tools lock demo test test-fast check docs protos images clean

# The dependencies are installed compiled (--compile-bytecode: uv leaves that to the first import,
# which never writes them under PYTHONDONTWRITEBYTECODE, so that every reroll process, the shared
# proxy and model server included, would compile aiohttp, pydantic, rich... from source at each
# start). The versions installed are those of uv.lock (`make lock` re-resolves it after editing
# pyproject.toml's dependencies); uv comes from PyPI into the venv, so python3.11 is all it needs.
env: $(STAMP) bytecode sandbox-tools

# reroll's own sources compiled too: the install is editable, so uv compiles none of them, and
# under PYTHONDONTWRITEBYTECODE no import writes them (0.1 to 0.3 CPU-seconds of every reroll
# process's start: a command's, the shared proxy's, the model server's; docs/branch.md). compileall
# writes where the interpreter reads: beside the sources, or under PYTHONPYCACHEPREFIX when it is
# set; a file edited since is compiled in memory at each import until the next `make env`. The
# folders are pyproject.toml's packages.
BYTECODE_FOLDERS := controller contracts sidecar proxy protos
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 $(BYTECODE_FOLDERS)

# bubblewrap and passt for the isolated local sandbox (optional: without them `local` falls back
# to the plain sandbox and says so).
sandbox-tools:
	-scripts/install-sandbox-tools

$(UV):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet uv==$(UV_VERSION)

$(STAMP): pyproject.toml uv.lock | $(UV)
	UV_PROJECT_ENVIRONMENT=$(VENV) $(UV) sync --quiet --locked --inexact --extra dev --compile-bytecode
	touch $(STAMP)

lock: $(UV)
	$(UV) lock

AGENT ?= mini-swe-agent
SANDBOX ?= local
demo: env  # make demo AGENT=claude-code SANDBOX=docker: record, continue and replay the main job
	$(BIN)/python scripts/demo.py --agent $(AGENT) --sandbox $(SANDBOX)

test: env
	$(BIN)/python scripts/gen_protos.py --check
	-scripts/install-toxiproxy  # optional: the TCP fault tests skip (with the reason) without it
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

test-fast: env  # the edit loop: every in-process test (no slow or spawns mark), well under a minute
	$(BIN)/python -m pytest -q -p no:cacheprovider --fast

# ruff and mypy (strict, pyproject.toml) over the packages, the tests and the scripts, those without a
# .py suffix found by their python shebang (both check a folder's *.py files only).
PY_SCRIPTS = $(shell grep -rl '^\#!/usr/bin/env python' scripts | grep -v '\.py$$')
check: env
	$(BIN)/ruff check . $(PY_SCRIPTS) && $(BIN)/ruff format --check . $(PY_SCRIPTS) && $(BIN)/mypy controller/reroll contracts/reroll_contracts sidecar/reroll_sidecar proxy/reroll_proxy tests scripts $(PY_SCRIPTS)

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link or a page left out of
# the navigation fails the build. The CLI reference in it is generated from the typer app.
docs: env
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

images: env
	$(BIN)/python scripts/build-images

protos: env
	$(BIN)/python scripts/gen_protos.py

clean:
	rm -rf $(VENV) build dist site *.egg-info
