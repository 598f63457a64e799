"""Tree-reweighted belief propagation: an upper bound on ``log Z`` of a binary pairwise MRF.

For edge appearance probabilities ``rho`` of a distribution over spanning trees (a point of the
spanning tree polytope), Wainwright, Jaakkola and Willsky (2005) bound the entropy from above by
``sum_s H(tau_s) - sum_st rho_st I_st(tau_st)``, so that

    log Z <= max_{tau in local polytope}  <theta, tau> + sum_s H(tau_s) - sum_st rho_st I_st(tau_st).

The objective is concave; the fixed point of the TRW message update (``pgmflow.tasks.bounds.messages``)
is its maximiser and the objective there is the bound. ``rho = 1`` on a tree is the only valid
choice there and gives the exact ``log Z``; ``rho = 1`` on a loopy graph is loopy BP (not a
bound; ``validate=False`` allows it).

Edge appearance probabilities: :func:`spanning_tree_rho` (a uniform mixture of random spanning
trees, any graph), :func:`lattice_rho` (the exact uniform value on periodic lattices),
:func:`check_rho` (refuses ``rho`` that no distribution over spanning trees has).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pgmflow.tasks.bounds import messages
from pgmflow.tasks.bounds.mrf import MRFError, PairwiseMRF, adjacency, ising_lattice

__all__ = ["TRWResult", "check_rho", "lattice_rho", "spanning_tree_rho", "trw", "trw_lattice"]

SUBTOUR_MAX_N = 16  # check_rho tests every node subset up to this many nodes


class TRWResult(NamedTuple):
    """TRW message passing at its last iterate."""

    log_z_upper: float  # the TRW objective at the beliefs: an upper bound on log Z at the fixed point
    mean: np.ndarray  # float64 [n] E_tau[x_i] (pseudo-marginals)
    pair_mean: np.ndarray  # float64 [E] E_tau[x_i x_j], edge order of mrf.edges
    n_iter: int  # synchronous updates performed
    converged: bool  # max message change < tol at the last update
    rho: np.ndarray  # float64 [E] the edge appearance probabilities used


def _components(mrf: PairwiseMRF):
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = mrf.n
    g = coo_matrix((np.ones(mrf.E), (mrf.edges[:, 0], mrf.edges[:, 1])), shape=(n, n))
    return connected_components(g, directed=False)


def spanning_tree_rho(mrf: PairwiseMRF, n_trees: int = 50, seed: int = 0, max_trees: int = 100000) -> np.ndarray:
    """Edge appearance probabilities ``rho`` [E] of the uniform distribution over a set of random
    spanning trees (spanning forests when the graph is disconnected).

    Trees are minimum spanning trees under i.i.d. uniform edge weights from
    ``numpy.random.Generator(numpy.random.Philox(seed))`` (scipy.sparse.csgraph): every draw is a
    spanning tree, so the empirical mixture is a distribution over spanning trees and ``rho`` lies
    in the spanning tree polytope (it is not the uniform-spanning-tree distribution, and need not
    be). At least ``n_trees`` are drawn, and more until every edge has appeared (each edge is the
    lightest with probability 1/E and then in the tree, so this ends); ``rho_e`` is the fraction
    of drawn trees holding ``e``. Sums to ``n - (number of components)``.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import minimum_spanning_tree

    if int(n_trees) != n_trees or n_trees < 1:
        raise MRFError("n_trees", f"is {n_trees!r}", "draw at least one tree")
    n, E = mrf.n, mrf.E
    if E == 0:
        return np.zeros(0)
    rng = np.random.Generator(np.random.Philox(int(seed)))
    keys = mrf.edges[:, 0] * n + mrf.edges[:, 1]
    count = np.zeros(E)
    drawn = 0
    while drawn < n_trees or np.any(count == 0):
        if drawn >= max_trees:
            raise MRFError(
                "spanning_tree_rho",
                f"{int(np.sum(count == 0))} edges never appeared in {drawn} trees",
                "raise max_trees",
            )
        w = 1.0 - rng.random(E)  # (0, 1]: scipy drops zero weights
        g = coo_matrix((w, (mrf.edges[:, 0], mrf.edges[:, 1])), shape=(n, n)).tocsr()
        t = minimum_spanning_tree(g).tocoo()
        a, b = np.minimum(t.row, t.col), np.maximum(t.row, t.col)
        count[np.searchsorted(keys, a.astype(np.int64) * n + b)] += 1.0
        drawn += 1
    return count / drawn


