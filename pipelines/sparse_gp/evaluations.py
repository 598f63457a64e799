"""The sparse-GP objective on the cluster: the chunks, the starting point, and :class:`Evaluations`
(one statistics pass and one gradient pass over the chunks per L-BFGS-B evaluation, summed in chunk
order, so the bound and its gradient are the same bits on any number of workers)."""

from __future__ import annotations

import itertools
import math
import time

import dask
import numpy as np

from pgmflow.pipelines.core.errors import ConfigError
from pgmflow.tasks import rng as trng
from pgmflow.tasks.gp import bounds as gbounds
from pgmflow.tasks.gp import kernels as kern
from pgmflow.tasks.gp import stats as gstats
from pgmflow.tasks.gp.chunks import FileRows, chunk_grad_task, chunk_stats_task, split_rows
from pgmflow.tasks.gp.data import heldout_rows, open_npy, split_key
from pgmflow.tasks.gp.inducing import GP_STREAM_INDUCING, kmeans_pp

METHODS = ("sgpr", "fitc", "dtc", "svgp", "exact")
EXACT_MAX_N = 20_000  # method=exact factors an n x n matrix: refused above this many training rows
LOG_BOX = (math.log(1e-5), math.log(1e5))  # L-BFGS-B box on every log hyperparameter (as pgmflow.tasks.gp.exact)
GATHER_BATCH = 16  # chunk results gathered (and added) at a time: bounds the driver's memory


def chunk_ranges(data, chunk_size):
    return gstats.chunk_bounds(data.n, chunk_size)


def chunk_refs(ex, data, chunk_size: int, seed: int, fraction: float):
    """One handle per chunk, in chunk order: ``FileRows`` for memory-mapped data (tasks read the
    file), otherwise the future of the chunk scattered once. Also the training rows per chunk."""
    key = split_key(seed)
    std = data.standardizer
    refs, counts = [], []
    for a, b in chunk_ranges(data, chunk_size):
        test = heldout_rows(key, a, b, fraction)
        counts.append(int((~test).sum()))
        if data.memmap:
            refs.append(FileRows(data.path, int(a), int(b), int(data.target_col), key, float(fraction),
                                 tuple(float(v) for v in std.x_mean), tuple(float(v) for v in std.x_std),
                                 float(std.y_mean), float(std.y_std)))
        else:
            A = np.column_stack([data.X[a:b], data.y[a:b]])
            refs.append(ex.scatter(split_rows(A, data.d, test, std)))
    return refs, np.asarray(counts, dtype=np.int64)


def inducing_pool(data, seed: int, fraction: float, max_points: int) -> np.ndarray:
    """Training inputs (original units) that k-means++ runs on: all of them, or a seeded subsample of
    ``max_points`` rows (read row by row from the file for memory-mapped data)."""
    key = split_key(seed)
    g = trng.generator(seed, trng.STAGE_GP, GP_STREAM_INDUCING, 1)
    if data.memmap:
        train = np.flatnonzero(~heldout_rows(key, 0, data.n, fraction))
        if train.size > max_points:
            train = train[np.sort(g.choice(train.size, size=max_points, replace=False))]
        A = np.asarray(open_npy(data.path)[train], dtype=np.float64)
        return np.ascontiguousarray(np.delete(A, data.target_col, axis=1))
    X = data.X[~heldout_rows(key, 0, data.n, fraction)]
    if X.shape[0] > max_points:
        X = X[np.sort(g.choice(X.shape[0], size=max_points, replace=False))]
    return X


def initial_inducing(pool_std: np.ndarray, m: int, seed: int, n_iter: int, max_points: int) -> np.ndarray:
    try:
        return kmeans_pp(trng.generator(seed, trng.STAGE_GP, GP_STREAM_INDUCING), pool_std, m, n_iter=n_iter,
                         max_points=max_points)
    except ValueError as exc:
        raise ConfigError("sparse_gp.m", m, f"k-means++ cannot place the inducing inputs ({exc})",
                          "use fewer inducing inputs") from None


GP_STREAM_RESTART = 3  # first identity element under rng.STAGE_GP: restarts' starting points (then: restart)


def restart_params(scfg: dict, pool_std: np.ndarray, seed: int, r: int) -> kern.GPParams:
    """The starting hyperparameters of restart ``r`` >= 1 (standardised units), drawn from ``(seed,
    r)`` alone: each lengthscale log-uniform from 5 % to twice its input's range in the data, the
    signal variance the configured one times exp(N(0, 0.5^2)), the noise log-uniform in [1e-3, 0.5];
    everything inside the optimiser's box."""
    g = trng.generator(seed, trng.STAGE_GP, GP_STREAM_RESTART, int(r))
    span = np.ptp(pool_std, axis=0)
    span = np.where(span > 0, span, 1.0)
    ls = np.exp(g.uniform(np.log(0.05 * span), np.log(2.0 * span)))
    variance = float(scfg["variance"]) * math.exp(g.normal(0.0, 0.5))
    noise = math.exp(g.uniform(math.log(1e-3), math.log(0.5)))
    lo, hi = math.exp(LOG_BOX[0]), math.exp(LOG_BOX[1])
    return kern.make_params(np.clip(ls, lo, hi), min(max(variance, lo), hi), min(max(noise, lo), hi),
                            d=pool_std.shape[1])


