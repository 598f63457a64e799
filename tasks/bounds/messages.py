"""Tree-reweighted message passing for binary pairwise MRFs, in log space (loopy BP is ``rho = 1``).

Model (``pgmflow.tasks.bounds.mrf``): ``P(x) ∝ exp(sum_s h_s x_s + sum_st J_st x_s x_t)``, ``x`` in {-1, +1}^n,
so ``theta_s(x_s) = h_s x_s`` and ``theta_st(x_s, x_t) = J_st x_s x_t``. Edge appearance
probabilities ``rho_st`` in (0, 1] (Wainwright, Jaakkola and Willsky
2005, "A new class of upper bounds on the log partition function").

**Message update** (WJW 2005, the pairwise TRW update)::

    M_ts(x_s) ∝ sum_{x_t} exp(theta_st(x_s, x_t) / rho_st + theta_t(x_t))
                 * prod_{v in N(t) \\ s} M_vt(x_t)^rho_vt / M_st(x_t)^(1 - rho_st)

**Log-ratio parametrisation.** For +-1 spins a positive message is ``M_ts(x_s) ∝ exp(u_ts x_s)``,
one scalar ``u_ts = log(M_ts(+1) / M_ts(-1)) / 2`` per directed edge. With
``S_t = sum_{v in N(t)} rho_vt u_vt`` the product above is ``exp(x_t (S_t - u_st))`` (the ``s``
factor ``M_st^rho_st / M_st`` combines to ``M_st^-1``), so with the cavity field
``a_ts = h_t + S_t - u_st`` and ``K_st = J_st / rho_st``::

    u_ts <- f(K_st, a_ts) = (lc(a_ts + K_st) - lc(a_ts - K_st)) / 2,    lc(y) = log(2 cosh y)
                          = atanh(tanh K_st tanh a_ts)

``lc(y) = |y| + log1p(exp(-2|y|))`` is evaluated without overflow or cancellation (the atanh form
loses all digits once ``tanh K tanh a`` rounds near 1, e.g. for small ``rho``). Schedule:
synchronous (flooding) from ``u = 0``, damped in log space, ``u <- (1 - d) u + d f(K, a)``
(``d = damping`` in (0, 1]; ``d = 1`` is undamped), until ``max |u_new - u_old| < tol`` or
``max_iter`` updates (never an error: the flag says which).

**Beliefs.** ``tau_s(x_s) ∝ exp(x_s b_s)`` with ``b_s = h_s + S_s``, so ``E[x_s] = tanh b_s``;
``tau_st(x_s, x_t) ∝ exp(K_st x_s x_t + a_st x_s + a_ts x_t)`` (the cavity fields of the two
directions), so ``E[x_s x_t] = tanh(K_st + atanh(tanh a_st tanh a_ts))``. At a fixed point
``tau_st`` marginalises to ``tau_s`` and ``tau_t``.

**Objective** (Wainwright, Jaakkola and Willsky 2005; a concave maximisation over the local polytope for ``rho`` in the
spanning tree polytope)::

    B(tau; rho) = <theta, tau> + sum_s H(tau_s) - sum_st rho_st I_st(tau_st)

evaluated at the point of the local polytope with node means ``m_s = E[x_s]`` and pair means
``c_st = E[x_s x_t]`` (pair table ``(1 + m_s x_s + m_t x_t + c_st x_s x_t) / 4``, whose mutual
information ``I = H_s + H_t - H_st`` is then a true KL divergence). At the TRW fixed point this is
the maximum, the TRW upper bound on ``log Z``; with ``rho = 1`` it is minus the Bethe free energy
at the BP beliefs. Away from a fixed point it is only the objective at the current beliefs.

Two implementations with the same iterates:

* :func:`run_messages`: a numba kernel over the CSR adjacency of any graph
  (``u[k]`` is the message *into* node ``i`` from ``nbr[k]``, for ``k`` in row ``i``);
* :func:`lattice_messages_xp`: arrays [L, W] for the four incoming directions, neighbour sums by
  ``roll``, written against ``xp = backend.array_module(h)`` so that the same code runs on NumPy
  and on CuPy arrays. It agrees with the kernel up to rounding (summation order, libm).
"""

