"""Inducing-point GP regression: statistics summed over data chunks held by the workers.

The data ``X`` [n, d], ``y`` [n] is cut into chunks of ``sparse_gp.chunk_size`` rows (the chunks
depend on that alone). In-memory data (synthetic, CSV, .npz) is standardised on the driver and each
chunk is put on the cluster once (``Executor.scatter``, with lineage); later tasks take its future.
An ``.npy`` file is never loaded whole: a chunk task receives ``FileRows`` (the path and a row
range, a few hundred bytes) and reads its rows from the memory-mapped file, so a worker's memory is
bounded by the chunk size. Each row is a training or a held-out row by a hash of its index
(``pipelines.gp_data.heldout_rows``), whatever the chunking.

SGPR, DTC, FITC (``sparse_gp.method``): L-BFGS-B on the driver (``scipy.optimize.minimize``,
``jac=True``) over the log hyperparameters and, with ``optimize_inducing``, the inducing inputs ``Z``.
One function evaluation::

    driver: theta --> chunk_stats(chunk c) for every c                 one task per chunk
    driver: sum the statistics in chunk order; bounds.objective (m x m algebra) -> value, adjoints
    driver: adjoints (m x m) onto the cluster once --> chunk_grad(chunk c) for every c
    driver: sum the gradients in chunk order; bounds.finish_grad -> the gradient

SVGP: minibatch ``t`` holds the training rows ``tasks.gp.svgp.minibatch_indices(seed, t, ...)``; one
task per chunk returns its rows of a block of minibatches, and the driver takes a natural-gradient
step of ``q(u)`` and an Adam step of the hyperparameters per minibatch. The full-data ELBO is a
chunked pass every ``svgp_eval_every`` steps. Exact GP: one task fits ``tasks.gp.exact.fit`` on the
training rows (at most ``EXACT_MAX_N``) and predicts the held-out rows.

Test RMSE and NLPD are a chunked pass too (per-chunk sums, added in chunk order), in original units.
Every sum runs in chunk order and every random number comes from ``tasks.rng`` with ``STAGE_GP`` and
an identity (inducing-input subsample, k-means++, minibatch step), so the results are bit-identical
on any number of workers. With ``backend=cupy`` the chunk statistics and gradients are computed on
CuPy arrays (the chunk is moved to the GPU inside the task; the sums come back as NumPy).
"""

from __future__ import annotations

import itertools
import json
import math
import pickle
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import dask
import numpy as np

from pipelines import gp_data
from pipelines.errors import ConfigError
from pipelines.progress import Progress
from tasks import rng as trng
from tasks.gp import bounds as gbounds
from tasks.gp import exact as gexact
from tasks.gp import kernels as kern
from tasks.gp import stats as gstats
from tasks.gp import svgp as gsvgp
from tasks.gp.data import Standardizer
from tasks.gp.inducing import GP_STREAM_INDUCING, kmeans_pp

METHODS = ("sgpr", "fitc", "dtc", "svgp", "exact")
EXACT_MAX_N = 20_000  # method=exact factors an n x n matrix: refused above this many training rows
LOG_BOX = (math.log(1e-5), math.log(1e5))  # L-BFGS-B box on every log hyperparameter (as tasks.gp.exact)
GATHER_BATCH = 16  # chunk results gathered (and added) at a time: bounds the driver's memory
SVGP_BLOCK = 20  # SVGP minibatches fetched per round of chunk tasks
SLICE_POINTS = 200


# --- chunks and the tasks that read them --------------------------------------------------------

class Chunk(NamedTuple):
    """One chunk of rows, split and standardised.

    X: float64 [n_c, d] standardised training inputs; y: float64 [n_c] standardised training targets.
    Xt: float64 [t_c, d] standardised held-out inputs; yt: float64 [t_c] held-out targets, original units.
    """

    X: np.ndarray
    y: np.ndarray
    Xt: np.ndarray
    yt: np.ndarray


class FileRows(NamedTuple):
    """What a chunk task of memory-mapped data receives: rows ``start:stop`` of the ``.npy`` file at
    ``path`` (target column ``target``), the split key and fraction, and the standardisation."""

    path: str
    start: int
    stop: int
    target: int
    split_key: int
    test_fraction: float
    x_mean: tuple
    x_std: tuple
    y_mean: float
    y_std: float


