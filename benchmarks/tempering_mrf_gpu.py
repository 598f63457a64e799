"""MRF per-colour sweeps (tempering ``model=mrf``) on the GPU: the CUDA kernel through CuPy against the numba
kernel on the same machine's CPU cores, in the same run, on the graphs of ``benchmarks/tempering_mrf.py`` with
more replicas, and whether the two give the same bits (they must: one spec, tasks/tempering/mrf_kernels.py).

    python benchmarks/tempering_mrf_gpu.py        # on a machine with CUDA and CuPy (docs/gpu.md)

Prints heat-bath updates per wall-clock ns (best of 3) for each replica count.
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import networkx as nx
import numpy as np

from pgmflow.tasks import backend
from pgmflow.tasks.bounds import mrf as M
from pgmflow.tasks.tempering import mrf_kernels as K
from pgmflow.tasks.tempering import mrf_target as T

KEY = np.array([0x1234ABCD, 0x9E3779B9], dtype=np.uint32)
if not backend.gpu_status()[0]:
    sys.exit(f"no GPU: {backend.gpu_status()[1]}")
cp = backend.cupy()
numba = backend.numba()


def regular(n=10_000, d=4):
    g = nx.random_regular_graph(d, n, seed=0)
    edges = np.array(sorted(tuple(sorted(e)) for e in g.edges()), dtype=np.int64)
    rng = np.random.default_rng(0)
    return M.make_mrf(rng.normal(0.0, 0.1, n), edges, rng.normal(0.0, 0.5, len(edges)))


def dense(n=100):
    rng = np.random.default_rng(1)
    J = np.triu(rng.normal(0.0, 1.0 / np.sqrt(n), (n, n)), 1)
    return M.from_dense(J + J.T, rng.normal(0.0, 0.1, n))


def best(f, reps=3):
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        t.append(time.perf_counter() - t0)
    return min(t)


print("CPU threads (numba):", numba.get_num_threads())
CASES = [("4-regular 10,000 nodes", regular(), (16, 256, 2048), 20), ("dense 100 nodes", dense(), (64, 1024, 8192), 50)]
for name, model, Rs, sweeps in CASES:
    t = T.make_mrf_target(model)
    n = t.n_sites
    for R in Rs:
        x = np.where(np.random.default_rng(2).random((R, n)) < 0.5, 1, -1).astype(np.int8)
        b = np.ones(R)
        rid = np.arange(R)
        xh = x.copy()
        K.mrf_sweep(xh, t, b, KEY, rid, 0, 0, 1, "heatbath")
        tc = best(lambda: K.mrf_sweep(xh, t, b, KEY, rid, 0, 1, sweeps, "heatbath"))
        xd = cp.asarray(x)
        K.mrf_sweep(xd, t, b, KEY, rid, 0, 0, 1, "heatbath")
        cp.cuda.Device().synchronize()

        def gpu():
            K.mrf_sweep(xd, t, b, KEY, rid, 0, 1, sweeps, "heatbath")
            cp.cuda.Device().synchronize()

        tg = best(gpu)
        same = bool(np.array_equal(cp.asnumpy(xd), xh))
        u = R * n * sweeps
        print(
            f"{name}, R={R}: CPU {u / tc / 1e9:.3f} updates/ns, GPU {u / tg / 1e9:.3f} updates/ns,"
            f" GPU/CPU {tc / tg:.1f}x, same bits {same}"
        )
