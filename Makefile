# pgmflow: `make run` runs the default experiment, `make test` the test suite.
# Both create the virtual environment (.venv) and install pgmflow into it first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-slow test-all test-slurm test-network bench install clean ui gpu-wheelhouse gpu-check lint format

# setuptools ends every editable build with an informational "Editable installation" notice (a warning about
# folders named like the package in the working directory: pgmflow's import name is `pgmflow`, and no folder of
# the checkout is called that); PIP_QUIET_BUILD filters exactly that notice and nothing else.
PIP_QUIET_BUILD := PYTHONWARNINGS="ignore:Editable installation"
# The editable install is setuptools' strict mode (docs/architecture.md, "What gets installed"): a link tree in
# build/ that Hydra's plugin scan and path-based tools walk like any folder. Edits are live; an added or removed
# file needs the tree rebuilt, so every target depends on $(TREE), a stamp named after a checksum of the source
# folders' file list: the first make after adding a module relinks (pip --no-deps, a few seconds).
EDITABLE := --config-settings editable_mode=strict
TREE := $(VENV)/.tree-$(shell find pipelines tasks conf hydra_plugins -type f -not -path '*/__pycache__/*' \
	-not -name '*.pyc' 2>/dev/null | LC_ALL=C sort | cksum | cut -d' ' -f1)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(PIP_QUIET_BUILD) $(BIN)/python -m pip install --quiet -e '.[dev,optuna]' $(EDITABLE)
	rm -f $(VENV)/.tree-*
	touch $(STAMP)

$(TREE): $(STAMP)
	@if ls $(VENV)/.tree-* >/dev/null 2>&1; then echo "source files added or removed: relinking the editable install"; \
	  $(PIP_QUIET_BUILD) $(BIN)/python -m pip install --quiet --no-deps -e . $(EDITABLE); fi
	rm -f $(VENV)/.tree-*
	touch $(TREE)

install: $(TREE)

run: $(TREE)
	$(BIN)/pgmflow $(ARGS)

# make lint: ruff's checks and its formatter, as configured in pyproject.toml (CI runs it first); make format
# applies the formatter and the safe fixes.
lint: $(TREE)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(TREE)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# make test: every test but those marked slow (under 12 minutes on a 2-core machine); make test-slow: the
# slow ones (cross-layout bit reproducibility, killed workers and drivers, sweeps, statistical accuracy
# of log Z and of the samplers; ~30 minutes there); CI (.ci/run) runs both, then make test-slurm.
test: $(TREE)
	$(BIN)/python -m pytest -q -m "not slow" --durations=15 $(PYTEST_ARGS)

test-slow: $(TREE)
	$(BIN)/python -m pytest -q -m "slow" --durations=15 $(PYTEST_ARGS)

test-all: $(TREE)
	$(BIN)/python -m pytest -q --durations=15 $(PYTEST_ARGS)

# pgmflow on a real SLURM (tests/slurm, docs/clusters.md): as root, installs slurm-wlm and munge when
# missing, starts munged, slurmctld and slurmd on this host for the session and stops them at the end.
# Without root or the packages the tests skip with the reason.
test-slurm: $(TREE)
	$(PIP_QUIET_BUILD) $(BIN)/python -m pip install --quiet -e '.[dev,slurm]' $(EDITABLE)
	$(BIN)/python -m pytest -q -m slurm --durations=10 tests/slurm $(PYTEST_ARGS)

# pgmflow across several hosts with the network failing between them (tests/network, docs/reliability.md): as
# root, hosts are network namespaces on a private bridge (198.18.0.0/24, no default route, routes checked before
# any traffic), with a Dask scheduler, three workers and an MLflow server inside them; faults are iptables rules,
# a delaying proxy, SIGSTOP and ss -K, each bounded in time. Everything is removed at the end (checked). Without
# root or iptables the tests skip with the reason.
test-network: $(TREE)
	PGMFLOW_TEST_WARM=0 $(BIN)/python -m pytest -q -m network --durations=15 tests/network $(PYTEST_ARGS)

bench: $(TREE)
	$(PIP_QUIET_BUILD) $(BIN)/pip install -q -e '.[dev,bench]' $(EDITABLE)
	$(BIN)/python benchmarks/tempering.py
	$(BIN)/python benchmarks/svi_lda.py

# GPU readiness (docs/gpu.md). On a CPU machine with PyPI access: the wheels the GPU image lacks, in .whl/
# (< 64 MiB). On the GPU machine, with .whl/ brought along: every GPU test, pipeline and benchmark, and a
# report in benchmarks/results/gpu-<device>.md; without a GPU it stops at once with one line.
gpu-wheelhouse:
	$(PYTHON) .ci/gpu_wheelhouse.py

gpu-check:
	@$(PYTHON) .ci/gpu_check.py $(GPU_CHECK_ARGS)

ui: $(TREE)
	$(BIN)/mlflow ui --host 127.0.0.1 --backend-store-uri sqlite:///mlflow.db

clean:
	rm -rf $(VENV) *.egg-info build dist .pytest_cache outputs multirun