def lattice_rho(L: int, W: int | None = None, *, periodic: bool = True, n_trees: int = 50, seed: int = 0) -> np.ndarray:
    """Edge appearance probabilities [E] for ``ising_lattice(L, W, periodic=...)`` (its edge order).

    Periodic with ``L, W >= 3``: the uniform value ``(n - 1) / E = (n - 1) / (2 n)``. For
    ``L == W`` the torus is edge-transitive, so the uniform spanning tree gives every edge the same
    probability, which must be ``(n - 1) / E``: this is the exact UST appearance probability. For
    ``L != W`` (horizontal and vertical bonds are different orbits) it is still a point of the
    spanning tree polytope, by Edmonds' description ``{rho >= 0, rho(E) = n - 1,
    rho(E(S)) <= |S| - 1 for all S}``: the torus is 4-regular and 4-edge-connected
    (C_L x C_W has edge connectivity min(2L, 2W, 4) = 4), so a proper non-empty subset ``S`` has
    ``|E(S)| = 2|S| - |d(S)|/2`` with ``|d(S)| >= 4``, whence
    ``rho(E(S)) = (n-1)/(2n) (2|S| - |d(S)|/2) <= |S| - 1`` reduces to
    ``4 (n - |S|) <= (n - 1) |d(S)|``, true for ``|S| >= 1``; and ``S = V`` gives equality.

    Open lattices (and periodic ones with a side below 3): :func:`spanning_tree_rho`.
    """
    W = L if W is None else W
    mrf = ising_lattice(L, W, periodic=periodic)
    if periodic and L >= 3 and W >= 3:
        return np.full(mrf.E, (mrf.n - 1) / mrf.E)
    return spanning_tree_rho(mrf, n_trees=n_trees, seed=seed)


def check_rho(mrf: PairwiseMRF, rho) -> np.ndarray:
    """Refuse ``rho`` that cannot be the edge appearance probabilities of a distribution over
    spanning trees (forests): MRFError ``rho: <problem>; fix: <fix>``. Checks shape, finiteness,
    ``0 < rho_e <= 1``, ``sum = (nodes - 1)`` on every connected component (1e-9 relative), an
    incident sum >= 1 at every non-isolated node, and for ``n <= 16`` every subtour constraint
    ``sum_{e in E(S)} rho_e <= |S| - 1`` (which, with the sums, is Edmonds' exact description).
    Returns ``rho`` as float64 [E]."""
    E, n = mrf.E, mrf.n
    fix = "use spanning_tree_rho(mrf) (or lattice_rho for a lattice)"
    rho = np.asarray(rho, dtype=np.float64)
    if rho.shape != (E,):
        raise MRFError("rho", f"has shape {rho.shape}, the model has {E} edges", "pass one value per edge, shape (E,)")
    if not np.all(np.isfinite(rho)):
        k = int(np.flatnonzero(~np.isfinite(rho))[0])
        raise MRFError("rho", f"is not finite on edge {k} ({rho[k]})", fix)
    if np.any(rho <= 0):
        k = int(np.flatnonzero(rho <= 0)[0])
        raise MRFError(
            "rho",
            f"is {rho[k]:g} <= 0 on edge {k} {tuple(int(v) for v in mrf.edges[k])}; TRW needs every edge in some tree",
            fix,
        )
    if np.any(rho > 1 + 1e-12):
        k = int(np.argmax(rho))
        raise MRFError("rho", f"is {rho[k]:.12g} > 1 on edge {k} {tuple(int(v) for v in mrf.edges[k])}", fix)
    if E == 0:
        return rho
    ncomp, label = _components(mrf)
    size = np.bincount(label, minlength=ncomp)
    tot = np.bincount(label[mrf.edges[:, 0]], weights=rho, minlength=ncomp)
    want = size - 1.0
    bad = np.abs(tot - want) > 1e-9 * np.maximum(want, 1.0)
    if np.any(bad):
        c = int(np.flatnonzero(bad)[0])
        node = int(np.flatnonzero(label == c)[0])
        raise MRFError(
            "rho",
            f"sums to {tot[c]:.12g} on the connected component of node {node} ({size[c]} nodes); "
            f"spanning trees have {int(want[c])} edges there",
            fix,
        )
    inc = np.bincount(mrf.edges[:, 0], weights=rho, minlength=n) + np.bincount(
        mrf.edges[:, 1], weights=rho, minlength=n
    )
    deg = np.bincount(mrf.edges.reshape(-1), minlength=n)
    low = (deg > 0) & (inc < 1 - 1e-9)
    if np.any(low):
        v = int(np.flatnonzero(low)[0])
        raise MRFError(
            "rho",
            f"sums to {inc[v]:.12g} < 1 over the edges of node {v}; every spanning tree "
            "touches every non-isolated node",
            fix,
        )
    if n <= SUBTOUR_MAX_N:
        masks = np.arange(1, 1 << n, dtype=np.int64)
        inside = np.zeros(masks.size)
        for (i, j), r in zip(mrf.edges, rho):
            inside += r * ((masks >> i) & (masks >> j) & 1)
        pop = np.zeros(masks.size, np.int64)
        for i in range(n):
            pop += (masks >> i) & 1
        excess = inside - (pop - 1) - 1e-9 * np.maximum(pop - 1, 1)
        if np.any(excess > 0):
            k = int(np.argmax(excess))
            S = [i for i in range(n) if (masks[k] >> i) & 1]
            raise MRFError(
                "rho",
                f"sums to {inside[k]:.12g} over the edges inside nodes {S}, more than "
                f"|S| - 1 = {len(S) - 1} (a spanning tree has no cycle there)",
                fix,
            )
    return rho


