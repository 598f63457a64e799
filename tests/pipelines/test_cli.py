"""The pgmflow command itself, in subprocesses: help, config printing, bad input (exit 2, one line
naming the field and the fix, nothing left RUNNING in MLflow), and a real run on a LocalCluster."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def pgmflow(args, cwd, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "pipelines", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_help_and_cfg(tmp_path):
    r = pgmflow(["--help"], tmp_path)
    assert r.returncode == 0
    assert "pipeline: bounds, svi, tempering, tesla" in r.stdout and "experiment" in r.stdout
    assert "corpus: docstrings" in r.stdout and "network: csv, npz, synthetic" in r.stdout
    r = pgmflow(["--cfg", "job", "model.L=16", "seed=3"], tmp_path)
    assert r.returncode == 0
    assert "L: 16" in r.stdout and "seed: 3" in r.stdout


BAD = [
    (["model.L=1"], "model.L=1"),
    (["model.L=7"], "model.L=7"),
    (["model.T=-1.0"], "model.T=-1.0"),
    (["model.T=0"], "model.T=0"),
    (["tempering.ladder=[0,0.5,0.4,1]"], "tempering.ladder"),
    (["tempering.ladder=[0.1,0.5,1]"], "tempering.ladder"),
    (["tempering.n_replicas=1"], "tempering.n_replicas=1"),
    (["tempering.explorer=hmc"], "tempering.explorer='hmc'"),
    (["tempering.swap=sideways"], "tempering.swap='sideways'"),
    (["model.couplings=random"], "model.couplings='random'"),
    (["model=custom", "model.log_density=tests.pipelines.densities:nope"], "model.log_density"),
    (["model=custom", "model.log_density=tasks.tempering.examples:returns_nan", "tempering.explorer=rwm"],
     "model.log_density"),
    (["cluster.profile=moon"], "cluster.profile='moon'"),
    (["cluster.profile=slurm"], "cluster.profile='slurm'"),
    (["cluster.profile=address", "cluster.address=tcp://127.0.0.1:9"], "cluster.address"),
    (["cluster.file=nowhere.yaml"], "cluster.file"),
    (["backend=cupy"], "backend='cupy'"),
    (["seed=-4"], "seed=-4"),
    (["resume=0123456789abcdef"], "resume"),
    (["model=potts"], "model='potts'"),
    (["tempering.n_replica=8"], "tempering.n_replica"),
    (["model.LL=8"], "model.LL"),
]


@pytest.mark.parametrize("args,field", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exit_2_one_line(tmp_path, args, field):
    if args == ["backend=cupy"]:
        from tests.conftest import gpu_available

        if gpu_available():
            pytest.skip("a GPU is present: backend=cupy is valid here")
    if args == ["cluster.profile=slurm"]:
        import importlib.util

        if importlib.util.find_spec("dask_jobqueue"):
            pytest.skip("dask-jobqueue is installed")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = pgmflow(args + [f"tracking.uri={uri}", "progress=false"], tmp_path, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("pgmflow: error: ") and field in lines[0] and "fix:" in lines[0], lines[0]
    assert "Traceback" not in r.stderr
    assert not any(p.name.endswith(".npz") for p in tmp_path.rglob("*")), "no artifacts for a refused run"
    if (tmp_path / "mlflow.db").exists():
        from pipelines.tracking import Tracker

        tr = Tracker(uri, "pgmflow")
        exp = tr.client.get_experiment_by_name("pgmflow")
        if exp is not None:
            assert all(run.info.status != "RUNNING" for run in tr.client.search_runs([exp.experiment_id]))


def test_malformed_cluster_file(tmp_path):
    (tmp_path / "bad.yaml").write_text("profiles:\n  local:\n    type: local\n   oops: [\n")
    r = pgmflow(["cluster.file=bad.yaml"], tmp_path)
    assert r.returncode == 2
    assert "cluster.file" in r.stderr and "YAML" in r.stderr


@pytest.mark.slow
def test_cli_run_on_local_cluster(tmp_path):
    r = pgmflow(["debug=default", "progress=true"], tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "finished. MLflow run" in r.stdout and "mlflow ui --backend-store-uri" in r.stdout
    assert "log Z =" in r.stdout and "exact" in r.stdout
    assert "tempering [" in r.stderr  # the progress bar
    assert (tmp_path / "mlflow.db").exists()
