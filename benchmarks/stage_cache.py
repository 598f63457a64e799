"""The stage cache's overhead (docs/stages.md, issue 33 done-means 7).

Measured in one run on one machine, each in a fresh process as a user would meet it:

* the code fingerprint: the normalised digests of all five built-in workloads' import closures, cold (an empty
  digest cache: every module parsed) and warm (the digest cache of ``~/.cache/pgmflow`` filled);
* a five-stage study (``experiment=tesla_truth_bounds_study``: 1 + 4 + 1 + 1 + 4 = 11 stage instances)
  run cold, then again fully cached, and the start-up that every ``pgmflow`` command pays before any stage
  (``pgmflow --cfg job`` of the same config: Python, imports, Hydra composition);
* one tiny single run in the same store (``pipeline=network_mrf`` on the synchronous scheduler), for what any
  run pays beyond composition (importing MLflow and Dask, opening the store, logging a run);
* the target: a fully cached study returns in under 3 s plus start-up.

Prints each figure, the cold/cached ratio and the target check. ``--repeat N`` runs the cached study N times.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STUDY = ["experiment=tesla_truth_bounds_study", "progress=false", "cluster.n_workers=2"]
FINGERPRINT = (
    "import time; t = time.perf_counter(); from pgmflow.core import registry, fingerprint; "
    "[fingerprint.workload_code(w) for w in registry.workloads()]; print(time.perf_counter() - t)"
)


def timed(args, cwd, env) -> float:
    t = time.perf_counter()
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"failed: {' '.join(args)}\n{r.stderr[-3000:]}")
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "XDG_CACHE_HOME": str(Path(d) / "cache")}
        fp = [sys.executable, "-c", FINGERPRINT]
        cold_fp = float(subprocess.run(fp, env=env, capture_output=True, text=True, check=True).stdout)
        warm_fp = float(subprocess.run(fp, env=env, capture_output=True, text=True, check=True).stdout)
        uri = [f"tracking.uri=sqlite:///{d}/mlflow.db"]
        cmd = [sys.executable, "-m", "pgmflow", *STUDY, *uri]
        cold = timed(cmd, d, env)
        cached = min(timed(cmd, d, env) for _ in range(a.repeat))
        startup = min(timed([*cmd, "--cfg", "job"], d, env) for _ in range(a.repeat))
        one = [sys.executable, "-m", "pgmflow", "pipeline=network_mrf", "progress=false", "cluster.profile=synchronous"]
        single = min(timed([*one, *uri], d, env) for _ in range(a.repeat))
    over = cached - startup
    print(f"code fingerprint, all five workloads: cold {cold_fp:.3f} s, warm {warm_fp:.3f} s")
    print(
        f"5-stage study (11 stage instances): cold {cold:.2f} s, fully cached {cached:.2f} s (ratio {cold / cached:.1f}x)"
    )
    print(f"start-up (pgmflow --cfg job of the same config): {startup:.2f} s")
    print(f"one tiny run (pipeline=network_mrf, synchronous: imports, MLflow store, run logging): {single:.2f} s")
    print(f"cached study beyond start-up: {over:.2f} s; target < 3 s: {'met' if over < 3 else 'NOT met'}")
    print(f"cached study beyond one tiny run: {cached - single:.2f} s")


if __name__ == "__main__":
    main()
