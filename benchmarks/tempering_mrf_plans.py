"""How the MRF kernel shares a call between threads: threads over blocks of replicas against threads sharing
each colour's Philox groups (issue 34), interleaved in one process on the random 4-regular graph of
``benchmarks/tempering_mrf.py``.

    .venv/bin/python benchmarks/tempering_mrf_plans.py [--replicas 16 64] [--rounds 12]

Each round times 8 calls of 4 sweeps (heat bath, b = 1) with each plan in turn, on all numba threads, by the
wall clock; printed: the best and the median ns per update of each plan. "replicas": the plan before issue 34's
node sharing (the replicas split evenly between the threads, at least 8 lanes a block); "chosen":
``mrf_kernels._plan``'s. Both give the same bits (``tests/tasks/tempering/test_mrf_kernels.py``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402
from tempering_mrf import KEY, regular_graph  # noqa: E402

from pgmflow.tasks.tempering import mrf_kernels as K  # noqa: E402
from pgmflow.tasks.tempering import mrf_target as T  # noqa: E402


def main():
    import numba

    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()
    threads = numba.get_num_threads()
    target = T.make_mrf_target(regular_graph())
    n = target.n_sites
    print(f"{numba.get_num_threads()} numba threads; ns per update, 4 sweeps per call, wall clock")
    for R in args.replicas:
        rng = np.random.default_rng(2)
        x = np.where(rng.random((R, n)) < 0.5, 1, -1).astype(np.int8)
        b = np.ones(R)
        rid = np.arange(R).astype(np.uint64)
        a, lg = K.reference_rows(target, R, None, None)
        plans = {
            "replicas": ("replicas", max(min(8, R), -(-R // threads)), threads),
            "chosen": K._plan(R, threads, n, target.n_colours) + (threads,),
        }
        times = {k: [] for k in plans}
        s = 1
        for p in plans.values():  # compile, warm
            K._sweep_cpu(x, target, b, KEY, rid, 0, 0, 1, "heatbath", a, lg, K.MARGIN, plan=p)
        for _ in range(args.rounds):
            for k, p in plans.items():
                t0 = time.perf_counter()
                for _ in range(8):
                    K._sweep_cpu(x, target, b, KEY, rid, 0, s, 4, "heatbath", a, lg, K.MARGIN, plan=p)
                    s += 4
                times[k].append((time.perf_counter() - t0) / (R * n * 32) * 1e9)
        for k, v in times.items():
            print(f"{R} replicas, {k} {plans[k][:2]}: best {min(v):.3f}, median {np.median(v):.3f}")


if __name__ == "__main__":
    main()