from __future__ import annotations

import functools
import math
import sys
from typing import NamedTuple

import numpy as np

from pgmflow.tasks import backend
from pgmflow.tasks.bounds.mrf import MRFError, PairwiseMRF, adjacency

__all__ = [
    "Beliefs",
    "LatticeMessages",
    "LatticeResult",
    "Messages",
    "beliefs",
    "check_run_args",
    "edge_terms_xp",
    "lattice_arrays",
    "lattice_beliefs_xp",
    "lattice_edge_index",
    "lattice_messages_xp",
    "lattice_run_xp",
    "message_xp",
    "node_terms_xp",
    "run_messages",
]


class Messages(NamedTuple):
    """Result of :func:`run_messages` (unpacks as ``u, n_iter, converged``)."""

    u: np.ndarray  # float64 [2E] log-ratio messages in CSR order of mrf.adjacency: u[k] = u_{nbr[k] -> row(k)}
    n_iter: int  # synchronous updates performed
    converged: bool  # max |u_new - u_old| < tol at the last update


class Beliefs(NamedTuple):
    """Beliefs and objective from messages (:func:`beliefs`)."""

    mean: np.ndarray  # float64 [n] E_tau[x_s] = tanh(h_s + S_s)
    pair_mean: np.ndarray  # float64 [E] E_tau[x_s x_t] of the pair beliefs, edge order of the model
    objective: float  # B(tau; rho): the TRW bound at a TRW fixed point, the Bethe value when rho = 1


class LatticeMessages(NamedTuple):
    """Incoming messages on an L x W lattice (xp arrays [L, W]): ``u_left[r, c]`` is the message
    into node (r, c) from (r, c-1), and so on; zero across the absent edges of an open lattice."""

    u_left: object
    u_right: object
    u_up: object
    u_down: object
    n_iter: int
    converged: bool


class LatticeResult(NamedTuple):
    """Beliefs and objective on an L x W lattice (xp arrays [L, W] on the arrays' device)."""

    log_z: float  # the objective B(tau; rho) (TRW upper bound / Bethe value at a fixed point)
    mean: object  # [L, W] E[x_{r,c}]
    pair_right: object  # [L, W] E[x_{r,c} x_{r,c+1}] (wrapping; 0 where the edge is absent)
    pair_down: object  # [L, W] E[x_{r,c} x_{r+1,c}] (wrapping; 0 where the edge is absent)
    n_iter: int
    converged: bool


# --- shared scalar/array maths ------------------------------------------------------------------------


def _lc_xp(xp, y):
    """log(2 cosh y) without overflow."""
    ay = xp.abs(y)
    return ay + xp.log1p(xp.exp(-2.0 * ay))


def message_xp(xp, K, a):
    """The log-ratio message ``f(K, a) = atanh(tanh K tanh a)`` (stable form)."""
    return 0.5 * (_lc_xp(xp, a + K) - _lc_xp(xp, a - K))


def _xlogx(xp, p):
    p = xp.maximum(p, 0.0)
    return p * xp.log(xp.maximum(p, 1e-300))


def _h1(xp, m):
    """Entropy of a +-1 variable with mean m."""
    return -(_xlogx(xp, 0.5 * (1.0 + m)) + _xlogx(xp, 0.5 * (1.0 - m)))


def node_terms_xp(xp, h, m):
    """``sum_s h_s m_s + H(tau_s)`` summed over nodes (a 0-d xp array)."""
    return xp.sum(h * m + _h1(xp, m))