def _split(A: np.ndarray, target: int, test: np.ndarray, std: Standardizer) -> Chunk:
    inputs = [j for j in range(A.shape[1]) if j != target]
    X, y = A[:, inputs], A[:, target]
    train = ~test
    return Chunk(np.ascontiguousarray(std.apply_X(X[train])), std.apply_y(y[train]),
                 np.ascontiguousarray(std.apply_X(X[test])), np.ascontiguousarray(y[test]))


def load_chunk(ref) -> Chunk:
    """The chunk a task was given: a :class:`Chunk` as it is, or a :class:`FileRows` read from its file."""
    if isinstance(ref, Chunk):
        return ref
    A = np.asarray(gp_data.open_npy(ref.path)[ref.start:ref.stop], dtype=np.float64)  # [rows, d + 1]
    test = gp_data.heldout_rows(ref.split_key, ref.start, ref.stop, ref.test_fraction)
    std = Standardizer(np.asarray(ref.x_mean), np.asarray(ref.x_std), ref.y_mean, ref.y_std)
    return _split(A, ref.target, test, std)


def _device(backend: str, *arrays):
    if backend != "cupy":
        return arrays
    from tasks import backend as tbackend

    xp = tbackend.get_xp("cupy")
    return tuple(xp.asarray(a) for a in arrays)


def _zero_stats(method: str, m: int):
    z1, z2 = np.zeros(m), np.zeros((m, m))
    return gstats.FITCStats(0, 0.0, 0.0, z1, z2) if method == "fitc" else gstats.Stats(0, 0.0, 0.0, z1, z2)


def chunk_stats_task(method, kernel, params, Z, ref, jitter, backend):
    """Statistics of one chunk's training rows (zeros when it has none)."""
    c = load_chunk(ref)
    if c.X.shape[0] == 0:
        return _zero_stats(method, Z.shape[0])
    X, y = _device(backend, c.X, c.y)
    return gstats.chunk_stats(method, kernel, params, Z, X, y, jitter)


def chunk_grad_task(method, kernel, params, Z, ref, adjoints, backend):
    """Gradient contribution of one chunk's training rows."""
    c = load_chunk(ref)
    m, d = Z.shape
    if c.X.shape[0] == 0:
        return gstats.Grad(np.zeros(d), 0.0, 0.0, np.zeros((m, d)), np.zeros((m, m)))
    X, y = _device(backend, c.X, c.y)
    return gstats.chunk_grad(method, kernel, params, Z, X, y, adjoints)


class Predictor(NamedTuple):
    """A fitted model, enough to predict (standardised units): ``method`` in sgpr|fitc|dtc (with the
    summed ``stats``) or svgp (with ``state``)."""

    method: str
    kernel: str
    params: kern.GPParams
    Z: np.ndarray
    stats: object
    state: object
    jitter: float
    max_tries: int


def predict_f(pred: Predictor, Xs):
    """Mean and variance [n*] of the latent f at standardised inputs Xs [n*, d]."""
    if pred.method == "svgp":
        return gsvgp.svgp_predict(pred.kernel, pred.params, pred.Z, pred.state, Xs, jitter=pred.jitter)
    return gbounds.predict(pred.method, pred.kernel, pred.params, pred.Z, pred.stats, Xs, jitter=pred.jitter,
                           max_tries=pred.max_tries)


def _test_sums(mean_f, var_f, noise, yt, std: Standardizer):
    """(rows, sum of squared errors, sum of negative log predictive densities), original units."""
    if yt.shape[0] == 0:
        return 0, 0.0, 0.0
    mu = std.invert_mean(mean_f)
    var = std.invert_var(np.asarray(var_f) + noise)
    r = yt - mu
    nlpd = 0.5 * (np.log(2.0 * np.pi * var) + r * r / var)
    return int(yt.shape[0]), float(r @ r), float(np.sum(nlpd))


def chunk_test_task(pred: Predictor, ref, std: Standardizer):
    """Test sums of one chunk's held-out rows."""
    c = load_chunk(ref)
    if c.Xt.shape[0] == 0:
        return 0, 0.0, 0.0
    mean, var = predict_f(pred, c.Xt)
    return _test_sums(mean, var, pred.params.noise, c.yt, std)


