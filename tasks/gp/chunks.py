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
from pgmflow.tasks.gp import likelihoods as glik
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
    return Chunk(
        np.ascontiguousarray(std.apply_X(X[train])),
        std.apply_y(y[train]),
        np.ascontiguousarray(std.apply_X(X[test])),
        np.ascontiguousarray(y[test]),
    )


def load_chunk(ref) -> Chunk:
    """The chunk a task was given: a :class:`Chunk` as it is, or a :class:`FileRows` read from its file."""
    if isinstance(ref, Chunk):
        return ref
    A = np.asarray(open_npy(ref.path)[ref.start : ref.stop], dtype=np.float64)  # [rows, d + 1]
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


def chunk_stats_task(method, kernel, params, Z, ref, L, backend):
    """Statistics of one chunk's training rows (zeros when it has none), whitened by ``L`` [m, m], the
    driver's Cholesky factor of ``Kuu`` (``kernels.inducing_cholesky``; None: made here at the default jitter,
    as ``stats.chunk_stats`` does); the chunk's ``Kuf`` is left
    in this process's :mod:`~pgmflow.tasks.gp.kuf_cache` for the gradient pass."""
    c = load_chunk(ref)
    if c.X.shape[0] == 0:
        return _zero_stats(method, Z.shape[0])
    X, y = _device(backend, c.X, c.y)
    k = _kuf_key(kernel, params, Z, c, backend)
    if k is None:
        return gstats.chunk_stats(method, kernel, params, Z, X, y, L=L)
    shape = (Z.shape[0], X.shape[0])
    ka = kuf_cache.key_a(k, L) if L is not None else None  # (no L shipped: the gradient pass cannot match it)
    a_buf = kuf_cache.buffer(shape) if ka is not None else None
    st, Kuf, A = gstats.chunk_stats_kuf_and_a(
        method, kernel, params, Z, X, y, out=kuf_cache.buffer(shape), L=L, keep_a=ka is not None, a_out=a_buf
    )
    if A is None and a_buf is not None:
        kuf_cache.recycle(a_buf)  # the plain form keeps no A: the buffer goes back unused
    kuf_cache.put(k, Kuf)
    if A is not None:
        kuf_cache.put(ka, A)
    return st


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
    A = None
    if k is not None and adjoints.L is not None:
        A = kuf_cache.take(kuf_cache.key_a(k, adjoints.L), count=False)
    g = gstats.chunk_grad(method, kernel, params, Z, X, y, adjoints, Kuf=Kuf, A=A)
    for buf in (Kuf, A):
        if buf is not None:
            kuf_cache.recycle(buf)  # the next statistics pass writes its Kuf (and A) there
    return g


def sum_task(prev, parts):
    """``prev`` (None at the start) plus ``parts`` added left to right: one link of a chain of sums in
    chunk order, ``((prev + p0) + p1) + ...``, the same bits as adding every chunk in one loop."""
    return gstats.sum_in_order(([] if prev is None else [prev]) + list(parts))


def objective_task(method, kernel, params, Z, prev, parts, jitter, max_tries, with_dkuu: bool = True, chol=None):
    """The last link of the statistics' chain (:func:`sum_task`) and the objective of the sum:
    ``(value, adjoints, summed statistics, starting jitter)``. ``chol``: the ``(L, jitter_abs)`` the
    statistics were made with (``kernels.inducing_cholesky(kernel, params, Z, jitter, max_tries)``, made here
    when None). ``B = I + A A'`` is ``>= I`` and always factors, so nothing is retried here (before issue 37
    the statistics were ``Kuf Kfu`` and ``B`` could fail at a small jitter). ``with_dkuu``: as
    ``bounds.objective``'s."""
    st = sum_task(prev, parts)
    value, adj = gbounds.objective(method, kernel, params, Z, st, jitter, max_tries, with_dkuu=with_dkuu, chol=chol)
    return value, adj, st, jitter


def chunk_grad_after_task(method, kernel, params, Z, ref, objective, backend):
    """:func:`chunk_grad_task` with the adjoints of an :func:`objective_task` result, taken from it
    here (a separate task for them would cost a round trip to the scheduler before the gradients)."""
    return chunk_grad_task(method, kernel, params, Z, ref, objective[1], backend)


