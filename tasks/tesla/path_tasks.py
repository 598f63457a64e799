"""What the Dask workers run for TESLA: one node's lambda1 path at one lambda2 (or bandwidth), and
the per-node choice of a grid point. Pure functions of plain data (no Dask here).

A fit task solves ``lambda1`` from the largest value down, each solve warm-started from the previous
solution (the regularisation path), and returns every solution with the statistics model selection
needs. A selection task takes a node's fits over the whole grid and keeps one grid point by BIC or
by held-out log-likelihood (then refits on all samples, warm-started from the chosen solution).
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from pgmflow.tasks import rng as _rng
from pgmflow.tasks.tesla import evaluate as _evaluate
from pgmflow.tasks.tesla import solver as _solver

METHODS = ("tesla", "keller", "static")
CRITERIA = ("bic", "ebic", "heldout")


class NodeFit(NamedTuple):
    """One node's solutions along the lambda1 grid at one lambda2 (TESLA) or bandwidth (KELLER)."""

    node: int
    method: str  # tesla | keller | static
    lam1: np.ndarray  # float64 [L1] the lambda1 grid, in the order given
    lam2: float  # lambda2 of this fit (0 for keller and static)
    bandwidth: float  # KELLER's kernel bandwidth in time points (0 otherwise)
    thetas: np.ndarray  # float64 [L1, T, p] solutions, in the order of lam1
    loglik: np.ndarray  # float64 [L1] log-likelihood of the training samples
    heldout_loglik: np.ndarray  # float64 [L1] log-likelihood of the held-out samples (nan if none)
    df: np.ndarray  # int64 [L1] degrees of freedom (evaluate.path_df)
    n_iter: np.ndarray  # int64 [L1] FISTA iterations
    converged: np.ndarray  # bool [L1]
    isolated: bool  # the node never changes value: not fitted, no neighbours
    n_train: int  # training samples (the BIC's sample size)
    seconds: float  # wall time (a timing: recorded, never compared)
    flops: np.ndarray  # int64 [L1] mat-vec FLOPs of the solves (solver.PathResult.flops)
    n_newton: np.ndarray | None = None  # int64 [L1] SSNAL's Newton steps (solver.PathResult.n_newton)


class NodeChoice(NamedTuple):
    """The grid point chosen for one node and its path."""

    node: int
    method: str
    criterion: str  # bic | heldout
    i_lam2: int  # index into the lambda2 (or bandwidth) grid
    i_lam1: int  # index into the lambda1 grid
    lam1: float
    lam2: float
    bandwidth: float
    theta: np.ndarray  # float64 [T, p] the chosen path (refitted on all samples for "heldout")
    scores: np.ndarray  # float64 [n_lam2, L1] the criterion per grid point (smaller is better)
    n_iter: int  # FISTA iterations over the node's whole grid (and the refit)
    all_converged: bool
    isolated: bool
    flops: int  # mat-vec FLOPs over the node's whole grid (and the refit)


def heldout_rows(n_rows: int, seed: int, fraction: float) -> np.ndarray:
    """bool [N]: the samples held out for model selection, keyed by the seed alone."""
    if fraction <= 0:
        return np.zeros(n_rows, bool)
    u = _rng.generator(seed, _rng.STAGE_TESLA_SPLIT).random(n_rows)
    return u < fraction