def chunk_rows_task(ref, selections):
    """The training rows ``sel`` (indices within the chunk's training rows) of each minibatch: a list
    of ``(X [b_c, d], y [b_c])``."""
    c = load_chunk(ref)
    return [(c.X[s], c.y[s]) for s in selections]


def chunk_elbo_task(kernel, params, Z, state, ref, jitter):
    """``(ELBO of the chunk's training rows alone, rows)``: ``ell_c - KL`` (see :func:`_full_elbo`)."""
    c = load_chunk(ref)
    if c.X.shape[0] == 0:
        return 0.0, 0
    return gsvgp.svgp_elbo(kernel, params, Z, state, c.X, c.y, c.X.shape[0], jitter), int(c.X.shape[0])


def exact_task(kernel, params0, max_iter, chunks, std: Standardizer, Xslice):
    """Fit the exact GP on every chunk's training rows; predict the held-out rows (test sums per
    chunk, in chunk order) and the slice inputs ``Xslice`` [P, d], with one factorisation."""
    cs = [load_chunk(r) for r in chunks]
    X = np.concatenate([c.X for c in cs])
    y = np.concatenate([c.y for c in cs])
    lml0 = gexact.log_marginal_likelihood(kernel, params0, X, y)
    fit = gexact.fit(kernel, X, y, params0, maxiter=max_iter)
    Xs = np.concatenate([c.Xt for c in cs] + [Xslice])
    mean, var = gexact.predict(kernel, fit.params, X, y, Xs)
    sums, a = [], 0
    for c in cs:
        b = a + c.Xt.shape[0]
        sums.append(_test_sums(mean[a:b], var[a:b], fit.params.noise, c.yt, std))
        a = b
    return {"fit": fit, "lml0": float(lml0), "sums": sums, "slice": (mean[a:], var[a:]), "X": X, "y": y}


# --- driver-side helpers ------------------------------------------------------------------------

def _chunk_ranges(data, chunk_size):
    return gstats.chunk_bounds(data.n, chunk_size)


def chunk_refs(ex, data: gp_data.GPData, chunk_size: int, seed: int, fraction: float):
    """One handle per chunk, in chunk order: ``FileRows`` for memory-mapped data (tasks read the
    file), otherwise the future of the chunk scattered once. Also the training rows per chunk."""
    key = gp_data.split_key(seed)
    std = data.standardizer
    refs, counts = [], []
    for a, b in _chunk_ranges(data, chunk_size):
        test = gp_data.heldout_rows(key, a, b, fraction)
        counts.append(int((~test).sum()))
        if data.memmap:
            refs.append(FileRows(data.path, int(a), int(b), int(data.target_col), key, float(fraction),
                                 tuple(float(v) for v in std.x_mean), tuple(float(v) for v in std.x_std),
                                 float(std.y_mean), float(std.y_std)))
        else:
            A = np.column_stack([data.X[a:b], data.y[a:b]])
            refs.append(ex.scatter(_split(A, data.d, test, std)))
    return refs, np.asarray(counts, dtype=np.int64)


def _ordered_sum(ex, outputs):
    """Compute delayed ``outputs`` and add their results left to right (chunk order), gathering a
    few at a time."""
    handles = ex.compute(outputs)
    total = None
    for i in range(0, len(handles), GATHER_BATCH):
        part = ex.gather(handles[i:i + GATHER_BATCH])
        for p in part:
            total = p if total is None else total + p
        ex.release(handles[i:i + GATHER_BATCH])
    return total


def _ordered_results(ex, outputs):
    handles = ex.compute(outputs)
    out = ex.gather(handles)
    ex.release(handles)
    return out


def inducing_pool(data: gp_data.GPData, seed: int, fraction: float, max_points: int) -> np.ndarray:
    """Training inputs (original units) that k-means++ runs on: all of them, or a seeded subsample of
    ``max_points`` rows (read row by row from the file for memory-mapped data)."""
    key = gp_data.split_key(seed)
    g = trng.generator(seed, trng.STAGE_GP, GP_STREAM_INDUCING, 1)
    if data.memmap:
        train = np.flatnonzero(~gp_data.heldout_rows(key, 0, data.n, fraction))
        if train.size > max_points:
            train = train[np.sort(g.choice(train.size, size=max_points, replace=False))]
        A = np.asarray(gp_data.open_npy(data.path)[train], dtype=np.float64)
        return np.ascontiguousarray(np.delete(A, data.target_col, axis=1))
    X = data.X[~gp_data.heldout_rows(key, 0, data.n, fraction)]
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
        return _ordered_sum(self.ex, outs)

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
            g = _ordered_sum(self.ex, outs)
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


