"""Where fitting in the driver beats the workers: SGPR on synthetic data of growing size, fitted with
``sparse_gp.in_process=true`` (the chunks evaluated in the driver, no round trip per evaluation) and
``false`` (two rounds of chunk tasks per evaluation on a 2-worker LocalCluster), same data, same
seed; prints seconds per evaluation of each, their ratio, and whether the models are the same bits.
Then the two small real cases of the issue: diabetes (442 x 10) and a 300-row ARD fit.

    python benchmarks/sparse_gp_in_process.py
"""

from __future__ import annotations

import io
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def fit(overrides, uri, cluster):
    from pgmflow.core.runner import execute
    from pgmflow.core.tracking import Tracker
    from tests.conftest import compose

    ov = overrides + [
        "progress=false",
        "sparse_gp.figures=false",
        f"tracking.uri={uri}",
        "cluster.profile=address",
        f"cluster.address={cluster.scheduler_address}",
    ]
    res = execute(compose(ov), stream=io.StringIO())
    tr = Tracker(uri, "pgmflow")
    with np.load(tr.client.download_artifacts(res["run_id"], "model.npz")) as z:
        model = {k: z[k].tobytes() for k in z.files}
    return res, model


def main():
    from distributed import LocalCluster

    uri = f"sqlite:///{tempfile.mkdtemp(prefix='pgmflow-inproc-')}/mlflow.db"
    env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=logging.ERROR, env=env
    ) as cl:
        print(f"{'rows':>7} {'m':>4} {'rows x m':>10} {'driver s/eval':>14} {'workers s/eval':>15} {'ratio':>6} same")
        cases = [(n, 64) for n in (500, 2000, 5000, 10000, 20000, 40000, 80000, 160000, 320000)] + [
            (n, 256) for n in (5000, 20000, 80000)
        ]
        for n, m in cases:
            base = [
                "pipeline=sparse_gp",
                "gp_data=synthetic",
                f"gp_data.n={n}",
                "gp_data.d=8",
                f"sparse_gp.m={m}",
                "sparse_gp.max_iter=10",
                "sparse_gp.chunk_size=5000",
            ]
            a, ma = fit(base + ["sparse_gp.in_process=true"], uri, cl)
            b, mb = fit(base + ["sparse_gp.in_process=false"], uri, cl)
            print(
                f"{n:>7} {m:>4} {n * m:>10} {a['seconds_per_evaluation']:>14.4f} {b['seconds_per_evaluation']:>15.4f} "
                f"{b['seconds_per_evaluation'] / a['seconds_per_evaluation']:>6.2f} {ma == mb}",
                flush=True,
            )
        print()
        for name, ov in (
            ("diabetes (442 x 10, m=64, RBF)", ["gp_data=diabetes", "sparse_gp.m=64"]),
            (
                "300-row ARD (Friedman #1, d=10, m=64)",
                [
                    "gp_data=synthetic",
                    "gp_data.n=300",
                    "gp_data.d=10",
                    "sparse_gp.m=64",
                    "sparse_gp.lengthscale=[1,1,1,1,1,1,1,1,1,1]",
                ],
            ),
        ):
            base = ["pipeline=sparse_gp", *ov]
            a, ma = fit(base, uri, cl)  # auto: in the driver
            b, mb = fit(base + ["sparse_gp.in_process=false"], uri, cl)
            print(
                f"{name}: fit {a['fit_seconds']:.2f} s in the driver ({a['iterations']} iterations, "
                f"{a['evaluations']} evaluations) vs {b['fit_seconds']:.2f} s on the workers; same bits: {ma == mb}"
            )


if __name__ == "__main__":
    main()
