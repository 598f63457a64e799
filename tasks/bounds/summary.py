"""All three variational answers for one model, and bounds on single-node marginals.

``compute_bounds`` runs naive mean field (a lower bound on log Z), loopy BP (the Bethe
approximation) and TRW (an upper bound) on one pairwise binary MRF: what one Dask task computes
for one temperature. ``marginal_bounds`` turns bounds on partition functions with one spin
clamped into bounds on that spin's marginal (Wainwright and Jordan 2008, section 7.2; Leisink and Kappen 2003):

    P(x_i = +1) = Z(x_i = +1) / Z,  so  exp(lo_+ - up) <= P(x_i = +1) <= exp(up_+ - lo),

and the same for ``x_i = -1`` through ``P(x_i = +1) = 1 - P(x_i = -1)``; the tighter of the two
is kept on each side. Any lower bound (MF) and any upper bound (TRW) serve.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from pgmflow.tasks.bounds import bp as _bp
from pgmflow.tasks.bounds import mean_field as _mf
from pgmflow.tasks.bounds import mrf as _mrf
from pgmflow.tasks.bounds import trw as _trw


class Bounds(NamedTuple):
    """log Z of one model by the three variational methods (and how each run went)."""

    mf: float  # naive mean-field lower bound on log Z
    bethe: float  # Bethe approximation of log Z (loopy BP); no bound in general
    trw: float  # tree-reweighted upper bound on log Z
    mf_converged: bool
    bp_converged: bool
    trw_converged: bool
    mf_iterations: int
    bp_iterations: int
    trw_iterations: int
    mf_mean: np.ndarray  # float64 [n] E_q[x_i] of the mean-field solution
    bp_mean: np.ndarray  # float64 [n] E[x_i] under BP's beliefs
    trw_mean: np.ndarray  # float64 [n] E[x_i] under TRW's pseudo-marginals
    seconds: float  # wall time (a timing: recorded, never compared)


class _Run(NamedTuple):
    log_z: float
    mean: np.ndarray
    n_iter: int
    converged: bool


def _lattice_run(model, rho, lattice, backend_name, damping, max_iter, tol, starts=(0.0,)) -> _Run:
    """Messages on an L x W lattice: the numba w-domain kernel on the CPU where it applies, else the
    per-direction array path (on the GPU with backend "cupy")."""
    from pgmflow.tasks import backend as _backend
    from pgmflow.tasks.bounds import lattice_kernel as _lk
    from pgmflow.tasks.bounds import messages as _msg

    L, W, periodic = lattice
    arrays = _msg.lattice_arrays(model, L, W, periodic, rho=rho)
    if backend_name == "cupy":
        cp = _backend.cupy()
        arrays = tuple(cp.asarray(a) for a in arrays)
    best = None
    for u0 in starts:
        if backend_name != "cupy" and _lk.applicable(*arrays, damping):
            msgs = _lk.lattice_messages_numba(*arrays, periodic, damping, max_iter, tol, u0=u0)
        else:
            msgs = _msg.lattice_messages_xp(*arrays, periodic, damping, max_iter, tol, u0=u0)
        res = _msg.lattice_beliefs_xp(*arrays, periodic, msgs)
        run = _Run(float(res.log_z), _backend.to_numpy(res.mean).reshape(-1), int(res.n_iter), bool(res.converged))
        if best is None or (run.converged, run.log_z) > (best.converged, best.log_z):
            best = run
    return best


def compute_bounds(
    model: _mrf.PairwiseMRF,
    rho=None,
    *,
    damping: float = 0.5,
    max_iter: int = 10000,
    tol: float = 1e-10,
    mf_restarts: int = 2,
    seed: int = 0,
    lattice=None,
    backend: str = "numpy",
) -> Bounds:
    """Mean field, loopy BP and TRW on one model. ``rho`` [E]: TRW's edge appearance probabilities
    (None: from random spanning trees, ``trw.spanning_tree_rho``). ``lattice=(L, W, periodic)`` says
    the model is ``mrf.ising_lattice(L, W, periodic=...)`` (sides >= 3 when periodic): its messages
    then run on the lattice kernels (numba on the CPU, CuPy with ``backend="cupy"``)."""
    t0 = time.perf_counter()
    mf = _mf.mean_field(model, max_iter=max_iter, tol=tol, n_restarts=mf_restarts, seed=seed)
    if lattice is not None:
        if rho is None:
            rho = _trw.spanning_tree_rho(model, seed=seed)
        else:
            _trw.check_rho(model, rho)
        bp = _lattice_run(model, np.ones(model.E), lattice, backend, damping, max_iter, tol, _bp.START_MESSAGES)
        tr = _lattice_run(model, rho, lattice, backend, damping, max_iter, tol)
    else:
        b = _bp.loopy_bp(model, damping=damping, max_iter=max_iter, tol=tol)
        t = _trw.trw(model, rho, damping=damping, max_iter=max_iter, tol=tol)
        bp = _Run(float(b.log_z_bethe), np.asarray(b.mean), int(b.n_iter), bool(b.converged))
        tr = _Run(float(t.log_z_upper), np.asarray(t.mean), int(t.n_iter), bool(t.converged))
    return Bounds(
        float(mf.log_z_lower),
        bp.log_z,
        tr.log_z,
        bool(mf.converged),
        bp.converged,
        tr.converged,
        int(mf.n_iter),
        bp.n_iter,
        tr.n_iter,
        np.asarray(mf.mean),
        bp.mean,
        tr.mean,
        time.perf_counter() - t0,
    )


class MarginalBounds(NamedTuple):
    """Bounds on P(x_i = +1) for the nodes asked for."""

    nodes: np.ndarray  # int64 [k]
    lower: np.ndarray  # float64 [k] lower bound on P(x_i = +1)
    upper: np.ndarray  # float64 [k] upper bound on P(x_i = +1)
    all_converged: bool  # every MF and TRW run behind these bounds converged


def _log_z_bounds(model, *, damping, max_iter, tol, mf_restarts, seed, n_trees):
    if model.n == 0:
        return 0.0, 0.0, True
    mf = _mf.mean_field(model, max_iter=max_iter, tol=tol, n_restarts=mf_restarts, seed=seed)
    rho = _trw.spanning_tree_rho(model, n_trees=n_trees, seed=seed) if model.E else np.zeros(0)
    tr = _trw.trw(model, rho, damping=damping, max_iter=max_iter, tol=tol)
    return float(mf.log_z_lower), float(tr.log_z_upper), bool(mf.converged and tr.converged)


def marginal_bounds(
    model: _mrf.PairwiseMRF,
    nodes=None,
    *,
    damping: float = 0.5,
    max_iter: int = 10000,
    tol: float = 1e-10,
    mf_restarts: int = 2,
    seed: int = 0,
    n_trees: int = 50,
) -> MarginalBounds:
    """Bounds on ``P(x_i = +1)`` from MF (lower) and TRW (upper) bounds on log Z, with and without
    ``x_i`` clamped. TRW's rho for every clamped model comes from its own random spanning trees."""
    nodes = np.arange(model.n) if nodes is None else np.asarray(nodes, dtype=np.int64)
    kw = dict(damping=damping, max_iter=max_iter, tol=tol, mf_restarts=mf_restarts, seed=seed, n_trees=n_trees)
    lo, up, ok = _log_z_bounds(model, **kw)
    lower = np.empty(nodes.size)
    upper = np.empty(nodes.size)
    for k, i in enumerate(nodes):
        side = {}
        for v in (1, -1):
            sub, const = _mrf.clamp(model, int(i), v)
            lo_v, up_v, ok_v = _log_z_bounds(sub, **kw)
            side[v] = (const + lo_v, const + up_v)
            ok = ok and ok_v
        lo_p, up_p = side[1]
        lo_m, up_m = side[-1]
        lower[k] = max(np.exp(lo_p - up), 1.0 - np.exp(up_m - lo))
        upper[k] = min(np.exp(up_p - lo), 1.0 - np.exp(lo_m - up))
    return MarginalBounds(nodes, np.clip(lower, 0.0, 1.0), np.clip(upper, 0.0, 1.0), bool(ok))
