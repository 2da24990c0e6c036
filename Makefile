# The two commands a newcomer runs: `make run` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
SIM ?= h200x2

.PHONY: run test lint unit gpu bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/nodeagent --simulate $(SIM) status

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --strict nodeagent
	$(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest

gpu: $(STAMP)
	$(BIN)/python -m pytest -m gpu tests/gpu

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