def edge_terms_xp(xp, ms, mt, c, J, rho, w=None):
    """``sum_st w_st (J_st c_st - rho_st I_st)`` with the pair table built from (ms, mt, c)."""
    h2 = -(
        _xlogx(xp, 0.25 * (1.0 + ms + mt + c))
        + _xlogx(xp, 0.25 * (1.0 + ms - mt - c))
        + _xlogx(xp, 0.25 * (1.0 - ms + mt - c))
        + _xlogx(xp, 0.25 * (1.0 - ms - mt + c))
    )
    mi = _h1(xp, ms) + _h1(xp, mt) - h2
    t = J * c - rho * mi
    if w is not None:
        t = t * w
    return xp.sum(t)


def _pair_mean_xp(xp, K, a_s, a_t):
    """E[x_s x_t] under exp(K x_s x_t + a_s x_s + a_t x_t)."""
    return xp.tanh(K + message_xp(xp, a_t, a_s))


def check_run_args(damping, max_iter, tol):
    """Refuse a bad schedule with an MRFError (what, problem, fix)."""
    d = float(damping)
    if not (0.0 < d <= 1.0):
        raise MRFError("damping", f"is {damping!r}", "use 0 < damping <= 1 (u <- (1-d) u + d update; 1 is undamped)")
    if int(max_iter) != max_iter or max_iter < 0:
        raise MRFError("max_iter", f"is {max_iter!r}", "use a non-negative integer")
    if not (float(tol) >= 0.0):
        raise MRFError("tol", f"is {tol!r}", "use tol >= 0")
    return d, int(max_iter), float(tol)


def _rho_basic(rho, E):
    rho = np.asarray(rho, dtype=np.float64)
    if rho.shape != (E,):
        raise MRFError("rho", f"has shape {rho.shape}, the model has {E} edges", "pass one value per edge, shape (E,)")
    if not np.all(np.isfinite(rho)) or np.any(rho <= 0):
        k = int(np.flatnonzero(~(np.isfinite(rho) & (rho > 0)))[0])
        raise MRFError("rho", f"edge {k} has rho {rho[k]!r}", "use edge appearance probabilities in (0, 1]")
    return rho


# --- numba kernel over CSR ----------------------------------------------------------------------------

# Plain module-level functions marked for numba; _kernels() compiles them (pgmflow.tasks.backend.compile_kernels)
# and rebinds their names to the dispatchers, prange to numba.prange (as plain Python, range).
prange = range


@backend.kernel(cache=True, nogil=True, fastmath=False)
def _lc_nb(y):
    ay = abs(y)
    return ay + math.log1p(math.exp(-2.0 * ay))


@backend.kernel(cache=True, nogil=True, fastmath=False)
def _msg_nb(K, a):
    return 0.5 * (_lc_nb(a + K) - _lc_nb(a - K))


@backend.kernel(cache=True, nogil=True, fastmath=False)
def _msg_fast(K, tK, a):
    # atanh(tanh K tanh a) with one exp and one log1p (half the transcendentals of the log-cosh
    # form); for |K| > 4 the product nears +-1 and the log-cosh form keeps full precision
    if abs(K) > 4.0:
        return _msg_nb(K, a)
    e = math.exp(-2.0 * abs(a))
    t = (1.0 - e) / (1.0 + e)
    x = tK * (t if a >= 0.0 else -t)
    return 0.5 * math.log1p(2.0 * x / (1.0 - x))


@backend.kernel(cache=True, nogil=True, fastmath=False, parallel=True)
def _run_csr(indptr, nbr, eid, rev, h, K, tK, rho, damping, max_iter, tol, u):
    n = h.shape[0]
    m = u.shape[0]
    S = np.empty(n)
    new = np.empty(m)
    dmax = np.zeros(n)
    it = 0
    converged = False
    keep = 1.0 - damping
    while it < max_iter:
        it += 1
        for i in prange(n):
            s = 0.0
            for k in range(indptr[i], indptr[i + 1]):
                s += rho[eid[k]] * u[k]
            S[i] = s
        for i in prange(n):
            d_i = 0.0
            for k in range(indptr[i], indptr[i + 1]):
                j = nbr[k]
                e_k = eid[k]
                a = h[j] + S[j] - u[rev[k]]
                v = keep * u[k] + damping * _msg_fast(K[e_k], tK[e_k], a)
                dv = abs(v - u[k])
                if dv > d_i or math.isnan(dv):
                    d_i = dv
                new[k] = v
            dmax[i] = d_i
        delta = 0.0
        for i in range(n):
            if dmax[i] > delta or math.isnan(dmax[i]):
                delta = dmax[i]
        for k in prange(m):
            u[k] = new[k]
        if delta < tol:
            converged = True
            break
    return it, converged


