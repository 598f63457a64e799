"""What resuming a killed sparse-GP fit saves: an SGPR fit of 30 L-BFGS-B iterations is run once
undisturbed; then again with its driver SIGKILLed once iteration KILL_AT is checkpointed, and
continued with ``resume=<run id>``. Prints the wall time of the fit in each (the ``fit_seconds`` the
run records), the iterations the resumed run still had to make, the time saved against starting the
fit again, whether the models are bit-identical, and what writing a checkpoint every iteration cost.

    python benchmarks/sparse_gp_resume.py [--n 60000] [--m 128] [--kill-at 15]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def cli(args, cwd, uri):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    return [sys.executable, "-m", "pgmflow", *args, f"tracking.uri={uri}", "cluster.n_workers=2"], env


def newest_iteration(run_dir: Path) -> int:
    best = -1
    for f in (run_dir / "checkpoints").glob("lbfgs_*.npz"):
        try:
            with np.load(f) as z:
                best = max(best, int(z["nit"]))
        except Exception:
            pass
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=60000)
    ap.add_argument("--m", type=int, default=128)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--kill-at", type=int, default=15)
    a = ap.parse_args()
    args = [
        "pipeline=sparse_gp",
        "gp_data=synthetic",
        f"gp_data.n={a.n}",
        "gp_data.d=8",
        f"sparse_gp.m={a.m}",
        "sparse_gp.chunk_size=10000",
        f"sparse_gp.max_iter={a.iters}",
        "sparse_gp.figures=false",
        "progress=false",
    ]
    root = Path(tempfile.mkdtemp(prefix="pgmflow-resume-bench-"))
    uri = f"sqlite:///{root / 'mlflow.db'}"
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")

    cmd, env = cli(args, root, uri)
    t0 = time.monotonic()
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=True).stdout
    full_wall = time.monotonic() - t0
    full_id = out.split("sparse_gp run ")[1].split()[0]

    log = open(root / "killed.txt", "w")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    run_id = None
    while proc.poll() is None:
        text = (root / "killed.txt").read_text()
        if run_id is None and "sparse_gp run " in text:
            run_id = text.split("sparse_gp run ")[1].split()[0]
        if run_id and newest_iteration(root / "mlartifacts" / run_id / "artifacts") >= a.kill_at:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_wall = time.monotonic() - t0
    at = newest_iteration(root / "mlartifacts" / run_id / "artifacts")

    cmd, env = cli(args + [f"resume={run_id}"], root, uri)
    t0 = time.monotonic()
    subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=True)
    resumed_wall = time.monotonic() - t0

    def results(rid):
        tr.run_id = rid
        return json.loads(tr.read_text("results.json"))

    full, resumed = results(full_id), results(run_id)
    with (
        np.load(tr.client.download_artifacts(full_id, "model.npz")) as x,
        np.load(tr.client.download_artifacts(run_id, "model.npz")) as y,
    ):
        same = x.files == y.files and all(x[k].tobytes() == y[k].tobytes() for k in x.files)
    print(
        f"SGPR n={a.n} d=8 m={a.m}, {full['iterations']} L-BFGS-B iterations ({full['evaluations']} evaluations) "
        f"on 2 local workers"
    )
    print(f"  undisturbed: fit {full['fit_seconds']:.1f} s ({full_wall:.1f} s wall for the whole run)")
    print(f"  killed after iteration {at} was checkpointed ({killed_wall:.1f} s wall)")
    print(
        f"  resumed: {resumed['iterations'] - at} iterations left, fit {resumed['fit_seconds']:.1f} s "
        f"({resumed_wall:.1f} s wall); starting again would have cost the whole {full['fit_seconds']:.1f} s fit: "
        f"{full['fit_seconds'] - resumed['fit_seconds']:.1f} s saved "
        f"({100 * (1 - resumed['fit_seconds'] / full['fit_seconds']):.0f} % of the fit)"
    )
    print(f"  model.npz of the resumed run bit-identical to the undisturbed one: {same}")
    size = max(f.stat().st_size for f in (root / "mlartifacts" / run_id / "artifacts" / "checkpoints").glob("*.npz"))
    per = full["checkpoint_seconds"] / max(full["iterations"], 1)
    print(
        f"  checkpoints: {full['checkpoint_seconds']:.3f} s in the undisturbed fit, {1000 * per:.1f} ms per iteration "
        f"({100 * full['checkpoint_seconds'] / full['fit_seconds']:.1f} % of the fit; {size / 1024:.0f} KiB each)"
    )


if __name__ == "__main__":
    main()