# --- the run -------------------------------------------------------------------------------------

def run(ctx) -> dict:
    cfg = ctx.cfg
    scfg = cfg["sparse_gp"]
    seed = int(cfg["seed"])
    tracker, ex = ctx.tracker, ctx.executor
    data = gp_data.resolve(cfg)
    method, kernel = str(scfg["method"]), str(scfg["kernel"])
    fraction = float(scfg["test_fraction"])
    chunk_size = int(scfg["chunk_size"])
    m = int(scfg["m"])
    tok = tracker.run_id[:12]
    backend = ctx.backend
    n_chunks = len(_chunk_ranges(data, chunk_size))
    access = (f"memmap: each chunk task reads its rows of {data.path}" if data.memmap
              else "scattered: each chunk put on the cluster once")
    print(f"pgmflow: {gp_data.describe(data)}", flush=True)
    print(f"pgmflow: method {method}, kernel {kernel}" + (f", m={m} inducing inputs" if method != "exact" else "")
          + f"; {n_chunks} chunk(s) of <= {chunk_size} rows ({access.split(':')[0]}); backend {backend}", flush=True)
    tracker.set_tags({"pgmflow.gp.method": method, "pgmflow.gp.kernel": kernel, "pgmflow.gp.source": data.source[:250],
                      "pgmflow.gp.data_access": access[:250], "pgmflow.gp.backend": backend})
    t_start = time.monotonic()
    refs, train_counts = chunk_refs(ex, data, chunk_size, seed, fraction)
    ref_bytes = max(len(pickle.dumps(r)) for r in refs) if data.memmap else 0
    tracker.log_metrics({"rows": data.n, "inputs": data.d, "train_rows": data.n_train, "test_rows": data.n_test,
                         "chunks": n_chunks, **({"chunk_ref_bytes": ref_bytes} if data.memmap else {})}, step=0)

    std = data.standardizer
    pool = inducing_pool(data, seed, fraction, int(scfg["kmeans_points"]))
    median = np.median(pool, axis=0)
    lo, hi = pool.min(axis=0), pool.max(axis=0)
    params0 = initial_params(scfg, data.d)
    Z0 = None
    if method != "exact":
        Z0 = initial_inducing(std.apply_X(pool), m, seed, int(scfg["kmeans_iter"]), int(scfg["kmeans_points"]))

    if method in gstats.METHODS:
        fit = _fit_collapsed(ctx, scfg, method, kernel, refs, data, params0, Z0, tok, backend)
    elif method == "svgp":
        fit = _fit_svgp(ctx, scfg, kernel, refs, train_counts, data, params0, Z0, seed, tok)
    else:
        fit = None
    j_slice = gp_data.slice_dim(scfg.get("slice_dim"), data)
    if method == "exact":
        dims = [j_slice] if j_slice is not None else list(range(min(data.d, 50)))
        grids = {j: _slice_grid(data, median, lo, hi, j) for j in dims}  # every candidate: the fit picks one
        fit = _fit_exact(ctx, scfg, kernel, refs, data, params0, np.concatenate([grids[j][0] for j in dims]), tok)
        if j_slice is None:
            j_slice = dims[int(np.argmin(np.asarray(fit["predictor"].params.lengthscale)[dims]))]
        k = dims.index(j_slice)
        mean, var = fit["slice"]
        fit["slice"] = (mean[k * SLICE_POINTS:(k + 1) * SLICE_POINTS], var[k * SLICE_POINTS:(k + 1) * SLICE_POINTS])
        sums = fit["sums"]
    else:
        if j_slice is None:
            j_slice = int(np.argmin(np.asarray(fit["predictor"].params.lengthscale)))
        grids = {j_slice: _slice_grid(data, median, lo, hi, j_slice)}
        h_pred = ex.scatter(fit["predictor"])  # summed statistics (m x m) or q(u): to the cluster once
        outs = [dask.delayed(chunk_test_task, pure=True)(h_pred, ref, std, dask_key_name=f"gp-test-{tok}-c{c}")
                for c, ref in enumerate(refs)]
        sums = _ordered_results(ex, outs)
        ex.release([h_pred])
        fit["slice"] = predict_f(fit["predictor"], grids[j_slice][0])
    seconds = time.monotonic() - t_start
    n_test = sum(s[0] for s in sums)
    sse = 0.0
    nlpd = 0.0
    for s in sums:  # chunk order
        sse += s[1]
        nlpd += s[2]
    rmse = math.sqrt(sse / n_test)
    mean_nlpd = nlpd / n_test
    return _finish(ctx, scfg, data, method, kernel, fit, rmse, mean_nlpd, n_test, seconds,
                   (j_slice, *grids[j_slice]), median)