@functools.lru_cache(maxsize=None)
def _kernels():
    """Compile the kernels above (once per process; numba's on-disk cache serves later processes). Returns the
    message-passing dispatcher."""
    return backend.compile_kernels(sys.modules[__name__], bind={"prange": backend.numba().prange})["_run_csr"]


def run_messages(
    mrf: PairwiseMRF, rho, damping: float = 0.5, max_iter: int = 10000, tol: float = 1e-10, adj=None, u0=None
) -> Messages:
    """Damped synchronous TRW message passing on any graph (numba kernel over the CSR adjacency).

    ``rho`` [E] in (0, 1] (all ones: loopy BP). ``adj`` may pass a precomputed ``adjacency(mrf)``.
    Returns ``Messages(u [2E], n_iter, converged)``; never raises on non-convergence.
    """
    d, max_iter, tol = check_run_args(damping, max_iter, tol)
    rho = _rho_basic(rho, mrf.E)
    adj = adjacency(mrf) if adj is None else adj
    K = np.ascontiguousarray(mrf.J / rho)
    u = np.zeros(2 * mrf.E) if u0 is None else np.array(np.broadcast_to(np.asarray(u0, np.float64), (2 * mrf.E,)))
    run = _kernels()
    it, conv = run(
        adj.indptr,
        adj.nbr,
        adj.eid,
        adj.rev,
        np.ascontiguousarray(mrf.h, np.float64),
        K,
        np.tanh(K),
        np.ascontiguousarray(rho),
        d,
        max_iter,
        tol,
        u,
    )
    return Messages(u, int(it), bool(conv))


def beliefs(mrf: PairwiseMRF, rho, u, adj=None) -> Beliefs:
    """Node and pair beliefs from CSR messages ``u`` [2E] and the objective ``B(tau; rho)``."""
    rho = _rho_basic(rho, mrf.E)
    adj = adjacency(mrf) if adj is None else adj
    n, E = mrf.n, mrf.E
    u = np.asarray(u, dtype=np.float64)
    row = np.repeat(np.arange(n), np.diff(adj.indptr))
    S = np.zeros(n)
    np.add.at(S, row, rho[adj.eid] * u)
    m = np.tanh(mrf.h + S)
    # cavity field of node row(k) towards nbr[k]: a = h + S - (message into row(k) from nbr[k])
    a = (mrf.h + S)[row] - u
    # entry of edge e seen from its endpoint i (= edges[e, 0]) and from j
    a_i = np.empty(E)
    a_j = np.empty(E)
    lo = row == mrf.edges[adj.eid, 0]
    a_i[adj.eid[lo]] = a[lo]
    a_j[adj.eid[~lo]] = a[~lo]
    K = mrf.J / rho
    c = _pair_mean_xp(np, K, a_i, a_j)
    i, j = mrf.edges[:, 0], mrf.edges[:, 1]
    obj = float(node_terms_xp(np, mrf.h, m) + edge_terms_xp(np, m[i], m[j], c, mrf.J, rho))
    return Beliefs(m, c, obj)


# --- the lattice (xp) path ----------------------------------------------------------------------------


