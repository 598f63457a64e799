"""A 12-job sweep with Hydra's default sequential launcher and with pgmflow's Dask launcher, in the
same run, on the same machine and the same sweep.

    .venv/bin/python benchmarks/sweeps.py [--out benchmarks/results/sweeps.md] [--workers 2]

The sweep: ``pgmflow -m pipeline=tempering debug=default model.L=8,12,16 seed=0,1,2,3`` (12 real
tempering runs on 2-D Ising models, each with its MLflow run), every job on a 2-worker
LocalCluster:

* ``hydra/launcher=basic`` (Hydra's default): one job after another in the launching process;
  each job opens its own LocalCluster from ``dask_cluster.yaml``, as a single ``pgmflow`` run does.
* ``hydra/launcher=dask`` (pgmflow's default for ``-m``): one LocalCluster for the sweep, jobs
  submitted to it (at most one per worker at a time), one MLflow parent run with 12 child runs.

Both are timed from the command's start to its exit (wall clock, start-up included). The script
also checks that both launchers give every job the same objective (the runs are reproducible, so
the launcher must not change a single bit), and counts the FINISHED child runs under the parent.
The target (issue 6): the Dask launcher takes less wall time than the sequential one.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import cpu_name  # noqa: E402

SWEEP = ["pipeline=tempering", "debug=default", "model.L=8,12,16", "seed=0,1,2,3", "progress=false"]


def run_sweep(launcher: str, workdir: Path, n_workers: int) -> tuple[float, str, str]:
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    cmd = [
        sys.executable,
        "-m",
        "pgmflow",
        "-m",
        f"hydra/launcher={launcher}",
        *SWEEP,
        f"cluster.n_workers={n_workers}",
        f"tracking.uri={uri}",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=3600)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{launcher} sweep failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return dt, uri, r.stdout


def objectives(uri: str) -> tuple[dict, int, int]:
    """(overrides key -> objective, FINISHED child runs, parent runs)."""
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    exp = tr.client.get_experiment_by_name("pgmflow")
    runs = tr.client.search_runs([exp.experiment_id], max_results=1000)
    out, children = {}, 0
    parents = sum(r.data.tags.get("pgmflow.sweep") == "true" for r in runs)
    for r in runs:
        if r.data.tags.get("pgmflow.sweep") == "true":
            continue
        if "mlflow.parentRunId" in r.data.tags and r.info.status == "FINISHED":
            children += 1
        if "objective" in r.data.metrics:
            key = (r.data.params.get("model.L"), r.data.params.get("seed"))
            out[key] = r.data.metrics["objective"]
    return out, children, parents


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="write the result table here (markdown)")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()

    with tempfile.TemporaryDirectory() as d:
        basic_dir, dask_dir = Path(d) / "basic", Path(d) / "dask"
        basic_dir.mkdir()
        dask_dir.mkdir()
        t_basic, uri_basic, _ = run_sweep("basic", basic_dir, a.workers)
        print(f"hydra/launcher=basic: {t_basic:.1f} s", flush=True)
        t_dask, uri_dask, out_dask = run_sweep("dask", dask_dir, a.workers)
        print(f"hydra/launcher=dask:  {t_dask:.1f} s", flush=True)
        obj_basic, _, _ = objectives(uri_basic)
        obj_dask, children, parents = objectives(uri_dask)

    same = obj_basic == obj_dask and len(obj_basic) == 12
    lines = [
        "# Sweeps: Hydra's sequential launcher vs pgmflow's Dask launcher",
        "",
        f"Machine: {cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"LocalCluster of {a.workers} worker processes. Command: `.venv/bin/python benchmarks/sweeps.py`.",
        "",
        f"Sweep: `pgmflow -m {' '.join(SWEEP)}` (12 jobs).",
        "",
        "| launcher | wall time (s) | ratio |",
        "| --- | --- | --- |",
        f"| hydra/launcher=basic (Hydra's default, peer) | {t_basic:.1f} | 1.00 |",
        f"| hydra/launcher=dask (pgmflow) | {t_dask:.1f} | {t_basic / t_dask:.2f}x faster |",
        "",
        f"- Dask launcher: {children} FINISHED child runs under {parents} parent run(s).",
        f"- Objectives of the 12 jobs identical under both launchers: {'yes' if same else 'NO'}.",
        f"- Target (issue 6): Dask launcher faster than the sequential one: "
        f"{'met' if t_dask < t_basic else 'NOT met'}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    if not same or children != 12:
        raise SystemExit("check failed: objectives differ between launchers or child runs are missing")


if __name__ == "__main__":
    main()
