# One-line entry points; each sets up .venv on a fresh machine first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The device environment: llama-cpp-python built for ggml's Vulkan backend, beside .venv. Its device
# tests run on any Vulkan device: a GPU, or Mesa's lavapipe (computing on the CPU) where there is none.
VULKAN_VENV ?= .venv-vulkan
VULKAN_BIN := $(VULKAN_VENV)/bin
VULKAN_STAMP := $(VULKAN_VENV)/.installed
SETUP := snapcache/llama/setup/build_flags.py

.PHONY: install test test-main test-device vulkan demo serve bench lint docs clean

# llama-cpp-python is built first, by build_flags.py: llama.cpp's native build, except on an x86-64
# CPU with AMX, whose AMX kernels crash (there: GGML_NATIVE=OFF and every other instruction set the
# CPU has). A CMAKE_ARGS you set wins. The wheel is kept per flags, never reused across them.
$(STAMP): pyproject.toml $(SETUP)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python $(SETUP) install
	@echo "Installing snapcache and its dependencies..."
	$(BIN)/python -m pip install --quiet -e ".[dev,demo,server]"
	touch $(STAMP)

# Runs every time: a CMAKE_ARGS or CPU other than the installed build's rebuilds (or reuses) the wheel.
install: $(STAMP)
	@$(BIN)/python $(SETUP) install

# Debian's Vulkan packages (apt-get, through sudo where not root), then the Vulkan build: 20-odd
# minutes on 2 cores the first time, seconds after that (the wheel is kept per flags).
$(VULKAN_STAMP): pyproject.toml $(SETUP)
	$(PYTHON) $(SETUP) debian-packages --backend vulkan
	$(PYTHON) -m venv $(VULKAN_VENV)
	$(VULKAN_BIN)/python -m pip install --quiet --upgrade pip
	$(VULKAN_BIN)/python $(SETUP) install --backend vulkan
	@echo "Installing snapcache and its dependencies into $(VULKAN_VENV)..."
	$(VULKAN_BIN)/python -m pip install --quiet -e ".[dev,server]"
	touch $(VULKAN_STAMP)

vulkan: $(VULKAN_STAMP)
	@$(VULKAN_BIN)/python $(SETUP) install --backend vulkan

# The whole suite: the main one on the CPU build, then the device suite on the Vulkan build.
test: test-main test-device

test-main: install
	$(BIN)/python -m pytest -m "not device"

test-device: vulkan
	$(VULKAN_BIN)/python -m pytest -m device tests/device

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
	rm -rf $(VENV) $(VULKAN_VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