def lattice_edge_index(L: int, W: int, periodic: bool):
    """Positions of the lattice bonds in the edge order of ``ising_lattice(L, W, periodic=...)``
    (and of any model with the same edge set): ``(idx_right [L, W], idx_down [L, W])``, -1 where a
    bond is absent (open boundary). Periodic lattices need sides >= 3 (smaller ones have double
    bonds, which the edge list merges)."""
    if L < 1 or W < 1:
        raise MRFError("lattice", f"{L} x {W}", "use sides >= 1")
    if periodic and (L < 3 or W < 3):
        raise MRFError(
            "lattice",
            f"periodic {L} x {W} has double bonds or self-loops",
            "use sides >= 3 for a periodic lattice, or periodic=False",
        )
    n = L * W
    r, c = np.divmod(np.arange(n), W)
    a_r, b_r = r * W + c, r * W + (c + 1) % W
    a_d, b_d = r * W + c, ((r + 1) % L) * W + c
    has_r = np.full(n, True) if periodic else (c + 1 < W)
    has_d = np.full(n, True) if periodic else (r + 1 < L)
    keys_r = np.minimum(a_r, b_r) * n + np.maximum(a_r, b_r)
    keys_d = np.minimum(a_d, b_d) * n + np.maximum(a_d, b_d)
    allkeys = np.unique(np.concatenate([keys_r[has_r], keys_d[has_d]]))
    idx_r = np.where(has_r, np.searchsorted(allkeys, keys_r), -1).reshape(L, W)
    idx_d = np.where(has_d, np.searchsorted(allkeys, keys_d), -1).reshape(L, W)
    return idx_r.astype(np.int64), idx_d.astype(np.int64)


def lattice_arrays(mrf: PairwiseMRF, L: int, W: int, periodic: bool, rho=None):
    """``(h, Jr, Jd, rho_r, rho_d)`` as NumPy arrays [L, W] for a model on the L x W lattice of
    ``ising_lattice`` (any couplings and fields); absent bonds get J = 0, rho = 1. ``rho`` [E]
    defaults to ones. Refuses a model whose edge set is not that lattice's."""
    idx_r, idx_d = lattice_edge_index(L, W, periodic)
    ref = np.unique(np.concatenate([idx_r[idx_r >= 0], idx_d[idx_d >= 0]]))
    n = L * W
    if mrf.n != n or mrf.E != ref.size:
        raise MRFError(
            "model",
            f"has {mrf.n} nodes and {mrf.E} edges, the {'periodic' if periodic else 'open'} "
            f"{L} x {W} lattice has {n} and {ref.size}",
            "pass a model built by ising_lattice(L, W, ...)",
        )
    rr, cc = np.divmod(np.arange(n), W)
    exp_r = np.stack([rr * W + cc, rr * W + (cc + 1) % W], 1)[idx_r.reshape(-1) >= 0]
    exp_d = np.stack([rr * W + cc, ((rr + 1) % L) * W + cc], 1)[idx_d.reshape(-1) >= 0]
    want = np.unique(np.concatenate([np.sort(exp_r, 1), np.sort(exp_d, 1)]) @ np.array([n, 1]))
    if not np.array_equal(want, mrf.edges @ np.array([n, 1])):
        raise MRFError(
            "model", f"edge set differs from the {L} x {W} lattice's", "pass a model built by ising_lattice(L, W, ...)"
        )
    rho = np.ones(mrf.E) if rho is None else np.asarray(rho, dtype=np.float64)
    if rho.shape != (mrf.E,):
        raise MRFError("rho", f"has shape {rho.shape}, the model has {mrf.E} edges", "pass one value per edge")

    def gather(v, idx, fill):
        return np.where(idx >= 0, v[np.maximum(idx, 0)], fill)

    return (
        mrf.h.reshape(L, W).copy(),
        gather(mrf.J, idx_r, 0.0),
        gather(mrf.J, idx_d, 0.0),
        gather(rho, idx_r, 1.0),
        gather(rho, idx_d, 1.0),
    )


