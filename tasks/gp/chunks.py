"""What the Dask workers of the sparse-GP workload run: one chunk of rows per task.

A chunk is either held in memory (a :class:`Chunk`, scattered once) or read by the task from a
memory-mapped ``.npy`` file (a :class:`FileRows`: a path and a row range), split into training and
held-out rows by a pure function of the row index (``pgmflow.tasks.gp.data.heldout_rows``) and standardised.
Each task returns something that adds (statistics, gradients, test sums), summed in chunk order by
the driver.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pgmflow.tasks.gp import bounds as gbounds
from pgmflow.tasks.gp import exact as gexact
from pgmflow.tasks.gp import kernels as kern
from pgmflow.tasks.gp import kuf_cache
from pgmflow.tasks.gp import stats as gstats
from pgmflow.tasks.gp import svgp as gsvgp
from pgmflow.tasks.gp.data import Standardizer, heldout_rows, open_npy


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


def split_rows(A: np.ndarray, target: int, test: np.ndarray, std: Standardizer) -> Chunk:
    inputs = [j for j in range(A.shape[1]) if j != target]
    X, y = A[:, inputs], A[:, target]
    train = ~test
    return Chunk(np.ascontiguousarray(std.apply_X(X[train])), std.apply_y(y[train]),
                 np.ascontiguousarray(std.apply_X(X[test])), np.ascontiguousarray(y[test]))


def load_chunk(ref) -> Chunk:
    """The chunk a task was given: a :class:`Chunk` as it is, or a :class:`FileRows` read from its file."""
    if isinstance(ref, Chunk):
        return ref
    A = np.asarray(open_npy(ref.path)[ref.start:ref.stop], dtype=np.float64)  # [rows, d + 1]
    test = heldout_rows(ref.split_key, ref.start, ref.stop, ref.test_fraction)
    std = Standardizer(np.asarray(ref.x_mean), np.asarray(ref.x_std), ref.y_mean, ref.y_std)
    return split_rows(A, ref.target, test, std)


def _device(backend: str, *arrays):
    if backend != "cupy":
        return arrays
    from pgmflow.tasks import backend as tbackend

    xp = tbackend.get_xp("cupy")
    return tuple(xp.asarray(a) for a in arrays)


def _zero_stats(method: str, m: int):
    z1, z2 = np.zeros(m), np.zeros((m, m))
    return gstats.FITCStats(0, 0.0, 0.0, z1, z2) if method == "fitc" else gstats.Stats(0, 0.0, 0.0, z1, z2)


def _kuf_key(kernel, params, Z, c: Chunk, backend):
    """The :mod:`~pgmflow.tasks.gp.kuf_cache` key of this chunk's ``Kuf``, or None where the store
    does not serve (another kernel than RBF, the GPU backend, the store turned off)."""
    if kernel != "rbf" or backend == "cupy" or kuf_cache.budget_bytes() == 0:
        return None
    return kuf_cache.key(kernel, params, Z, c.X)


def chunk_stats_task(method, kernel, params, Z, ref, jitter, backend):
    """Statistics of one chunk's training rows (zeros when it has none); the chunk's ``Kuf`` is left
    in this process's :mod:`~pgmflow.tasks.gp.kuf_cache` for the gradient pass."""
    c = load_chunk(ref)
    if c.X.shape[0] == 0:
        return _zero_stats(method, Z.shape[0])
    X, y = _device(backend, c.X, c.y)
    k = _kuf_key(kernel, params, Z, c, backend)
    Kuf = None
    if k is not None:
        Kuf = gstats.cross_covariance(kernel, params, Z, X)  # [m, n_c]
        kuf_cache.put(k, Kuf)
    return gstats.chunk_stats(method, kernel, params, Z, X, y, jitter, Kuf=Kuf)


def chunk_grad_task(method, kernel, params, Z, ref, adjoints, backend):
    """Gradient contribution of one chunk's training rows (with the statistics pass's ``Kuf`` when
    this process still holds it: the same bits as computing it again)."""
    c = load_chunk(ref)
    m, d = Z.shape
    if c.X.shape[0] == 0:
        return gstats.Grad(np.zeros(d), 0.0, 0.0, np.zeros((m, d)), np.zeros((m, m)))
    X, y = _device(backend, c.X, c.y)
    k = _kuf_key(kernel, params, Z, c, backend)
    Kuf = kuf_cache.take(k) if k is not None else None
    return gstats.chunk_grad(method, kernel, params, Z, X, y, adjoints, Kuf=Kuf)


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
