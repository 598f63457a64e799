"""Explorers: local moves of each replica at its own level, vectorised over replicas.

Contract (blackjax style): ``explore_*(..., replica_ids, levels...) -> (new_x, ExploreInfo)``; the
input state is never modified. Randomness is keyed by identity: the Ising kernel uses Philox
counters built from (chain, replica, sweep, site); the continuous explorers draw from
``generator(seed, STAGE_EXPLORE, chain, replica, scan)``, one stream per replica, so a replica's
moves do not depend on which other replicas share its block.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pgmflow.tasks import rng as _rng
from pgmflow.tasks.backend import to_numpy
from pgmflow.tasks.tempering import targets as _targets

ISING_METHODS = ("metropolis", "heatbath")
CONTINUOUS_METHODS = ("rwm", "hmc")


class ExploreInfo(NamedTuple):
    """Diagnostics of one exploration phase, per replica (host arrays).

    loglik: float64 [R], l(x) after the moves.
    energy: float64 [R], the Ising energy E(s) (NaN for continuous targets).
    abs_m: float64 [R], |magnetisation| per site (Ising) or |x|_2 (continuous).
    accept: float64 [R], fraction of local moves accepted (Ising: spin changes per site update).
    loglik_legs: float64 [R, G], l_g(x) = log gamma(x) - log ref_g(x) for each leg's reference g, when a
        path (:class:`pgmflow.tasks.tempering.variational.Path`) was given; None otherwise.
    """

    loglik: np.ndarray
    energy: np.ndarray
    abs_m: np.ndarray
    accept: np.ndarray
    loglik_legs: np.ndarray | None = None


def ising_initial_spins(target, replica_ids, seed: int, chain: int) -> np.ndarray:
    """Independent uniform spins per replica: int8 [R, L, L]."""
    out = np.empty((len(replica_ids), target.L, target.L), dtype=np.int8)
    for i, r in enumerate(replica_ids):
        g = _rng.generator(seed, _rng.STAGE_INIT, chain, int(r))
        out[i] = np.where(g.random((target.L, target.L)) < 0.5, 1, -1)
    return out


def explore_ising(target, spins, b, replica_ids, philox_key, chain: int, sweep0: int, n_sweeps: int, method: str):
    """``n_sweeps`` checkerboard sweeps of each replica at inverse temperature ``b * beta_model``.

    spins: int8 [R, L, L] (numpy or cupy; copied, not modified); b: float64 [R].
    Returns ``(new_spins, ExploreInfo)``.
    """
    from pgmflow.tasks.tempering import ising_kernels as K

    new = spins.copy()
    thr = K.ising_thresholds(np.asarray(b, dtype=np.float64) * target.beta_model, target.J_abs, target.h, method)
    n_changed = K.ising_sweep(
        new,
        target.bonds_h,
        target.bonds_v,
        thr,
        philox_key,
        np.asarray(replica_ids, dtype=np.int64),
        chain,
        sweep0,
        n_sweeps,
    )
    energy, mag = K.ising_energy_magnetisation(new, target.bonds_h, target.bonds_v, target.J_abs, target.h)
    n = target.n_sites
    info = ExploreInfo(
        loglik=-target.beta_model * energy,
        energy=energy,
        abs_m=np.abs(mag).astype(np.float64) / n,
        accept=to_numpy(n_changed).astype(np.float64) / (n * max(n_sweeps, 1)),
    )
    return new, info


def mrf_initial_spins(target, replica_ids, seed: int, chain: int) -> np.ndarray:
    """Independent draws from the MRF target's reference per replica: int8 [R, n]."""
    from pgmflow.tasks.tempering.mrf_target import initial_spins

    out = np.empty((len(replica_ids), target.n_sites), dtype=np.int8)
    for i, r in enumerate(replica_ids):
        out[i] = initial_spins(target, _rng.generator(seed, _rng.STAGE_INIT, chain, int(r)))
    return out