def _lattice_prepare(h, Jr, Jd, rho_r, rho_d, periodic):
    xp = backend.array_module(h)
    h = xp.asarray(h, dtype=xp.float64)
    if h.ndim != 2:
        raise MRFError("h", f"has shape {tuple(h.shape)}", "pass lattice fields as an [L, W] array")
    L, W = h.shape
    if periodic and (L < 3 or W < 3):
        raise MRFError(
            "lattice",
            f"periodic {L} x {W} has double bonds or self-loops",
            "use sides >= 3 for a periodic lattice, or periodic=False",
        )
    arrs = []
    for name, v in (("Jr", Jr), ("Jd", Jd), ("rho_r", rho_r), ("rho_d", rho_d)):
        v = xp.asarray(v, dtype=xp.float64)
        if v.shape != (L, W):
            raise MRFError(name, f"has shape {tuple(v.shape)}, h has {(L, W)}", "pass [L, W] arrays")
        arrs.append(v)
    Jr, Jd, rho_r, rho_d = arrs
    mask_r = xp.ones((L, W), dtype=bool)
    mask_d = xp.ones((L, W), dtype=bool)
    if not periodic:
        mask_r[:, W - 1] = False
        mask_d[L - 1, :] = False
    Jr = xp.where(mask_r, Jr, 0.0)
    Jd = xp.where(mask_d, Jd, 0.0)
    rho_r = xp.where(mask_r, rho_r, 1.0)
    rho_d = xp.where(mask_d, rho_d, 1.0)
    for name, v in (("rho_r", rho_r), ("rho_d", rho_d)):
        ok = bool(xp.all(xp.isfinite(v) & (v > 0) & (v <= 1.0 + 1e-12)))
        if not ok:
            raise MRFError(
                name, "has values outside (0, 1] or non-finite", "use edge appearance probabilities in (0, 1]"
            )
    if not bool(xp.all(xp.isfinite(h)) & xp.all(xp.isfinite(Jr)) & xp.all(xp.isfinite(Jd))):
        raise MRFError("lattice", "fields or couplings are not finite", "use finite h, Jr, Jd")
    return xp, h, Jr, Jd, rho_r, rho_d, mask_r, mask_d


def _lattice_S(xp, msgs4, rho_r, rho_d):
    uL, uR, uU, uD = msgs4
    return (xp.roll(rho_d, 1, axis=0) * uU + xp.roll(rho_r, 1, axis=1) * uL) + rho_r * uR + rho_d * uD