def _slice_grid(data, median, lo, hi, j):
    """(standardised inputs [P, d], original-units values of input j [P]): input j over its training
    range (and 5% beyond), the others at their training medians."""
    span = hi[j] - lo[j]
    pad = 0.05 * span if span > 0 else 1.0
    xs = np.linspace(lo[j] - pad, hi[j] + pad, SLICE_POINTS)
    G = np.tile(median, (SLICE_POINTS, 1))
    G[:, j] = xs
    return data.standardizer.apply_X(G), xs


def _fit_collapsed(ctx, scfg, method, kernel, refs, data, params0, Z0, tok, backend):
    import scipy.optimize

    tracker = ctx.tracker
    opt = bool(scfg["optimize_inducing"])
    m, d = Z0.shape
    max_iter = int(scfg["max_iter"])
    ev = Evaluations(ctx.executor, refs, method, kernel, d, m, Z0, opt, float(scfg["jitter"]),
                      int(scfg["max_tries"]), backend, tok)
    theta0 = kern.pack(params0, Z0 if opt else None)
    f0, _ = ev(theta0)
    if not math.isfinite(f0):
        raise ConfigError("sparse_gp.jitter", scfg["jitter"], f"Kuu = K(Z, Z) could not be factored at the initial "
                          f"hyperparameters even with the jitter raised {scfg['max_tries']} times",
                          "raise sparse_gp.jitter or sparse_gp.max_tries, or start from a shorter sparse_gp.lengthscale")
    trace = [(0, -f0, ev.records[theta0.tobytes()][3])]
    tracker.log_metrics({"bound": -f0, "jitter": trace[0][2]}, step=0)
    _note_jitter(ev, scfg)
    bar = Progress(max_iter, f"sparse_gp {method}", "iterations", enabled=ctx.progress)

    def callback(intermediate_result):
        x = np.asarray(intermediate_result.x)
        rec = ev.records.get(x.tobytes())
        value = -float(intermediate_result.fun)
        rel = rec[3] if rec is not None else float("nan")
        k = len(trace)
        trace.append((k, value, rel))
        tracker.log_metrics({"bound": value, "jitter": rel}, step=k)
        bar.update(1, bound=value)

    t0 = time.monotonic()
    res = scipy.optimize.minimize(ev, theta0, jac=True, method="L-BFGS-B", bounds=lbfgs_box(d, m, opt),
                                  callback=callback, options={"maxiter": max_iter})
    seconds = time.monotonic() - t0
    bar.close()
    _note_jitter(ev, scfg)
    x = np.asarray(res.x)
    rec = ev.records.get(x.tobytes())
    if rec is None:  # the optimiser's answer was not the last point evaluated: one more pass
        ev(x)
        rec = ev.records.get(x.tobytes())
    if rec is None:
        raise RuntimeError("the bound could not be evaluated at the optimiser's answer")
    params, Z = ev.unpack(x)
    value, st, jit_abs, rel, _, jit0 = rec
    pred = Predictor(method, kernel, params, Z, st, None, jit0, int(scfg["max_tries"]))
    return {"predictor": pred, "trace": trace, "value": value, "iterations": int(res.nit), "evaluations": ev.count,
            "failed_evaluations": ev.failed, "success": bool(res.success), "message": str(res.message),
            "fit_seconds": seconds, "seconds_per_evaluation": ev.seconds / max(ev.count, 1),
            "jitter_max": max(ev.jitters), "jitter_final": rel, "jitter_abs_final": jit_abs}


