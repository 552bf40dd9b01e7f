# One-line entry points; each sets up .venv on a fresh machine first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test demo serve bench lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@echo "Installing snapcache and llama-cpp-python (the first build of llama.cpp takes several minutes)..."
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(BIN)/python -m pip install --quiet -e ".[dev,demo,server]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

# The main job: warm the system prompt with the command line, then one chat turn cold and restored.
demo: $(STAMP)
	$(BIN)/snapcache warm examples/system_prompt.txt --scope demo --priority 10
	$(BIN)/python examples/demo.py

# The OpenAI-compatible server on the demo model, on http://127.0.0.1:8000/v1 (Ctrl-C stops it).
serve: $(STAMP)
	$(BIN)/snapcache serve

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

lint: $(STAMP)
	$(BIN)/ruff check snapcache cli tests benchmarks examples
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