class Packed(NamedTuple):
    """The results of one group task (named tuples of one type, one per chunk) packed field by field: a field
    whose values are NumPy arrays of one shape and dtype becomes one array (axis 0: the chunk), any other the
    tuple of its values. Sent between processes, that is one frame per array field instead of one per array of
    every chunk: each large frame is a ``send`` on the socket and a wake-up of the receiving event loop, which on
    the 2-core VM of the benchmarks cost more than the bytes (an SGPR evaluation sent 32 frames a worker).
    :func:`unpacked` gives the same values back (views), so whatever is summed from them is the same bits."""

    cls: type | None
    n: int
    fields: tuple  # per field: (True, array [n, ...]) or (False, tuple of n values)


def packed(results) -> Packed:
    results = list(results)
    if not results:
        return Packed(None, 0, ())
    cls = type(results[0])
    fields = []
    for values in zip(*results):
        first = values[0]
        same = all(isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype for v in values)
        fields.append((True, np.stack(values)) if same else (False, tuple(values)))
    return Packed(cls, len(results), tuple(fields))


def unpacked(p) -> list:
    """The list a group task packed (a list passes through as it is)."""
    if not isinstance(p, Packed):
        return list(p)
    return [p.cls(*(values[i] for _, values in p.fields)) for i in range(p.n)]


def stats_group_task(method, kernel, params, Z, refs, L, backend):
    """:func:`chunk_stats_task` of several chunks in turn (one task for the chunks one worker holds):
    their statistics, in the order of ``refs``, :func:`packed`."""
    return packed(chunk_stats_task(method, kernel, params, Z, ref, L, backend) for ref in refs)


def grad_group_task(method, kernel, params, Z, refs, objective, backend):
    """:func:`chunk_grad_after_task` of several chunks in turn: their gradients, :func:`packed`."""
    return packed(chunk_grad_task(method, kernel, params, Z, ref, objective[1], backend) for ref in refs)


def in_chunk_order(groups, outputs) -> list:
    """The per-chunk results of group tasks, in chunk order: ``groups`` lists each group's chunk numbers
    (together 0 .. n - 1, once each), ``outputs`` each group's results in that order (a list, or
    :class:`Packed`)."""
    n = sum(len(g) for g in groups)
    parts = [None] * n
    for idx, out in zip(groups, [unpacked(o) for o in outputs], strict=True):
        if len(idx) != len(out):
            raise ValueError(f"a group of {len(idx)} chunks returned {len(out)} results")
        for c, part in zip(idx, out):
            parts[c] = part
    if any(p is None for p in parts):
        raise ValueError("the groups do not cover every chunk once")
    return parts


def objective_groups_task(
    method, kernel, params, Z, groups, outputs, jitter, max_tries, with_dkuu: bool = True, chol=None
):
    """:func:`objective_task` of the statistics of group tasks, added in chunk order (the same bits as
    one task per chunk)."""
    return objective_task(
        method, kernel, params, Z, None, in_chunk_order(groups, outputs), jitter, max_tries, with_dkuu, chol
    )


def objective_grad_group_task(
    method, kernel, params, Z, refs, groups, outputs, jitter, max_tries, backend, keep: bool, chol=None
):
    """:func:`objective_groups_task` and then :func:`grad_group_task` of this group's chunks ``refs``, in one
    task: ``(driver's part or None, gradients)``. Every group computes the same objective from the same
    statistics in the same order (the same bits), so no worker waits for another's adjoints. The group with
    ``keep`` returns what the driver needs: ``(value, adjoints, summed statistics, starting jitter, Kuu
    path)``, where the adjoints go without their m x m parts (only the chunks use ``dAAT`` and ``L``) and the Kuu path
    is ``bounds.kuu_path`` of ``dKuu + 0.0`` -- what ``finish_grad`` computes from SGPR's and DTC's
    gradients (their ``Grad.Kuu`` is the scalar 0.0), bit for bit. The other groups skip ``dKuu`` (two
    triangular products of SGPR's objective, ~1 ms at m = 256), which only the Kuu path needs."""
    res = objective_groups_task(method, kernel, params, Z, groups, outputs, jitter, max_tries, keep, chol)
    grads = grad_group_task(method, kernel, params, Z, refs, res, backend)
    if not keep:
        return None, grads
    value, adj, st, jit = res
    kuu = gbounds.kuu_path(kernel, params, Z, adj.dKuu + 0.0)
    return (value, adj._replace(dAAT=None, dpsi1y=None, dKuu=None, L=None), st, jit, kuu), grads


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
    likelihood: object = None  # svgp: a pgmflow.tasks.gp.likelihoods.Likelihood (None: Gaussian)


