"""CPU seconds of a whole SGPR fit with the pipeline's chunk numerics, in one process (issue 37's two forms).

The pipeline hands each chunk's ``Kuf`` (and, in the whitened form, ``A = L^-1 Kuf``) from the statistics task
to the gradient task through the worker's Kuf store; this script does the same in one process, without Dask, and
runs L-BFGS-B for ``--iters`` iterations on Friedman #1 (as ``benchmarks/sparse_gp.py``: m = 256 k-means++
inducing inputs, the same start). A fit's later evaluations run in the whitened form (long lengthscales make
``Kuu`` badly conditioned), its first ones in the plain form, so a whole fit is the fair measure of both.

Timed by CPU time with one BLAS thread, so another process on the machine changes little. To compare with other
code, put an extracted copy of its package first on ``PYTHONPATH``; the script adapts to the chunk API of
the code before issue 37 (``chunk_stats_and_kuf`` without ``L``) and after it.

Run: ``.venv/bin/python benchmarks/sparse_gp_fit_cpu.py [--n 50000] [--iters 50]`` (about 30 s).
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from pathlib import Path

import numpy as np
import scipy.optimize

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--m", type=int, default=256)
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()

    import sparse_gp as bench

    from pgmflow.sparse_gp import evaluations as sg
    from pgmflow.tasks import threads
    from pgmflow.tasks.gp import bounds as gb
    from pgmflow.tasks.gp import kernels as kern
    from pgmflow.tasks.gp import stats as gs
    from pgmflow.tasks.gp.data import Standardizer

    X, y, _, _ = bench.make_data(a.n, 1000)
    std = Standardizer.fit(X, y)
    Xs, ys = std.apply(X, y)
    Z0 = sg.initial_inducing(Xs, a.m, 0, 10, 20_000)
    p0 = kern.make_params(np.full(Xs.shape[1], bench.LENGTHSCALE), bench.VARIANCE, bench.NOISE)
    chunks = gs.chunk_bounds(a.n, 10_000)
    keeps_a = hasattr(gs, "chunk_stats_kuf_and_a")
    ships_l = keeps_a or "L" in inspect.signature(gs.chunk_stats_and_kuf).parameters
    d, m = Xs.shape[1], a.m

    def value_and_grad(p, Z):
        chol = kern.inducing_cholesky("rbf", p, Z, 1e-6) if ships_l else None
        stats, kept = [], []
        for lo, hi in chunks:
            if keeps_a:
                st, K, A = gs.chunk_stats_kuf_and_a("sgpr", "rbf", p, Z, Xs[lo:hi], ys[lo:hi], L=chol[0], keep_a=True)
            elif ships_l:
                (st, K), A = gs.chunk_stats_and_kuf("sgpr", "rbf", p, Z, Xs[lo:hi], ys[lo:hi], L=chol[0]), None
            else:
                (st, K), A = gs.chunk_stats_and_kuf("sgpr", "rbf", p, Z, Xs[lo:hi], ys[lo:hi]), None
            stats.append(st)
            kept.append((K, A))
        st = gs.sum_in_order(stats)
        kw = {"chol": chol} if ships_l else {}
        value, adj = gb.objective("sgpr", "rbf", p, Z, st, 1e-6, **kw)
        grads = []
        for (lo, hi), (K, A) in zip(chunks, kept):
            extra = {"A": A} if keeps_a else {}
            grads.append(gs.chunk_grad("sgpr", "rbf", p, Z, Xs[lo:hi], ys[lo:hi], adj, Kuf=K, **extra))
        dp, dZ = gb.finish_grad("sgpr", "rbf", p, Z, adj, gs.sum_in_order(grads))
        return value, dp, dZ

    evals = [0]

    def fun(theta):
        evals[0] += 1
        p, Z = kern.unpack(theta, d, m)
        v, dp, dZ = value_and_grad(p, Z)
        return -v, -kern.pack(dp, dZ)

    with threads.pinned_blas(1):
        value_and_grad(p0, Z0)  # numba's kernels loaded, pages touched
        c0, w0 = time.process_time(), time.perf_counter()
        res = scipy.optimize.minimize(fun, kern.pack(p0, Z0), jac=True, method="L-BFGS-B", options={"maxiter": a.iters})
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    print(
        f"code: {Path(gs.__file__).resolve().parent.parent.parent}; n={a.n}, m={a.m}: {res.nit} iterations, "
        f"{evals[0]} evaluations, bound {-res.fun:.6f}; CPU {cpu:.1f} s ({cpu / evals[0]:.3f} s per evaluation), "
        f"wall {wall:.1f} s"
    )


if __name__ == "__main__":
    main()