def fit_node(
    design: _solver.Design,
    node: int,
    lam1s,
    lam2: float = 0.0,
    *,
    method: str = "tesla",
    q: int = 1,
    train=None,
    bandwidth: float = 0.0,
    isolated: bool = False,
    max_iter: int = 5000,
    tol: float = 1e-6,
    screen: bool = True,
    algorithm: str = "auto",
) -> NodeFit:
    """Solve node ``node``'s path for every lambda1 in ``lam1s`` at one lambda2, warm-starting downwards.

    ``train`` (bool [N]) marks the samples the design was built from; the others are scored as
    held-out. ``isolated`` skips the solve (a node that never changes value has no finite fit).
    ``screen``: active sets predicted from the previous lambda1's solution; ``algorithm``: ``auto`` (SSNAL
    where it applies), ``fista`` or ``ssnal`` (``solver.solve_path``).
    """
    t0 = time.perf_counter()
    lam1s = np.asarray(lam1s, dtype=np.float64)
    T, p = design.T, design.p
    n1 = lam1s.size
    thetas = np.zeros((n1, T, p))
    loglik = np.zeros(n1)
    held = np.full(n1, np.nan)
    df = np.zeros(n1, np.int64)
    n_iter = np.zeros(n1, np.int64)
    n_newton = np.zeros(n1, np.int64)
    converged = np.ones(n1, bool)
    flops = np.zeros(n1, np.int64)
    if not 0 <= node < p:
        raise ValueError(f"node {node} out of range for p={p}")
    train = np.ones(design.X.shape[0], bool) if train is None else np.asarray(train, bool)
    train = train & (design.X[:, node] != 0)  # a missing value (0) is neither fitted nor held out
    scored = ~train & (design.X[:, node] != 0)
    if not isolated:
        design = _solver.node_design(design, int(node))  # once for the path (4 ms at T=645), not per lambda1
        theta = None
        for k in np.argsort(-lam1s, kind="stable"):  # largest lambda1 first: a warm-started path
            res = _solver.solve_path(
                design,
                node,
                float(lam1s[k]),
                float(lam2),
                q,
                theta0=theta,
                max_iter=max_iter,
                tol=tol,
                screen=screen,
                algorithm=algorithm,
            )
            theta = res.theta
            thetas[k] = theta
            ll = _solver.row_loglik(design.X, design.tix, node, theta)
            loglik[k] = float(ll[train].sum())
            if scored.any():
                held[k] = float(ll[scored].sum())
            df[k] = _evaluate.path_df(theta, node)
            n_iter[k] = res.n_iter
            n_newton[k] = res.n_newton
            converged[k] = res.converged
            flops[k] = res.flops
    return NodeFit(
        int(node),
        method,
        lam1s,
        float(lam2),
        float(bandwidth),
        thetas,
        loglik,
        held,
        df,
        n_iter,
        converged,
        bool(isolated),
        int(train.sum()),
        time.perf_counter() - t0,
        flops,
        n_newton,
    )


def select_node(
    fits,
    criterion: str = "bic",
    *,
    refit_designs=None,
    q: int = 1,
    max_iter: int = 5000,
    tol: float = 1e-6,
    gamma: float = 0.5,
    screen: bool = True,
    algorithm: str = "auto",
) -> NodeChoice:
    """Choose one grid point for a node from its fits (one per lambda2 / bandwidth, in grid order).

    ``bic``: smallest ``-2 loglik + log(N_train) df``. ``ebic``: the extended BIC with
    ``gamma`` and the node's p - 1 candidate neighbours (``evaluate.ebic``). ``heldout``: largest held-out
    log-likelihood, then the path is refitted on all samples at that point with
    ``refit_designs[a]`` (the all-samples design of the chosen fit ``a``), warm-started from the
    chosen solution (``screen`` as in :func:`fit_node`). Ties keep the first grid point in
    (lambda2, lambda1) order.
    """
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    fits = list(fits)
    first = fits[0]
    n2, n1 = len(fits), first.lam1.size
    if first.isolated:
        T, p = first.thetas.shape[1:]
        return NodeChoice(
            first.node,
            first.method,
            criterion,
            0,
            0,
            float(first.lam1[0]),
            first.lam2,
            first.bandwidth,
            np.zeros((T, p)),
            np.full((n2, n1), np.nan),
            0,
            True,
            True,
            0,
        )
    scores = np.empty((n2, n1))
    for a, f in enumerate(fits):
        if criterion == "bic":
            for k in range(n1):
                scores[a, k] = _evaluate.bic(f.loglik[k], int(f.df[k]), f.n_train)
        elif criterion == "ebic":
            n_cand = f.thetas.shape[2] - 1
            for k in range(n1):
                scores[a, k] = _evaluate.ebic(f.loglik[k], int(f.df[k]), f.n_train, n_cand, gamma)
        else:
            scores[a] = -f.heldout_loglik
    flat = int(np.argmin(np.where(np.isnan(scores), np.inf, scores)))
    a, k = divmod(flat, n1)
    chosen = fits[a]
    theta = chosen.thetas[k].copy()
    n_iter = int(sum(int(f.n_iter.sum()) for f in fits))
    all_conv = all(bool(f.converged.all()) for f in fits)
    flops = int(sum(int(f.flops.sum()) for f in fits))
    if criterion == "heldout":
        if refit_designs is None or len(refit_designs) != n2:
            raise ValueError("criterion 'heldout' needs refit_designs: one all-samples design per fit")
        res = _solver.solve_path(
            refit_designs[a],
            chosen.node,
            float(chosen.lam1[k]),
            chosen.lam2,
            q,
            theta0=theta,
            max_iter=max_iter,
            tol=tol,
            screen=screen,
            algorithm=algorithm,
        )
        theta = res.theta
        n_iter += res.n_iter
        flops += res.flops
        all_conv = all_conv and res.converged
    return NodeChoice(
        chosen.node,
        chosen.method,
        criterion,
        a,
        k,
        float(chosen.lam1[k]),
        chosen.lam2,
        chosen.bandwidth,
        theta,
        scores,
        n_iter,
        all_conv,
        False,
        flops,
    )
