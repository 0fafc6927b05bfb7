# reroll — the two commands a new user needs: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: env demo test check protos images clean

env: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: env
	$(BIN)/python scripts/demo.py

test: env
	$(BIN)/python scripts/gen_protos.py --check
	-scripts/install-toxiproxy  # optional: the TCP fault tests skip (with the reason) without it
	$(BIN)/python -m pytest -q -p no:cacheprovider

check: env
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy controller/reroll sidecar/reroll_sidecar proxy/reroll_proxy

images: env
	$(BIN)/python scripts/build-images

protos: env
	$(BIN)/python scripts/gen_protos.py

clean:
	rm -rf $(VENV) build *.egg-info
