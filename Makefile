# Two entry points that work on a fresh machine (Python 3.11 and network access to PyPI):
#   make run   -- set up, then run the whole pipeline once on embedded defaults
#   make test  -- set up, then run the test suite
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
TASK   ?= safe-pendulum
PRESET ?= demo

.PHONY: setup run test test-fast lint bench bench-env lock clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The lock (requirements/lock.txt) is complete, so it is installed without re-resolving.
# torch is installed on its own: `torch==2.13.0` takes the CPU wheel where one lies on disk
# (pip's find-links), and the build for the local platform elsewhere.
$(VENV)/.installed: $(BIN)/python pyproject.toml requirements/lock.txt
	$(BIN)/python -m pip install -q --upgrade "pip>=24" "uv==0.13.9"
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -r requirements/lock.txt
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/arl pipeline run --task $(TASK) --preset $(PRESET)

# Two pytest workers fill the two cores (the learners in tests run one thread each); `--dist loadfile`
# keeps a file's tests on one worker, so the slow learning tests build their datasets once.
test: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

test-fast: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow"

lint: setup
	$(BIN)/ruff check arl_models arl_cli tasks flows tests benchmarks
	$(BIN)/ruff format --check arl_models arl_cli tasks flows tests benchmarks
	$(BIN)/mypy arl_models

# Peer libraries for benchmarks get an environment of their own: d3rlpy 2.8.1 pins gymnasium==1.0.0,
# arl_models needs 1.4.0, so d3rlpy goes in without its pins (see benchmarks/README.md).
bench-env: setup
	test -x .venv-bench/bin/python || $(PYTHON) -m venv .venv-bench
	.venv-bench/bin/pip install -q torch==2.13.0
	echo "torch==2.13.0" > .venv-bench/torch-constraint.txt
	.venv-bench/bin/pip install -q -c .venv-bench/torch-constraint.txt -r requirements/bench.txt
	.venv-bench/bin/pip install -q --no-deps d3rlpy==2.8.1
	.venv-bench/bin/pip install -q --no-deps -e .

bench: bench-env
	.venv-bench/bin/python benchmarks/bench_offline_throughput.py
	.venv-bench/bin/python benchmarks/bench_offline_quality.py
	$(BIN)/python benchmarks/bench_dataset_io.py

# Regenerate the lock after changing requirements/lock.in (about 6 s).
lock:
	$(BIN)/uv pip compile requirements/lock.in --python-version 3.11 -o requirements/lock.txt --no-header

clean:
	rm -rf $(VENV) .venv-bench .pytest_cache

# TorchRL, the prioritised-replay peer of benchmarks/bench_replay.py, gets an environment of its own: its
# compiled extension fails to load beside torch 2.13.0+cpu and loads beside torch 2.14.1 (requirements/torchrl.txt).
.PHONY: bench-torchrl-env
bench-torchrl-env:
	test -x .venv-torchrl/bin/python || $(PYTHON) -m venv .venv-torchrl
	.venv-torchrl/bin/pip install -q -r requirements/torchrl.txt
	.venv-torchrl/bin/pip install -q --no-deps -e .
	.venv-torchrl/bin/python -c "from torchrl._torchrl import SumSegmentTreeFp32; import arl_models.prioritized"