def _note_jitter(ev, scfg):
    if ev.first_growth is not None and not getattr(ev, "_noted", False):
        ev._noted = True
        k, rel = ev.first_growth
        print(f"pgmflow: note: a Cholesky factorisation (Kuu = K(Z, Z) + jitter s I, or I + A A') failed with the "
              f"jitter {float(scfg['jitter']):.3g} x s at evaluation {k}; retried with a tenfold larger jitter each "
              f"time, it succeeded with {rel:.3g} x s (every iteration's jitter is the metric 'jitter', the largest "
              "'final_jitter_max')", flush=True)


def _fit_svgp(ctx, scfg, kernel, refs, train_counts, data, params0, Z0, seed, tok):
    tracker, ex = ctx.tracker, ctx.executor
    opt = bool(scfg["optimize_inducing"])
    m, d = Z0.shape
    n = int(train_counts.sum())
    steps = int(scfg["svgp_steps"])
    bs = min(int(scfg["svgp_batch_size"]), n)
    rho, lr = float(scfg["svgp_rho"]), float(scfg["svgp_lr"])
    every = int(scfg["svgp_eval_every"])
    jitter = float(scfg["jitter"])
    offsets = np.concatenate([[0], np.cumsum(train_counts)])
    state = gsvgp.svgp_init(m)
    theta = kern.pack(params0, Z0 if opt else None)
    adam = gsvgp.adam_init(theta)
    lo_box, hi_box = LOG_BOX

    def unpack(th):
        p, Z = kern.unpack(th, d, m if opt else 0)
        return p, (Z0 if Z is None else Z)

    def full_elbo(params, Z, state, k):
        outs = [dask.delayed(chunk_elbo_task, pure=True)(kernel, params, Z, state, ref, jitter,
                                                        dask_key_name=f"gp-elbo-{tok}-s{k}-c{c}")
                for c, ref in enumerate(refs)]
        parts = _ordered_results(ex, outs)
        kl = -gsvgp.svgp_elbo(kernel, params, Z, state, Z[:1], np.zeros(1), 0, jitter)  # n = 0: the KL alone
        total = 0.0
        for v, rows in parts:  # chunk order; each chunk's ELBO counts the KL once
            if rows:
                total += v + kl
        return total - kl

    trace, mb_trace = [], []
    params, Z = unpack(theta)
    v0 = full_elbo(params, Z, state, 0)
    trace.append((0, v0))
    tracker.log_metrics({"bound": v0}, step=0)
    bar = Progress(steps, "sparse_gp svgp", "steps", enabled=ctx.progress)
    t0 = time.monotonic()
    for s0 in range(0, steps, SVGP_BLOCK):
        block = list(range(s0, min(steps, s0 + SVGP_BLOCK)))
        idx = [gsvgp.minibatch_indices(seed, t, n, bs) for t in block]
        outs, which = [], []
        for c, ref in enumerate(refs):
            a, b = offsets[c], offsets[c + 1]
            sel = [i[(i >= a) & (i < b)] - a for i in idx]
            if any(s.size for s in sel):
                outs.append(dask.delayed(chunk_rows_task, pure=True)(ref, sel, dask_key_name=f"gp-rows-{tok}-s{s0}-c{c}"))
                which.append(c)
        got = _ordered_results(ex, outs)
        for k, t in enumerate(block):
            Xb = np.concatenate([g[k][0] for g in got])
            yb = np.concatenate([g[k][1] for g in got])
            params, Z = unpack(theta)
            try:
                state = gsvgp.natgrad_step(kernel, params, Z, state, Xb, yb, n, rho, jitter)
                elbo, dparams, dZ = gsvgp.svgp_elbo_and_grad(kernel, params, Z, state, Xb, yb, n, jitter)
            except kern.CholeskyError as exc:
                raise RuntimeError(f"SVGP step {t}: {exc}; fix: lower sparse_gp.svgp_lr or sparse_gp.svgp_rho, or "
                                   "raise sparse_gp.jitter") from None
            adam, step = gsvgp.adam_update(adam, -kern.pack(dparams, dZ if opt else None), lr=lr)
            theta = theta + step
            theta[:d + 2] = np.clip(theta[:d + 2], lo_box, hi_box)
            mb_trace.append((t + 1, elbo))
            tracker.log_metrics({"elbo_minibatch": elbo}, step=t + 1)
            if (t + 1) % every == 0 or t + 1 == steps:
                params, Z = unpack(theta)
                v = full_elbo(params, Z, state, t + 1)
                trace.append((t + 1, v))
                tracker.log_metrics({"bound": v}, step=t + 1)
            bar.update(1, elbo=elbo)
    seconds = time.monotonic() - t0
    bar.close()
    params, Z = unpack(theta)
    pred = Predictor("svgp", kernel, params, Z, None, state, jitter, int(scfg["max_tries"]))
    _, jit_abs = kern.inducing_cholesky(kernel, params, Z, jitter, int(scfg["max_tries"]))
    rel = jit_abs / params.variance
    return {"predictor": pred, "trace": [(k, v, float("nan")) for k, v in trace], "minibatch_trace": mb_trace,
            "value": trace[-1][1], "iterations": steps, "evaluations": steps, "failed_evaluations": 0,
            "success": True, "message": f"{steps} SVGP steps", "fit_seconds": seconds,
            "seconds_per_evaluation": seconds / max(steps, 1), "jitter_max": rel, "jitter_final": rel,
            "jitter_abs_final": jit_abs}