def explore_mrf(
    target,
    spins,
    b,
    replica_ids,
    philox_key,
    chain: int,
    sweep0: int,
    n_sweeps: int,
    method: str,
    path=None,
    leg=None,
):
    """``n_sweeps`` per-colour sweeps of each replica of an MRF target at its level ``b``
    (:mod:`pgmflow.tasks.tempering.mrf_kernels`). spins: int8 [R, n] (numpy or cupy; copied, not modified);
    b: float64 [R]. ``loglik`` is ``l(x) = h.x + sum_e J_e x_i x_j - a.x`` (``a``: the reference fields),
    ``energy`` the negated log-potential ``-(h.x + sum_e J_e x_i x_j)``.

    path: None (the target's own reference) or a :class:`pgmflow.tasks.tempering.variational.Path` whose
    references are :class:`~pgmflow.tasks.tempering.mrf_target.ProductReference` (the legs of
    reference=stabilized), with leg: int [R] the leg of each replica. Then ``loglik_legs[:, g]`` is
    ``h.x + sum_e J_e x_i x_j - a_g.x + log Z_g - log Z_ref`` (``Z_g``: leg g's reference's normaliser,
    ``Z_ref``: the target's own), so that every leg estimates ``log Z - log Z_ref`` like the single path and
    the leg whose reference is the target's own has exactly the single path's ``l``.
    Returns ``(new_spins, ExploreInfo)``."""
    from pgmflow.tasks.tempering import mrf_kernels as K

    new = spins.copy()
    rows = None if path is None else np.stack([np.asarray(q.field, dtype=np.float64) for q in path.references])
    changed = K.mrf_sweep(
        new,
        target,
        np.asarray(b, dtype=np.float64),
        philox_key,
        replica_ids,
        chain,
        sweep0,
        n_sweeps,
        method,
        ref_fields=rows,
        leg=leg,
    )
    st = K.mrf_statistics(new, target)  # [R, 4]: h.x, J term, a.x, sum x
    n = target.n_sites
    ll = st[:, 0] + st[:, 1] - st[:, 2]
    legs_ll = None
    if path is not None:
        lz0 = target.log_z_reference
        cols = []
        for q in path.references:
            if np.array_equal(q.field, target.ref_field):
                cols.append(ll)
            else:
                ax = K.mrf_statistics(new, target, q.field)[:, 2]
                cols.append((st[:, 0] + st[:, 1] - ax) + (q.log_z - lz0))
        legs_ll = np.stack(cols, axis=1)  # [R, G]
        ll = legs_ll[np.arange(len(ll)), np.asarray(leg, dtype=np.int64)]
    info = ExploreInfo(
        loglik=ll,
        energy=-(st[:, 0] + st[:, 1]),
        abs_m=np.abs(st[:, 3]) / n,
        accept=changed.astype(np.float64) / (n * max(n_sweeps, 1)),
        loglik_legs=legs_ll,
    )
    return new, info


def continuous_initial_state(target, replica_ids, seed: int, chain: int) -> np.ndarray:
    """Independent reference draws per replica: float64 [R, d]."""
    out = np.empty((len(replica_ids), target.dim))
    for i, r in enumerate(replica_ids):
        out[i] = target.reference.sample(_rng.generator(seed, _rng.STAGE_INIT, chain, int(r)), 1)[0]
    return out


def _draws(replica_ids, seed, chain, scan, n_steps, dim):
    """Per-replica random numbers: iid reference normals [R, d], move normals [R, n, d], uniforms [R, n]."""
    R = len(replica_ids)
    z0 = np.empty((R, dim))
    z = np.empty((R, n_steps, dim))
    u = np.empty((R, n_steps))
    jit = np.empty((R, n_steps))
    for i, r in enumerate(replica_ids):
        g = _rng.generator(seed, _rng.STAGE_EXPLORE, chain, int(r), int(scan))
        z0[i] = g.standard_normal(dim)
        z[i] = g.standard_normal((n_steps, dim))
        u[i] = g.random(n_steps)
        jit[i] = g.random(n_steps)
    return z0, z, u, jit


def _select(values, leg):
    """Per row, the value of the row's leg: values is a list (one per leg) of [R] or [R, d]."""
    if len(values) == 1:
        return values[0]
    pick = leg.reshape(leg.shape + (1,) * (values[0].ndim - 1))
    return np.where(pick == 0, values[0], values[1])


def _path_functions(target, path, leg):
    """log pi_b and its gradient along the path(s): the target's own reference when ``path`` is None
    (the historical arithmetic), else each replica's leg reference ``path.references[leg]``."""
    if path is None:
        return (
            lambda x, b: _targets.continuous_log_pi(target, x, b),
            lambda x, b: _targets.continuous_grad_log_pi(target, x, b),
        )
    refs = path.references

    def log_pi(x, b):
        ref = _select([r.log_density(x) for r in refs], leg)
        return ref + b * (target.log_gamma(x) - ref)

    def grad_log_pi(x, b):
        g_ref = _select([r.grad_log_density(x) for r in refs], leg)
        return (1.0 - b)[:, None] * g_ref + b[:, None] * target.grad_log_gamma(x)

    return log_pi, grad_log_pi


