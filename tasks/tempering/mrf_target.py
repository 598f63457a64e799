"""A pairwise binary MRF on any graph as a tempering target: the model, its colouring and its reference.

Model (names as in ``pgmflow.tasks.bounds.mrf``): spins ``x_i`` in {-1, +1},
``gamma(x) = exp(h.x + sum_e J_e x_i x_j)`` over the edges ``e = (i, j)``, ``i < j``. The reference is a
product of independent spins ``ref(x) = exp(a.x)`` with *reference fields* ``a`` [n] (unnormalised; its
normaliser is ``Z_ref = prod_i 2 cosh a_i``): ``a = 0`` is the uniform reference (``Z_ref = 2^n``, the
lattice's), ``a = atanh(m)`` with ``m`` the mean-field fixed point is the mean-field reference
(``tempering.reference=variational``). Level ``b`` of the ladder samples

    pi_b(x) ∝ ref(x) exp(b l(x)),  l(x) = h.x + sum_e J_e x_i x_j - a.x,

i.e. the MRF with couplings ``b J`` and fields ``b h + (1 - b) a``; node i's local field there is
``z_i = b (h_i + sum_j J_ij x_j) + (1 - b) a_i``.

A *colouring* (computed once, greedily, largest degree first) splits the nodes into classes with no edge
inside a class, so the nodes of one colour can be updated at once (a sweep updates colour 0, 1, ...).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pgmflow.tasks.bounds import mrf as _mrf

EXACT_MAX_NODES = 20  # exact log Z by enumeration up to this many nodes


class MRFTarget(NamedTuple):
    """A pairwise binary MRF as a tempering target (see the module docstring).

    Fields:
        h: float64 [n] fields; edges: int64 [E, 2] (i < j); J: float64 [E] couplings.
        indptr, nbr, Jn: the CSR adjacency: node i's neighbours ``nbr[indptr[i]:indptr[i+1]]`` (ascending),
            joined by couplings ``Jn[...]`` (int64 [n+1], int64 [2E], float64 [2E]).
        colptr, sites: the colouring: colour c's nodes are ``sites[colptr[c]:colptr[c+1]]`` (ascending;
            int64 [C+1], int64 [n]); no edge joins two nodes of one colour.
        ref_field: float64 [n], the reference fields ``a`` (zeros: the uniform reference).
        reference_name: "uniform" | "mean_field".
    """

    h: np.ndarray
    edges: np.ndarray
    J: np.ndarray
    indptr: np.ndarray
    nbr: np.ndarray
    Jn: np.ndarray
    colptr: np.ndarray
    sites: np.ndarray
    ref_field: np.ndarray
    reference_name: str = "uniform"

    @property
    def kind(self) -> str:
        return "mrf"

    @property
    def n_sites(self) -> int:
        return int(self.h.shape[0])

    @property
    def n_colours(self) -> int:
        return int(self.colptr.shape[0] - 1)

    @property
    def model(self) -> _mrf.PairwiseMRF:
        """The target as a :class:`pgmflow.tasks.bounds.mrf.PairwiseMRF` (level b = 1)."""
        return _mrf.PairwiseMRF(self.h, self.edges, self.J)

    @property
    def log_z_reference(self) -> float:
        """``log Z_ref = sum_i log(2 cosh a_i)`` (``n log 2`` for the uniform reference)."""
        a = np.abs(self.ref_field)
        return float(np.sum(a + np.log1p(np.exp(-2.0 * a))))

    @property
    def exact_log_z(self) -> float | None:
        """log Z by enumeration for at most :data:`EXACT_MAX_NODES` nodes; ``sum_i log 2 cosh h_i`` for a graph
        without couplings (independent spins) of any size; else None."""
        if not np.any(self.J != 0):
            h = np.abs(self.h)
            return float(np.sum(h + np.log1p(np.exp(-2.0 * h))))  # log 2 cosh h = |h| + log(1 + exp(-2 |h|))
        if self.n_sites > EXACT_MAX_NODES:
            return None
        from pgmflow.tasks.bounds import exact

        return float(exact.log_z_enumeration(self.model))


def greedy_colouring(indptr: np.ndarray, nbr: np.ndarray) -> np.ndarray:
    """A proper colouring, int64 [n]: nodes in order of decreasing degree (ties: lower index first) take
    the smallest colour no neighbour holds. At most ``max degree + 1`` colours; deterministic."""
    n = indptr.shape[0] - 1
    deg = np.diff(indptr)
    order = np.lexsort((np.arange(n), -deg))
    colour = np.full(n, -1, dtype=np.int64)
    for i in order.tolist():
        used = colour[nbr[indptr[i] : indptr[i + 1]]]
        used = used[used >= 0]
        if used.size == 0:
            colour[i] = 0
            continue
        taken = np.zeros(used.max() + 2, dtype=bool)
        taken[used] = True
        colour[i] = int(np.argmin(taken))
    return colour


def make_mrf_target(model: _mrf.PairwiseMRF, ref_field=None, reference_name: str | None = None) -> MRFTarget:
    """The target of a :class:`~pgmflow.tasks.bounds.mrf.PairwiseMRF` (couplings and fields with the inverse
    temperature folded in), with reference fields ``ref_field`` [n] (None: the uniform reference)."""
    n = model.n
    if n < 1:
        raise _mrf.MRFError("model", "has no nodes", "pass a model with at least one node")
    adj = _mrf.adjacency(model)
    Jn = np.ascontiguousarray(model.J[adj.eid], dtype=np.float64)
    colour = greedy_colouring(adj.indptr, adj.nbr)
    sites = np.argsort(colour, kind="stable").astype(np.int64)
    colptr = np.concatenate([[0], np.cumsum(np.bincount(colour))]).astype(np.int64)
    a = np.zeros(n) if ref_field is None else np.asarray(ref_field, dtype=np.float64)
    if a.shape != (n,) or not np.all(np.isfinite(a)):
        raise _mrf.MRFError("ref_field", f"has shape {a.shape} or non-finite values", f"pass {n} finite fields")
    return MRFTarget(
        h=np.ascontiguousarray(model.h, dtype=np.float64),
        edges=np.ascontiguousarray(model.edges, dtype=np.int64),
        J=np.ascontiguousarray(model.J, dtype=np.float64),
        indptr=np.ascontiguousarray(adj.indptr, dtype=np.int64),
        nbr=np.ascontiguousarray(adj.nbr, dtype=np.int64),
        Jn=Jn,
        colptr=colptr,
        sites=sites,
        ref_field=np.ascontiguousarray(a),
        reference_name=reference_name or ("uniform" if ref_field is None else "mean_field"),
    )


def mean_field_reference(model: _mrf.PairwiseMRF, *, damping: float = 0.0, max_iter: int = 1000, n_restarts: int = 4):
    """Reference fields of the mean-field reference: ``a = atanh(m)`` with ``m`` the best naive mean-field
    fixed point (Wainwright and Jordan 2008, section 5.3), clipped to ``|m| <= 1 - 1e-12``; and the
    mean-field result itself. The product ``prod_i exp(a_i x_i) / (2 cosh a_i)`` has means ``m``."""
    from pgmflow.tasks.bounds.mean_field import mean_field

    res = mean_field(model, damping=damping, max_iter=max_iter, n_restarts=n_restarts, seed=0)
    m = np.clip(res.mean, -1.0 + 1e-12, 1.0 - 1e-12)
    return np.arctanh(m), res


def initial_spins(target: MRFTarget, rng: np.random.Generator) -> np.ndarray:
    """One exact draw from the reference: int8 [n], ``P(x_i = +1) = sigmoid(2 a_i)``."""
    p = 0.5 * (1.0 + np.tanh(target.ref_field))
    return np.where(rng.random(target.n_sites) < p, 1, -1).astype(np.int8)


class ProductReference(NamedTuple):
    """A product of independent spins, ``exp(a.x) / prod_i 2 cosh a_i``, as the reference of one leg of a
    two-leg path (``tempering.reference=stabilized`` on an MRF): field a float64 [n]."""

    field: np.ndarray

    @property
    def log_z(self) -> float:
        """``log Z_ref = sum_i log(2 cosh a_i)``."""
        a = np.abs(self.field)
        return float(np.sum(a + np.log1p(np.exp(-2.0 * a))))


def fit_product(samples) -> tuple[ProductReference, float]:
    """Moment matching for binary targets: the product of independent spins with the draws' means (the
    forward-KL fit ``argmin_q KL(pi || q)`` over products of independent spins), from the target-end draws
    of the previous round. samples: int8 [N, n] spins (N >= 1). The means are clipped to
    ``|m| <= 1 - 1 / (N + 1)`` (a spin never seen flipped keeps a finite field). Returns the reference and
    the smallest spin variance ``min_i 1 - m_i^2``."""
    x = np.asarray(samples)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"samples must be spins [N >= 1, n]; got {x.shape}")
    N = x.shape[0]
    m = x.astype(np.float64).sum(axis=0) / N
    lim = 1.0 - 1.0 / (N + 1)
    m = np.clip(m, -lim, lim)
    return ProductReference(field=np.arctanh(m)), float(np.min(1.0 - m * m))


def reference_rows(target, R: int, ref_fields=None, leg=None) -> tuple[np.ndarray, np.ndarray]:
    """The reference of each replica as the kernels take it: fields float64 [G, n] (G = 1 or 2) and each
    replica's row int64 [R]. ``ref_fields`` None: the target's own ``ref_field`` for all (G = 1)."""
    n = target.n_sites
    if ref_fields is None:
        a = np.ascontiguousarray(np.asarray(target.ref_field, dtype=np.float64).reshape(1, n))
    else:
        a = np.ascontiguousarray(np.asarray(ref_fields, dtype=np.float64))
        if a.ndim != 2 or a.shape[1] != n or not 1 <= a.shape[0] <= 2 or not np.all(np.isfinite(a)):
            raise ValueError(f"ref_fields must be one or two rows of {n} finite fields, got {a.shape}")
    lg = np.zeros(R, dtype=np.int64) if leg is None else np.ascontiguousarray(np.asarray(leg), dtype=np.int64)
    if lg.shape != (R,) or (R and (lg.min() < 0 or lg.max() >= a.shape[0])):
        raise ValueError(f"leg must be [R] = [{R}] rows of ref_fields (0 .. {a.shape[0] - 1}), got {lg}")
    return a, lg