def trw(
    mrf: PairwiseMRF,
    rho=None,
    *,
    damping: float = 0.5,
    max_iter: int = 10000,
    tol: float = 1e-10,
    n_trees: int = 50,
    seed: int = 0,
    validate: bool = True,
) -> TRWResult:
    """Tree-reweighted BP (numba kernel, any graph) and the TRW upper bound on ``log Z``.

    ``rho`` [E] (``None``: ``spanning_tree_rho(mrf, n_trees=n_trees, seed=seed)``) is checked by
    :func:`check_rho` unless ``validate=False`` (then any ``rho`` in (0, 1] runs, e.g. all ones for
    loopy BP, but the result is a bound only for ``rho`` in the spanning tree polytope).
    ``damping`` d in (0, 1]: ``u <- (1 - d) u + d update(u)`` in log space. The bound holds at the
    fixed point (``converged``); never raises on non-convergence.
    """
    if rho is None:
        rho = spanning_tree_rho(mrf, n_trees=n_trees, seed=seed)
    rho = check_rho(mrf, rho) if validate else messages._rho_basic(rho, mrf.E)
    adj = adjacency(mrf)
    u, n_iter, conv = messages.run_messages(mrf, rho, damping, max_iter, tol, adj=adj)
    b = messages.beliefs(mrf, rho, u, adj=adj)
    return TRWResult(b.objective, b.mean, b.pair_mean, n_iter, conv, rho)


def trw_lattice(
    h,
    Jr,
    Jd,
    rho_r=None,
    rho_d=None,
    *,
    periodic: bool = True,
    damping: float = 0.5,
    max_iter: int = 10000,
    tol: float = 1e-10,
    validate: bool = True,
) -> messages.LatticeResult:
    """TRW on an L x W lattice with the array path (NumPy or CuPy arrays [L, W]; layout of
    ``messages.lattice_messages_xp``). ``rho_r``/``rho_d`` default to the uniform ``(n-1)/(2n)`` of
    a periodic lattice (:func:`lattice_rho`; required for an open one). ``validate`` runs
    :func:`check_rho` on a host copy of ``rho``. Same iterates as :func:`trw` on the corresponding
    ``ising_lattice`` model; the result's arrays stay on the input's device."""
    from pgmflow.tasks import backend

    xp = backend.array_module(h)
    L, W = xp.asarray(h).shape
    if rho_r is None or rho_d is None:
        if not periodic:
            raise MRFError(
                "rho",
                "has no default on an open lattice",
                "pass rho_r and rho_d "
                "(e.g. from lattice_rho(L, W, periodic=False) through messages.lattice_edge_index)",
            )
        val = (L * W - 1) / (2 * L * W)
        rho_r = xp.full((L, W), val) if rho_r is None else rho_r
        rho_d = xp.full((L, W), val) if rho_d is None else rho_d
    if validate:
        idx_r, idx_d = messages.lattice_edge_index(L, W, periodic)
        E = int(max(idx_r.max(), idx_d.max())) + 1 if L * W > 1 else 0
        rho = np.zeros(E)
        rr, rd = backend.to_numpy(rho_r), backend.to_numpy(rho_d)
        rho[idx_r[idx_r >= 0]] = rr[idx_r >= 0]
        rho[idx_d[idx_d >= 0]] = rd[idx_d >= 0]
        check_rho(ising_lattice(L, W, periodic=periodic), rho)
    return messages.lattice_run_xp(h, Jr, Jd, rho_r, rho_d, periodic, damping, max_iter, tol)
