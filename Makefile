# flashtree — the two commands: `make demo` (set up + run the bundled pair) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo serve test test-slow bench clean

$(BIN)/flashtree: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

setup: $(BIN)/flashtree

demo: setup
	$(BIN)/flashtree generate "def fibonacci(n):\n" --method ddtree --max-tokens 96
	$(BIN)/flashtree generate "def fibonacci(n):\n" --method ar --max-tokens 96

serve: setup
	$(BIN)/flashtree serve

test: setup
	$(BIN)/python -m pytest -q

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

bench: setup
	$(BIN)/flashtree bench

clean:
	rm -rf $(VENV) .pytest_cache
