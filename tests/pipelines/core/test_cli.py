"""The pgmflow command itself, in subprocesses: help, config printing, and a real run on a
LocalCluster. Bad input (exit 2, one line naming the field and the fix, nothing left RUNNING in
MLflow) is catalogued in tests/bad_input/."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def pgmflow(args, cwd, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "pgmflow", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_help_and_cfg(tmp_path):
    r = pgmflow(["--help"], tmp_path)
    assert r.returncode == 0
    assert "pipeline: bounds, network_mrf, sparse_gp, svi, tempering, tesla" in r.stdout and "experiment" in r.stdout
    assert "gp_data: breast_cancer, co2, csv, diabetes, npy, npz, synthetic" in r.stdout
    assert "corpus: docstrings" in r.stdout and "network: csv, npz, rollcall, synthetic" in r.stdout
    r = pgmflow(["--cfg", "job", "model.L=16", "seed=3"], tmp_path)
    assert r.returncode == 0
    assert "L: 16" in r.stdout and "seed: 3" in r.stdout


@pytest.mark.slow
@pytest.mark.fresh_store
def test_cli_run_on_local_cluster(tmp_path):
    r = pgmflow(["debug=default", "progress=true"], tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "finished. MLflow run" in r.stdout and "mlflow ui --backend-store-uri" in r.stdout
    assert "log Z =" in r.stdout and "exact" in r.stdout
    assert "tempering [" in r.stderr  # the progress bar
    assert (tmp_path / "mlflow.db").exists()