def explore_continuous(
    target,
    x,
    b,
    step,
    replica_ids,
    seed: int,
    chain: int,
    scan: int,
    n_steps: int,
    method: str,
    n_leapfrog: int = 10,
    path=None,
    leg=None,
):
    """Random-walk Metropolis or HMC moves of each replica on ``pi_b``.

    x: float64 [R, d] (not modified); b: [R] levels' annealing parameters; step: [R] proposal
    scale (RWM) or leapfrog step size (HMC). Replicas at ``b == 0`` are drawn exactly from the
    reference instead (an independent sample is the best local move there).
    path: None (the target's own reference) or a :class:`pgmflow.tasks.tempering.variational.Path`, whose
    ``references[leg[i]]`` is replica i's reference; leg: int [R].
    Returns ``(new_x, ExploreInfo)``.
    """
    x = np.array(x, dtype=np.float64, copy=True)
    b = np.asarray(b, dtype=np.float64)
    step = np.asarray(step, dtype=np.float64)[:, None]
    R, d = x.shape
    leg = np.zeros(R, dtype=np.int64) if leg is None else np.asarray(leg, dtype=np.int64)
    log_pi, grad_log_pi = _path_functions(target, path, leg)
    z0, z, u, jit = _draws(replica_ids, seed, chain, scan, n_steps, d)
    n_acc = np.zeros(R)
    logp = log_pi(x, b)
    for t in range(n_steps):
        if method == "rwm":
            prop = x + step * z[:, t, :]
            momentum_ok = True
            logp_prop = log_pi(prop, b)
            log_ratio = logp_prop - logp
        elif method == "hmc":
            # The step size is jittered by +-20% per trajectory (Neal 2011), so that no fixed
            # trajectory length can resonate with a half-period of the target and stall the chain.
            eps = step * (0.8 + 0.4 * jit[:, t : t + 1])
            p0 = z[:, t, :]
            q = x.copy()
            p = p0 + 0.5 * eps * grad_log_pi(q, b)
            for i in range(n_leapfrog):
                q = q + eps * p
                g = grad_log_pi(q, b)
                p = p + (eps if i < n_leapfrog - 1 else 0.5 * eps) * g
            prop = q
            momentum_ok = np.all(np.isfinite(p), axis=1)
            logp_prop = log_pi(prop, b)
            log_ratio = (logp_prop - 0.5 * np.sum(p * p, axis=1)) - (logp - 0.5 * np.sum(p0 * p0, axis=1))
        else:
            raise ValueError(f"unknown continuous explorer {method!r}")
        diverged = ~(np.all(np.isfinite(prop), axis=1) & momentum_ok)  # a trajectory that overflowed: rejected
        logp_prop = np.where(diverged, -np.inf, logp_prop)
        if np.isnan(logp_prop).any():
            i = int(np.flatnonzero(np.isnan(logp_prop))[0])
            raise FloatingPointError(
                f"the log-density returned NaN at x={np.array2string(prop[i], precision=4)} "
                f"(replica {int(replica_ids[i])}, scan {scan}); return -inf outside the support"
            )
        log_ratio = np.where(np.isnan(log_ratio), -np.inf, log_ratio)  # -inf - (-inf): both outside
        acc = np.log(u[:, t]) < log_ratio
        x[acc] = prop[acc]
        logp = np.where(acc, logp_prop, logp)
        n_acc += acc
    at_ref = b == 0.0
    if at_ref.any():
        if path is None:
            x[at_ref] = target.reference.from_standard(z0[at_ref])
        else:
            x[at_ref] = _select([r.from_standard(z0[at_ref]) for r in path.references], leg[at_ref])
        n_acc[at_ref] = n_steps
    legs_ll = None
    if path is None:
        ll = _targets.continuous_loglik(target, x)
    else:
        lg = target.log_gamma(x)
        legs_ll = np.stack([lg - r.log_density(x) for r in path.references], axis=1)  # [R, G]
        ll = legs_ll[np.arange(R), leg]
    info = ExploreInfo(
        loglik=ll,
        energy=np.full(R, np.nan),
        abs_m=np.linalg.norm(x, axis=1),
        accept=n_acc / max(n_steps, 1),
        loglik_legs=legs_ll,
    )
    return x, info