def _fit_exact(ctx, scfg, kernel, refs, data, params0, Xslice, tok):
    ex = ctx.executor
    if data.n_train > EXACT_MAX_N:  # preflight refuses this too
        raise ConfigError("sparse_gp.method", "exact", f"the exact GP factors an n x n matrix; n = {data.n_train} "
                          f"training rows is more than {EXACT_MAX_N}", "use sparse_gp.method=sgpr")
    t0 = time.monotonic()
    out = _ordered_results(ex, [dask.delayed(exact_task, pure=True)(
        kernel, params0, int(scfg["max_iter"]), list(refs), data.standardizer, Xslice,
        dask_key_name=f"gp-exact-{tok}")])[0]
    seconds = time.monotonic() - t0
    fit = out["fit"]
    trace = [(0, out["lml0"], 0.0), (max(int(fit.n_iter), 1), float(fit.lml), 0.0)]
    for k, v, _ in trace:
        ctx.tracker.log_metrics({"bound": v}, step=k)
    pred = Predictor("exact", kernel, fit.params, None, None, None, 0.0, 0)
    return {"predictor": pred, "trace": trace, "value": float(fit.lml), "iterations": int(fit.n_iter),
            "evaluations": int(fit.n_iter), "failed_evaluations": 0, "success": bool(fit.success),
            "message": "exact GP (tasks.gp.exact.fit)", "fit_seconds": seconds,
            "seconds_per_evaluation": float("nan"), "jitter_max": 0.0, "jitter_final": 0.0, "jitter_abs_final": 0.0,
            "sums": out["sums"], "slice": out["slice"], "X": out["X"], "y": out["y"]}


