"""What a benchmark result names as its machine."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo, or what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def emit(text: str, out: Path | None) -> None:
    """Print a benchmark's report and, with ``--out``, write it there too."""
    print("\n" + text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)


# --- machine limits: single-core BLAS rates and STREAM-like bandwidth (issue 18) --------------------
# Each probe runs in a child process with every BLAS / OpenMP / numba pool pinned to the requested
# number of threads, so a benchmark's own imports cannot change what is measured.

_BLAS_PROBE = r"""
import json, time, numpy as np
rng = np.random.default_rng(0)
def best(f, flops, seconds=0.2):
    reps = 1
    while True:  # enough calls per timing to last ``seconds``
        t0 = time.perf_counter()
        for _ in range(reps):
            f()
        if time.perf_counter() - t0 >= seconds:
            break
        reps *= 2
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            f()
        times.append((time.perf_counter() - t0) / reps)
    return flops / min(times) / 1e9
m, n = %(m)d, %(n)d
A = rng.standard_normal((m, n)); x = rng.standard_normal(n); y = rng.standard_normal(m)
gemv = best(lambda: A @ x, 2.0 * m * n)
gemv_t = best(lambda: A.T @ y, 2.0 * m * n)
k = %(k)d
B = rng.standard_normal((k, k)); C = rng.standard_normal((k, k))
gemm = best(lambda: B @ C, 2.0 * k ** 3)
print(json.dumps({"dgemv": gemv, "dgemv_t": gemv_t, "dgemm": gemm}))
"""

_STREAM_PROBE = r"""
import json, time, numpy as np, numba as nb
nb.set_num_threads(%(threads)d)
@nb.njit(parallel=True, fastmath=False)
def triad(a, b, c, s):
    for i in nb.prange(a.shape[0]):
        a[i] = b[i] + s * c[i]
@nb.njit(parallel=True, fastmath=False)
def copy(a, b):
    for i in nb.prange(a.shape[0]):
        a[i] = b[i]
n = %(n)d
a = np.zeros(n); b = np.ones(n); c = np.full(n, 2.0)
triad(a, b, c, 3.0); copy(a, b)
def best(f):
    out = []
    for _ in range(7):
        t0 = time.perf_counter(); f(); out.append(time.perf_counter() - t0)
    return min(out)
print(json.dumps({"copy": 16.0 * n / best(lambda: copy(a, b)) / 1e9,
                  "triad": 24.0 * n / best(lambda: triad(a, b, c, 3.0)) / 1e9}))
"""


def _probe(code: str, threads: int) -> dict:
    import json
    import os
    import subprocess
    import sys

    env = dict(
        os.environ,
        OPENBLAS_NUM_THREADS=str(threads),
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        NUMBA_NUM_THREADS=str(max(threads, 1)),
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def blas_rates_1core(m: int = 1000, n: int = 100, k: int = 1000) -> dict:
    """GFLOP/s of float64 BLAS on one thread, best of repeated calls: ``dgemv`` (``A x``, A [m, n]),
    ``dgemv_t`` (``A^T y``) and ``dgemm`` (k x k times k x k); 2 FLOPs per multiply-add."""
    return _probe(_BLAS_PROBE % {"m": m, "n": n, "k": k}, 1)


def stream_bandwidth(threads: int = 1, n: int = 1 << 23) -> dict:
    """GB/s of STREAM-like loops over float64 arrays of ``n`` entries (64 MiB each by default, far
    beyond the caches): ``copy`` a = b (16 bytes per entry) and ``triad`` a = b + s c (24 bytes),
    numba ``prange`` on ``threads`` threads, best of 7 runs; STREAM's byte counts (no write-allocate)."""
    return _probe(_STREAM_PROBE % {"threads": threads, "n": n}, threads)