def predict_f(pred: Predictor, Xs):
    """Mean and variance [n*] of the latent f at standardised inputs Xs [n*, d]."""
    if pred.method == "svgp":
        return gsvgp.svgp_predict(pred.kernel, pred.params, pred.Z, pred.state, Xs, jitter=pred.jitter)
    return gbounds.predict(
        pred.method, pred.kernel, pred.params, pred.Z, pred.stats, Xs, jitter=pred.jitter, max_tries=pred.max_tries
    )


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
    """Test sums of one chunk's held-out rows: ``(rows, squared errors, NLPD)``; with a non-Gaussian
    likelihood ``pgmflow.tasks.gp.likelihoods.test_sums`` (those three and one more)."""
    c = load_chunk(ref)
    lik = pred.likelihood
    if lik is not None and not lik.conjugate:  # Bernoulli: and the reliability diagram's sums
        rel = (glik.reliability_sums(np.zeros(0), np.zeros(0)),) if lik.name == "bernoulli" else ()
        if c.Xt.shape[0] == 0:
            return (0, 0.0, 0.0, 0.0, *rel)
        mean, var = predict_f(pred, c.Xt)
        sums = glik.test_sums(lik, c.yt, mean, var, float(pred.params.log_noise), std.y_mean, std.y_std)
        if rel:
            rel = (glik.reliability_sums(glik.predict_y(lik, mean, var)[0], c.yt),)
        return (*sums, *rel)
    if c.Xt.shape[0] == 0:
        return 0, 0.0, 0.0
    mean, var = predict_f(pred, c.Xt)
    return _test_sums(mean, var, pred.params.noise, c.yt, std)


def chunk_rows_task(ref, selections):
    """The training rows ``sel`` (indices within the chunk's training rows) of each minibatch: a list
    of ``(X [b_c, d], y [b_c])``."""
    c = load_chunk(ref)
    return [(c.X[s], c.y[s]) for s in selections]


def chunk_elbo_task(kernel, params, Z, state, ref, jitter, likelihood=None):
    """``(ELBO of the chunk's training rows alone, rows)``: ``ell_c - KL`` (see :func:`_full_elbo`)."""
    c = load_chunk(ref)
    if c.X.shape[0] == 0:
        return 0.0, 0
    n = c.X.shape[0]
    if likelihood is None:
        return gsvgp.svgp_elbo(kernel, params, Z, state, c.X, c.y, n, jitter), int(n)
    return gsvgp.svgp_elbo(kernel, params, Z, state, c.X, c.y, n, jitter, likelihood=likelihood), int(n)


def exact_task(kernel, params0, max_iter, chunks, std: Standardizer, Xslice, bounds=None):
    """Fit the exact GP on every chunk's training rows; predict the held-out rows (test sums per
    chunk, in chunk order) and the slice inputs ``Xslice`` [P, d], with one factorisation."""
    cs = [load_chunk(r) for r in chunks]
    X = np.concatenate([c.X for c in cs])
    y = np.concatenate([c.y for c in cs])
    lml0 = gexact.log_marginal_likelihood(kernel, params0, X, y)
    fit = gexact.fit(kernel, X, y, params0, maxiter=max_iter, **({} if bounds is None else {"bounds": bounds}))
    Xs = np.concatenate([c.Xt for c in cs] + [Xslice])
    mean, var = gexact.predict(kernel, fit.params, X, y, Xs)
    sums, a = [], 0
    for c in cs:
        b = a + c.Xt.shape[0]
        sums.append(_test_sums(mean[a:b], var[a:b], fit.params.noise, c.yt, std))
        a = b
    return {"fit": fit, "lml0": float(lml0), "sums": sums, "slice": (mean[a:], var[a:]), "X": X, "y": y}