def _finish(ctx, scfg, data, method, kernel, fit, rmse, nlpd, n_test, seconds, grid, median) -> dict:
    tracker = ctx.tracker
    pred = fit["predictor"]
    std = data.standardizer
    params = pred.params
    ls_std = np.asarray(params.lengthscale)
    ls_orig = ls_std * std.x_std
    y2 = std.y_std**2
    result = {
        "method": method, "kernel": kernel, "seconds": seconds, "rows": data.n, "inputs": data.d,
        "train_rows": data.n_train, "test_rows": int(n_test), "test_rmse": rmse, "test_nlpd": nlpd,
        "bound": float(fit["value"]), "bound_per_row": float(fit["value"]) / data.n_train,
        "iterations": fit["iterations"], "evaluations": fit["evaluations"],
        "failed_evaluations": fit["failed_evaluations"], "converged": fit["success"], "optimizer": fit["message"],
        "fit_seconds": fit["fit_seconds"], "seconds_per_evaluation": fit["seconds_per_evaluation"],
        "jitter_max": float(fit["jitter_max"]), "jitter_final": float(fit["jitter_final"]),
        "jitter_requested": float(scfg["jitter"]) if method != "exact" else 0.0,
        "noise_variance": params.noise * y2, "kernel_variance": params.variance * y2,
        "lengthscales": [float(v) for v in ls_orig], "input_names": list(data.input_names),
        "standardizer": std.to_dict(),
        "objective": nlpd,
        "objective_name": "test NLPD (mean negative log predictive density of the held-out rows, original units; "
                          "lower is better)",
    }
    final = {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    tracker.log_metrics({f"final_{k}": v for k, v in final.items()}, step=max(fit["iterations"], 1))
    tracker.flush()
    with tempfile.TemporaryDirectory() as tmp:
        arrays = {"method": np.array(method), "kernel": np.array(kernel),
                  "log_lengthscale": np.asarray(params.log_lengthscale, dtype=np.float64),
                  "log_variance": np.float64(params.log_variance), "log_noise": np.float64(params.log_noise),
                  "x_mean": std.x_mean, "x_std": std.x_std, "y_mean": np.float64(std.y_mean),
                  "y_std": np.float64(std.y_std), "input_names": np.array(data.input_names),
                  "target_name": np.array(data.target_name), "jitter": np.float64(fit["jitter_abs_final"]),
                  "bound_trace": np.array([[k, v] for k, v, _ in fit["trace"]], dtype=np.float64),
                  "test_rmse": np.float64(rmse), "test_nlpd": np.float64(nlpd)}
        if pred.Z is not None:
            arrays["Z"] = np.asarray(pred.Z)
        if pred.stats is not None:
            for f, v in pred.stats._asdict().items():
                arrays[f"stats_{f}"] = np.asarray(v)
        if pred.state is not None:
            arrays["svgp_theta1"] = np.asarray(pred.state.theta1)
            arrays["svgp_theta2"] = np.asarray(pred.state.theta2)
        if method == "exact":
            arrays["X_train"] = fit["X"]
            arrays["y_train"] = fit["y"]
        path = Path(tmp) / "model.npz"
        np.savez_compressed(path, **arrays)
        tracker.log_artifact(path)
    tracker.log_dict(result, "results.json")
    if scfg.get("figures", True):
        from pipelines import gp_figures

        j, _, xs = grid
        mean_f, var_f = fit["slice"]
        figs = gp_figures.gp_figures(method, fit["trace"], fit.get("minibatch_trace"), xs,
                                     std.invert_mean(mean_f), std.invert_var(np.asarray(var_f) + params.noise),
                                     std.invert_var(np.asarray(var_f)), data.input_names[j], data.target_name,
                                     median, j, data.input_names, ls_orig)
        for name, fig in figs.items():
            tracker.log_figure(fig, f"figures/{name}.png")
            gp_figures.close(fig)
    _print_summary(result)
    json.dumps(result)  # results must stay JSON-serialisable (logged as results.json)
    return result


def _print_summary(r):
    per = r["seconds_per_evaluation"]
    what = "steps" if r["method"] == "svgp" else "iterations"
    lines = [f"pgmflow: sparse_gp ({r['method']}, {r['kernel']}) finished in {r['seconds']:.1f} s: "
             f"{'ELBO' if r['method'] == 'svgp' else 'bound' if r['method'] == 'sgpr' else 'log marginal likelihood'} "
             f"{r['bound']:.6g} after {r['iterations']} {what}"
             + (f" ({r['evaluations']} evaluations, {per:.3g} s each)" if r["method"] in gstats.METHODS else ""),
             (f"  test RMSE {r['test_rmse']:.6g}, NLPD {r['test_nlpd']:.6g} (original units, {r['test_rows']} "
              f"held-out rows); noise variance {r['noise_variance']:.4g}")]
    if r["jitter_max"] > r["jitter_requested"] * 1.5 and r["method"] != "exact":
        lines.append(f"  note: Kuu needed a jitter of up to {r['jitter_max']:.3g} x s (asked {r['jitter_requested']:.3g}"
                     f"); final {r['jitter_final']:.3g} x s")
    if r["failed_evaluations"]:
        lines.append(f"  note: {r['failed_evaluations']} evaluation(s) could not factor Kuu and were rejected by the "
                     "line search")
    if not r["converged"]:
        lines.append(f"  note: the optimiser stopped before convergence ({r['optimizer']}); raise sparse_gp.max_iter "
                     "for a tighter fit")
    print("\n".join(lines), flush=True)
