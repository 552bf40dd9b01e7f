# One-line entry points; each sets up .venv on a fresh machine first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test demo serve bench lint docs clean

# llama-cpp-python is built first, by build_flags.py: llama.cpp's native build, except on an x86-64
# CPU with AMX, whose AMX kernels crash (there: GGML_NATIVE=OFF and every other instruction set the
# CPU has). A CMAKE_ARGS you set wins. The wheel is kept per flags, never reused across them.
$(STAMP): pyproject.toml snapcache/llama/setup/build_flags.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python snapcache/llama/setup/build_flags.py install
	@echo "Installing snapcache and its dependencies..."
	$(BIN)/python -m pip install --quiet -e ".[dev,demo,server]"
	touch $(STAMP)

# Runs every time: a CMAKE_ARGS or CPU other than the installed build's rebuilds (or reuses) the wheel.
install: $(STAMP)
	@$(BIN)/python snapcache/llama/setup/build_flags.py install

test: install
	$(BIN)/python -m pytest

# The main job: warm the system prompt with the command line, then one chat turn cold and restored.
demo: install
	$(BIN)/snapcache warm examples/system_prompt.txt --scope demo --priority 10
	$(BIN)/python examples/demo.py

# The OpenAI-compatible server on the demo model, on http://127.0.0.1:8000/v1 (Ctrl-C stops it).
serve: install
	$(BIN)/snapcache serve

bench: install
	$(BIN)/python benchmarks/run_all.py

lint: $(STAMP)
	$(BIN)/ruff check snapcache cli tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/lint-imports

# The documentation site (docs/, mkdocs.yml) into build/site; broken links and references fail.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
