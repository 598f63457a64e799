"""Pairwise binary Markov random fields on any graph: the models the variational bounds work on.

Spins ``x_i`` in {-1, +1}; ``P(x) = exp(sum_i h_i x_i + sum_e J_e x_i x_j) / Z`` over the edges
``e = (i, j)``, ``i < j`` (Wainwright and Jordan 2008, section 3.3). Couplings and fields are in units
where the inverse temperature is already folded in (``J_e = beta * J``), so ``log Z`` of an Ising
model at inverse temperature ``beta`` is ``log Z`` of ``ising_lattice(..., beta=beta)``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class MRFError(ValueError):
    """Bad model input: ``str(exc) == f"{what}: {problem}; fix: {fix}"``."""

    def __init__(self, what, problem, fix):
        self.what = str(what)
        self.problem = str(problem)
        self.fix = str(fix)
        super().__init__(f"{self.what}: {self.problem}; fix: {self.fix}")

    def __reduce__(self):  # picklable (Dask moves exceptions between processes)
        return (type(self), (self.what, self.problem, self.fix))


class PairwiseMRF(NamedTuple):
    """A pairwise binary MRF. Edges are unique, ``i < j``, sorted lexicographically."""

    h: np.ndarray  # float64 [n] fields
    edges: np.ndarray  # int64 [E, 2] node pairs (i < j)
    J: np.ndarray  # float64 [E] couplings

    @property
    def n(self) -> int:
        return int(self.h.shape[0])

    @property
    def E(self) -> int:
        return int(self.edges.shape[0])


class Adjacency(NamedTuple):
    """CSR adjacency: node i's neighbours are ``nbr[indptr[i]:indptr[i+1]]`` (ascending), joined by
    edges ``eid[...]``; ``rev[k]`` is the position of the reverse directed edge (j -> i) of entry k."""

    indptr: np.ndarray  # int64 [n+1]
    nbr: np.ndarray  # int64 [2E]
    eid: np.ndarray  # int64 [2E]
    rev: np.ndarray  # int64 [2E]


def make_mrf(h, edges, J) -> PairwiseMRF:
    """Build a model from fields, an edge list and couplings: duplicate edges (either orientation)
    are merged by summing their couplings; self-loops and non-finite values are refused."""
    h = np.asarray(h, dtype=np.float64)
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    J = np.asarray(J, dtype=np.float64).reshape(-1)
    if h.ndim != 1:
        raise MRFError("h", f"has shape {h.shape}", "pass one field per node (a 1-D array)")
    n = h.shape[0]
    if J.shape[0] != edges.shape[0]:
        raise MRFError("J", f"has {J.shape[0]} couplings for {edges.shape[0]} edges", "pass one coupling per edge")
    if not np.all(np.isfinite(h)):
        raise MRFError(
            "h", f"field {h[~np.isfinite(h)][0]} at node {int(np.flatnonzero(~np.isfinite(h))[0])}", "use finite fields"
        )
    if not np.all(np.isfinite(J)):
        k = int(np.flatnonzero(~np.isfinite(J))[0])
        raise MRFError("J", f"coupling {J[k]} on edge {tuple(int(v) for v in edges[k])}", "use finite couplings")
    if edges.size and (edges.min() < 0 or edges.max() >= n):
        raise MRFError("edges", f"a node index outside [0, {n})", "number nodes 0..n-1")
    if np.any(edges[:, 0] == edges[:, 1]):
        k = int(np.flatnonzero(edges[:, 0] == edges[:, 1])[0])
        raise MRFError(
            "edges",
            f"self-loop on node {int(edges[k, 0])}",
            "a pairwise MRF has no self-loops; put x_i x_i = 1 into the constant, or the field",
        )
    a = np.minimum(edges[:, 0], edges[:, 1])
    b = np.maximum(edges[:, 0], edges[:, 1])
    key = a * n + b
    uniq, inv = np.unique(key, return_inverse=True)
    Jm = np.zeros(uniq.shape[0])
    np.add.at(Jm, inv, J)
    e = np.stack([uniq // n, uniq % n], axis=1).astype(np.int64) if uniq.size else np.zeros((0, 2), np.int64)
    return PairwiseMRF(h.copy(), e, Jm)


def from_dense(J, h=None, *, name: str = "J", atol: float = 1e-12) -> PairwiseMRF:
    """A model from a symmetric coupling matrix ``J`` [n, n] (zero diagonal) and fields ``h`` [n].

    ``P(x) ∝ exp(h.x + sum_{i<j} J_ij x_i x_j)``. Refuses a matrix that is not square, not
    symmetric (beyond ``atol`` relative), has a non-zero diagonal, or holds NaN or infinities.
    """
    J = np.asarray(J, dtype=np.float64)
    if J.ndim != 2 or J.shape[0] != J.shape[1]:
        raise MRFError(name, f"has shape {J.shape}", "pass a square [n, n] coupling matrix")
    n = J.shape[0]
    if not np.all(np.isfinite(J)):
        i, j = np.argwhere(~np.isfinite(J))[0]
        raise MRFError(name, f"entry [{i}, {j}] is {J[i, j]}", "use finite couplings")
    scale = max(1.0, float(np.abs(J).max()) if J.size else 1.0)
    asym = np.abs(J - J.T)
    if asym.size and asym.max() > atol * scale:
        i, j = np.unravel_index(int(np.argmax(asym)), asym.shape)
        raise MRFError(
            name,
            f"is not symmetric: [{i}, {j}] = {J[i, j]:g} but [{j}, {i}] = {J[j, i]:g}",
            "use a symmetric matrix (J_ij = J_ji couples x_i x_j once)",
        )
    if np.any(np.diag(J) != 0):
        i = int(np.flatnonzero(np.diag(J))[0])
        raise MRFError(
            name,
            f"diagonal entry [{i}, {i}] is {J[i, i]:g}",
            "set the diagonal to zero (x_i^2 = 1 adds only a constant)",
        )
    h = np.zeros(n) if h is None else np.asarray(h, dtype=np.float64)
    if h.shape != (n,):
        raise MRFError("h", f"has shape {h.shape}, the couplings need ({n},)", "pass one field per node")
    iu = np.triu_indices(n, 1)
    keep = J[iu] != 0
    return make_mrf(h, np.stack([iu[0][keep], iu[1][keep]], axis=1), J[iu][keep])


def to_dense(mrf: PairwiseMRF) -> np.ndarray:
    """The symmetric coupling matrix [n, n]."""
    M = np.zeros((mrf.n, mrf.n))
    M[mrf.edges[:, 0], mrf.edges[:, 1]] = mrf.J
    M[mrf.edges[:, 1], mrf.edges[:, 0]] = mrf.J
    return M


def ising_lattice(
    L: int,
    W: int | None = None,
    *,
    J: float = 1.0,
    h: float = 0.0,
    beta: float = 1.0,
    periodic: bool = True,
    bonds_h=None,
    bonds_v=None,
) -> PairwiseMRF:
    """The 2-D Ising model on an L x W lattice (rows x columns), node ``r * W + c``.

    ``P(s) ∝ exp(beta (J sum_<ij> b_ij s_i s_j + h sum_i s_i))`` with bond signs ``b`` from
    ``bonds_h`` [L, W] (between (r, c) and (r, c+1)) and ``bonds_v`` [L, W] (between (r, c) and
    (r+1, c)), all +1 by default -- the convention of ``pgmflow.tasks.tempering.targets.IsingTarget``.
    Periodic lattices wrap both ways (on a side of 2 the two bonds between a pair add up).
    """
    W = L if W is None else W
    if L < 1 or W < 1:
        raise MRFError("lattice", f"{L} x {W}", "use sides >= 1")
    bh = np.ones((L, W)) if bonds_h is None else np.asarray(bonds_h, dtype=np.float64)
    bv = np.ones((L, W)) if bonds_v is None else np.asarray(bonds_v, dtype=np.float64)
    r, c = np.divmod(np.arange(L * W), W)
    src, dst, val = [], [], []
    right = (c + 1 < W) | (periodic & (W > 1))
    down = (r + 1 < L) | (periodic & (L > 1))
    src.append(np.flatnonzero(right))
    dst.append((r * W + (c + 1) % W)[right])
    val.append(beta * J * bh.reshape(-1)[right])
    src.append(np.flatnonzero(down))
    dst.append((((r + 1) % L) * W + c)[down])
    val.append(beta * J * bv.reshape(-1)[down])
    return make_mrf(
        np.full(L * W, beta * h), np.stack([np.concatenate(src), np.concatenate(dst)], axis=1), np.concatenate(val)
    )


def adjacency(mrf: PairwiseMRF) -> Adjacency:
    """CSR adjacency with edge ids and reverse positions (for message passing on directed edges)."""
    n, E = mrf.n, mrf.E
    a, b = mrf.edges[:, 0], mrf.edges[:, 1]
    src = np.concatenate([a, b])
    dst = np.concatenate([b, a])
    eid = np.concatenate([np.arange(E), np.arange(E)])
    order = np.lexsort((dst, src))
    src, dst, eid = src[order], dst[order], eid[order]
    indptr = np.zeros(n + 1, np.int64)
    np.add.at(indptr, src + 1, 1)
    indptr = np.cumsum(indptr)
    # reverse of (src -> dst): the entry (dst -> src); entries are sorted by the key src * n + dst
    key = src * n + dst
    rev = np.searchsorted(key, dst * n + src).astype(np.int64)
    return Adjacency(indptr, dst.astype(np.int64), eid.astype(np.int64), rev)


def clamp(mrf: PairwiseMRF, i: int, value: int) -> tuple[PairwiseMRF, float]:
    """Condition on ``x_i = value``: the model over the other ``n - 1`` nodes (renumbered in order)
    and the additive constant, so that ``log Z(x_i = value) = const + log Z(clamped)``."""
    if value not in (-1, 1):
        raise MRFError("value", value, "clamp a spin to -1 or +1")
    n = mrf.n
    keep = np.ones(n, bool)
    keep[i] = False
    new_index = np.cumsum(keep) - 1
    h = mrf.h.copy()
    touch = (mrf.edges[:, 0] == i) | (mrf.edges[:, 1] == i)
    for (a, b), Je in zip(mrf.edges[touch], mrf.J[touch]):
        other = b if a == i else a
        h[other] += Je * value
    rest = mrf.edges[~touch]
    return (make_mrf(h[keep], new_index[rest], mrf.J[~touch]), float(mrf.h[i] * value))


def energy_terms(mrf: PairwiseMRF, x) -> np.ndarray:
    """``h.x + sum_e J_e x_i x_j`` for spin configurations ``x`` [..., n] (the log-potential)."""
    x = np.asarray(x, dtype=np.float64)
    return x @ mrf.h + (x[..., mrf.edges[:, 0]] * x[..., mrf.edges[:, 1]]) @ mrf.J