def lattice_messages_xp(
    h,
    Jr,
    Jd,
    rho_r,
    rho_d,
    periodic: bool = True,
    damping: float = 0.5,
    max_iter: int = 10000,
    tol: float = 1e-10,
    u0: float = 0.0,
) -> LatticeMessages:
    """Damped synchronous TRW messages on an L x W lattice, vectorised per direction (NumPy or CuPy).

    ``h`` [L, W] fields; ``Jr[r, c]`` couples (r, c)-(r, c+1) and ``Jd[r, c]`` couples
    (r, c)-(r+1, c) (wrapping when ``periodic``; the last column/row is ignored otherwise);
    ``rho_r``, ``rho_d`` [L, W] their appearance probabilities (ones: loopy BP). All arrays of one
    module; the result lives on the same device. Same iterates as :func:`run_messages` on
    ``ising_lattice(L, W, periodic=periodic)`` with the same couplings (``lattice_arrays``).
    """
    d, max_iter, tol = check_run_args(damping, max_iter, tol)
    xp, h, Jr, Jd, rho_r, rho_d, mask_r, mask_d = _lattice_prepare(h, Jr, Jd, rho_r, rho_d, periodic)
    Kr = Jr / rho_r
    Kd = Jd / rho_d
    Kr_l = xp.roll(Kr, 1, axis=1)  # bond to the left neighbour
    Kd_u = xp.roll(Kd, 1, axis=0)  # bond to the upper neighbour
    # every message starts at u0 (0: the symmetric start); absent bonds of an open lattice stay 0
    mask_l = xp.roll(mask_r, 1, axis=1)
    mask_u = xp.roll(mask_d, 1, axis=0)
    uL, uR, uU, uD = (xp.where(m, float(u0), 0.0) for m in (mask_l, mask_r, mask_u, mask_d))
    keep = 1.0 - d
    it = 0
    converged = False
    while it < max_iter:
        it += 1
        hS = h + _lattice_S(xp, (uL, uR, uU, uD), rho_r, rho_d)
        # message into (r, c) from its right neighbour t = (r, c+1): cavity a = h_t + S_t - u_{s->t},
        # where u_{s->t} is t's message from its left, uL[t]
        nR = keep * uR + d * message_xp(xp, Kr, xp.roll(hS - uL, -1, axis=1))
        nL = keep * uL + d * message_xp(xp, Kr_l, xp.roll(hS - uR, 1, axis=1))
        nD = keep * uD + d * message_xp(xp, Kd, xp.roll(hS - uU, -1, axis=0))
        nU = keep * uU + d * message_xp(xp, Kd_u, xp.roll(hS - uD, 1, axis=0))
        delta = xp.maximum(
            xp.maximum(xp.max(xp.abs(nL - uL)), xp.max(xp.abs(nR - uR))),
            xp.maximum(xp.max(xp.abs(nU - uU)), xp.max(xp.abs(nD - uD))),
        )
        uL, uR, uU, uD = nL, nR, nU, nD
        delta = float(delta)
        if delta < tol:  # NaN never converges
            converged = True
            break
    return LatticeMessages(uL, uR, uU, uD, int(it), bool(converged))


def lattice_beliefs_xp(h, Jr, Jd, rho_r, rho_d, periodic: bool, msgs: LatticeMessages) -> LatticeResult:
    """Beliefs and objective ``B(tau; rho)`` on the lattice from :func:`lattice_messages_xp` messages."""
    xp, h, Jr, Jd, rho_r, rho_d, mask_r, mask_d = _lattice_prepare(h, Jr, Jd, rho_r, rho_d, periodic)
    uL, uR, uU, uD = msgs.u_left, msgs.u_right, msgs.u_up, msgs.u_down
    hS = h + _lattice_S(xp, (uL, uR, uU, uD), rho_r, rho_d)
    m = xp.tanh(hS)
    Kr = Jr / rho_r
    Kd = Jd / rho_d
    # right bond (s, t) = ((r, c), (r, c+1)): a_s = hS_s - uR_s, a_t = hS_t - uL_t
    cr = _pair_mean_xp(xp, Kr, hS - uR, xp.roll(hS - uL, -1, axis=1))
    cd = _pair_mean_xp(xp, Kd, hS - uD, xp.roll(hS - uU, -1, axis=0))
    cr = xp.where(mask_r, cr, 0.0)
    cd = xp.where(mask_d, cd, 0.0)
    wr = mask_r.astype(xp.float64)
    wd = mask_d.astype(xp.float64)
    obj = (
        node_terms_xp(xp, h, m)
        + edge_terms_xp(xp, m, xp.roll(m, -1, axis=1), cr, Jr, rho_r, wr)
        + edge_terms_xp(xp, m, xp.roll(m, -1, axis=0), cd, Jd, rho_d, wd)
    )
    return LatticeResult(float(obj), m, cr, cd, msgs.n_iter, msgs.converged)


def lattice_run_xp(
    h, Jr, Jd, rho_r, rho_d, periodic: bool = True, damping: float = 0.5, max_iter: int = 10000, tol: float = 1e-10
) -> LatticeResult:
    """:func:`lattice_messages_xp` then :func:`lattice_beliefs_xp`."""
    msgs = lattice_messages_xp(h, Jr, Jd, rho_r, rho_d, periodic, damping, max_iter, tol)
    return lattice_beliefs_xp(h, Jr, Jd, rho_r, rho_d, periodic, msgs)