def initial_params(scfg: dict, d: int) -> kern.GPParams:
    ls = scfg["lengthscale"]
    return kern.make_params(ls if not isinstance(ls, (list, tuple)) else list(ls), float(scfg["variance"]),
                            float(scfg["noise"]), d=d)


class Evaluations:
    """The objective of L-BFGS-B over ``theta = pack(params, Z)`` (``Z`` only with
    ``optimize_inducing``): ``f(theta) -> (-bound, -gradient)``, one stats pass and one gradient pass
    over the chunks ``refs`` per call. A point evaluated recently is answered from ``records``
    without new passes; a Cholesky that fails at every jitter gives ``(inf, 0)`` (the line search
    backs off). ``count`` and ``seconds`` count the evaluations and their wall time.
    """

    def __init__(self, ex, refs, method, kernel, d, m, Z0, optimize_inducing, jitter, max_tries, backend, tok):
        self.ex, self.refs, self.method, self.kernel = ex, refs, method, kernel
        self.d, self.m, self.Z0, self.opt = d, m, Z0, optimize_inducing
        self.jitter, self.max_tries, self.backend, self.tok = jitter, max_tries, backend, tok
        self.count = 0
        self.failed = 0
        self.records: dict[bytes, tuple] = {}  # theta -> (value, stats, abs./rel. jitter, grad, start), the last few
        self.jitters: list[float] = []  # relative jitter of every successful evaluation
        self.first_growth = None
        self.seconds = 0.0
        self._serial = itertools.count()  # task keys: unique for the life of the object, whatever count says

    def unpack(self, theta):
        p, Z = kern.unpack(theta, self.d, self.m if self.opt else 0)
        return p, (self.Z0 if Z is None else Z)

    def stats(self, params, Z, jitter):
        k = next(self._serial)
        outs = [dask.delayed(chunk_stats_task, pure=True)(
            self.method, self.kernel, params, Z, ref, jitter, self.backend,
            dask_key_name=f"gp-stats-{self.tok}-p{k}-c{c}") for c, ref in enumerate(self.refs)]
        return self.ex.sum_ordered(outs, batch=GATHER_BATCH)

    def objective(self, params, Z):
        """``(value, adjoints, stats, starting jitter)``. ``bounds.objective`` retries ``Kuu``'s
        Cholesky with a growing jitter itself; when ``B = I + A A'`` will not factor (``Kuu`` factored
        with a jitter too small for its conditioning), the whole objective is retried from a tenfold
        larger jitter, up to ``max_tries`` times (FITC's statistics depend on the jitter: recomputed)."""
        st = self.stats(params, Z, self.jitter)
        for k in range(self.max_tries):
            jit = self.jitter * 10.0**k
            try:
                if k and self.method == "fitc":
                    st = self.stats(params, Z, jit)
                value, adj = gbounds.objective(self.method, self.kernel, params, Z, st, jit, self.max_tries - k)
                return value, adj, st, jit
            except kern.CholeskyError:
                if k == self.max_tries - 1:
                    raise
        raise AssertionError("unreachable")

    def __call__(self, theta):
        theta = np.asarray(theta, dtype=np.float64)
        rec = self.records.get(theta.tobytes())
        if rec is not None:  # the same point again (the optimiser's first call): no new passes
            return -rec[0], -rec[4]
        t0 = time.monotonic()
        params, Z = self.unpack(theta)
        try:
            value, adj, st, jit0 = self.objective(params, Z)
            # the adjoints (m x m) are one node of the graph: sent once, fetched once by each worker
            k = next(self._serial)
            d_adj = dask.delayed(adj, name=f"gp-adjoints-{self.tok}-p{k}", traverse=False)
            outs = [dask.delayed(chunk_grad_task, pure=True)(
                self.method, self.kernel, params, Z, ref, d_adj, self.backend,
                dask_key_name=f"gp-grad-{self.tok}-p{k}-c{c}") for c, ref in enumerate(self.refs)]
            g = self.ex.sum_ordered(outs, batch=GATHER_BATCH)
            dparams, dZ = gbounds.finish_grad(self.method, self.kernel, params, Z, adj, g)
        except kern.CholeskyError:
            self.count += 1
            self.failed += 1
            self.seconds += time.monotonic() - t0
            return np.inf, np.zeros_like(theta)
        self.count += 1
        self.seconds += time.monotonic() - t0
        grad = kern.pack(dparams, dZ if self.opt else None)
        if not (math.isfinite(value) and np.all(np.isfinite(grad))):
            self.failed += 1
            return np.inf, np.zeros_like(theta)
        rel = adj.jitter / params.variance
        self.jitters.append(rel)
        if self.first_growth is None and rel > self.jitter * 1.5:
            self.first_growth = (self.count, rel)
        self.records[theta.tobytes()] = (value, st, adj.jitter, rel, grad, jit0)
        while len(self.records) > 8:
            self.records.pop(next(iter(self.records)))
        return -value, -grad


def lbfgs_box(d, m, opt):
    return [LOG_BOX] * (d + 2) + ([(None, None)] * (m * d) if opt else [])
