"""A 12-job sweep on SLURM: pgmflow's Dask launcher on the ``slurm`` profile beside Hydra's own SLURM
launcher (hydra-submitit-launcher: one SLURM job per Hydra job), in the same run, on the same SLURM.

    .venv/bin/pip install -e '.[bench-slurm]'
    .venv/bin/python benchmarks/sweeps_slurm.py [--out benchmarks/results/sweeps_slurm.md]

The SLURM: the single-node test SLURM of tests/slurm (munged, slurmctld and slurmd on this host,
started and stopped by this script; root, Debian's slurm-wlm and munge, installed when missing).
``--running`` uses the SLURM that ``SLURM_CONF`` (or /etc/slurm) points at instead.

The sweep: ``pgmflow -m pipeline=tempering debug=default model.L=8,12,16 seed=0,1,2,3`` (12 tempering
runs), each job one CPU and 2 GB:

* ``hydra/launcher=dask`` (pgmflow): ``cluster.profile=slurm`` with ``cluster.options.cores=1``,
  ``memory=2GB``, ``n_jobs=2``: two SLURM jobs, each one Dask worker; the 12 Hydra jobs run on
  those workers (one per worker at a time), one MLflow parent run with 12 child runs.
* ``hydra/launcher=submitit_slurm`` (peer): one SLURM job per Hydra job (a job array of 12,
  ``cpus_per_task=1``, ``mem_gb=2``); each job runs pgmflow in its own process with
  ``cluster.profile=synchronous`` (its one CPU; a LocalCluster inside a 1-CPU job would only add
  processes), so at most 2 run at once on the 2-CPU node.

Both are timed from the command's start to its exit (wall clock: submission, queueing and start-up
included). The script counts the SLURM jobs each submitted (``squeue -t all``) and checks that both
give every Hydra job the same objective (the runs are reproducible: the launcher must not change a bit).
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

from _machine import cpu_name, emit  # noqa: E402

SWEEP = [
    "pipeline=tempering",
    "debug=default",
    "model.L=8,12,16",
    "seed=0,1,2,3",
    "tempering.figures=false",
    "progress=false",
]
DASK = [
    "hydra/launcher=dask",
    "cluster.profile=slurm",
    "cluster.options.cores=1",
    "cluster.options.memory=2GB",
    "cluster.options.n_jobs=2",
    "cluster.options.walltime=00:30:00",
]
SUBMITIT = [
    "hydra/launcher=submitit_slurm",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=2",
    "hydra.launcher.timeout_min=30",
    "hydra.launcher.nodes=1",
    "hydra.launcher.tasks_per_node=1",
    "cluster.profile=synchronous",
]


def slurm_jobs() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-a", "-t", "all", "-o", "%i"], capture_output=True, text=True).stdout
    return {ln.strip() for ln in out.splitlines() if ln.strip()}


def run_sweep(name: str, launcher_args: list, workdir: Path) -> tuple[float, str, int]:
    """(wall seconds, MLflow uri, SLURM jobs submitted)."""
    workdir.mkdir(parents=True)
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    logs = [f"cluster.options.log_directory={workdir / 'logs'}"] if "cluster.profile=slurm" in launcher_args else []
    cmd = [sys.executable, "-m", "pgmflow", "-m", *launcher_args, *SWEEP, *logs, f"tracking.uri={uri}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PGMFLOW_ORIG_CWD": str(workdir)}
    before = slurm_jobs()
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=3600)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{name} sweep failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    time.sleep(2)  # the last jobs' records
    return dt, uri, len(slurm_jobs() - before)


def objectives(uri: str) -> dict:
    """(model.L, seed) -> objective of every finished run that is not a sweep's parent."""
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    exp = tr.client.get_experiment_by_name("pgmflow")
    out = {}
    for r in tr.client.search_runs([exp.experiment_id], max_results=1000):
        if r.data.tags.get("pgmflow.sweep") != "true" and "objective" in r.data.metrics:
            out[(r.data.params.get("model.L"), r.data.params.get("seed"))] = r.data.metrics["objective"]
    return out


def report(t_dask, n_dask, t_sub, n_sub, same, n_obj, slurm_desc) -> str:
    lines = [
        "# Sweeps on SLURM: pgmflow's Dask launcher vs Hydra's submitit launcher",
        "",
        f"Machine: {cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}; {slurm_desc}. "
        "Command: `.venv/bin/python benchmarks/sweeps_slurm.py`.",
        "",
        f"Sweep: `pgmflow -m {' '.join(SWEEP)}` (12 jobs), each job 1 CPU and 2 GB.",
        "",
        "| launcher | SLURM jobs submitted | wall time (s) | ratio |",
        "| --- | --- | --- | --- |",
        f"| hydra/launcher=submitit_slurm (hydra-submitit-launcher, peer): one SLURM job per Hydra job | {n_sub} | "
        f"{t_sub:.1f} | 1.00 |",
        f"| hydra/launcher=dask (pgmflow) on cluster.profile=slurm, n_jobs=2 | {n_dask} | {t_dask:.1f} | "
        f"{t_sub / t_dask:.2f}x {'faster' if t_dask < t_sub else 'slower'} |",
        "",
        f"- Objectives of the 12 jobs identical under both launchers: {'yes' if same else 'NO'} ({n_obj} compared).",
        "- Wall time from the command's start to its exit: submission, queueing, worker start-up included.",
        "- The Dask launcher pays for SLURM jobs once (two workers) and runs the Hydra jobs on them; "
        "submitit starts a Python process, pgmflow's imports and an MLflow client in a new SLURM job for each.",
    ]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="write the report here (markdown)")
    ap.add_argument("--running", action="store_true", help="use the running SLURM (SLURM_CONF) instead of a test one")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pgmflow-bench-") as d:
        slurm = None
        if not a.running:
            from tests.slurm.testslurm import TestSlurm, why_not

            if why_not():
                raise SystemExit(f"no SLURM: {why_not()}")
            slurm = TestSlurm(Path(d) / "slurm").start()
            slurm.activate()
        try:
            desc = (
                f"single-node SLURM {subprocess.run(['sinfo', '-V'], capture_output=True, text=True).stdout.strip()}"
                + (
                    f" (the test SLURM of tests/slurm: 1 node, {slurm.cpus} CPUs, {slurm.memory_mb} MB)"
                    if slurm
                    else ""
                )
            )
            t_sub, uri_sub, n_sub = run_sweep("submitit", SUBMITIT, Path(d) / "submitit")
            print(f"hydra/launcher=submitit_slurm: {t_sub:.1f} s, {n_sub} SLURM jobs", flush=True)
            t_dask, uri_dask, n_dask = run_sweep("dask", DASK, Path(d) / "dask")
            print(f"hydra/launcher=dask (slurm profile): {t_dask:.1f} s, {n_dask} SLURM jobs", flush=True)
            obj_sub, obj_dask = objectives(uri_sub), objectives(uri_dask)
        finally:
            if slurm is not None:
                slurm.stop()
    same = obj_sub == obj_dask and len(obj_sub) == 12
    emit(report(t_dask, n_dask, t_sub, n_sub, same, len(obj_sub), desc), a.out)
    if not same:
        raise SystemExit("check failed: objectives differ between the launchers or runs are missing")


if __name__ == "__main__":
    main()
