"""Parallel tempering as pure block-level functions (the tasks the pipeline farms out).

One PT *chain* has ``R`` replicas and a ladder of ``K == R`` levels ``0 = b_0 < ... < b_{K-1} = 1``.
Replica ``r`` holds its state for the whole run; ``levels[r]`` says at which level it currently
is. Swaps exchange levels (temperatures), never states, so states stay on the worker that holds
their block. A *scan* is: every replica explores at its level (:func:`explore_block`, one task
per block), then one swap step decides from the small per-replica statistics alone
(:func:`communicate`, one small task per chain).

Swap schemes (Syed et al. 2021): ``deo`` (deterministic even/odd, non-reversible: even pairs at
even scans, odd pairs at odd scans) and ``seo`` (stochastic even/odd, reversible: the parity is
drawn at random each scan).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pgmflow.tasks import rng as _rng
from pgmflow.tasks.tempering import explorers as _explorers

SWAP_SCHEMES = ("deo", "seo")


class ExploreParams(NamedTuple):
    """Static settings of the local moves.

    method: metropolis | heatbath (Ising, MRF) or rwm | hmc (continuous).
    n_steps: sweeps (Ising) or MH steps / HMC trajectories (continuous) per scan.
    n_leapfrog: leapfrog steps per HMC trajectory.
    seed: master seed.
    chain: index of the independent PT run.
    philox_key: uint32 [2], key of the spin kernels (Ising, MRF) for this chain (unused for continuous).
    backend: numpy | cupy, where the Ising states live.
    """

    method: str
    n_steps: int
    n_leapfrog: int
    seed: int
    chain: int
    philox_key: np.ndarray
    backend: str = "numpy"


class BlockState(NamedTuple):
    """The states of one block of replicas; stays on its worker between scans.

    replica_ids: int64 [Rb], global replica identities (0..R-1).
    x: int8 [Rb, L, L] spins (numpy or cupy), int8 [Rb, n] spins of an MRF, or float64 [Rb, d].
    """

    replica_ids: np.ndarray
    x: object


class BlockStats(NamedTuple):
    """Small per-replica statistics of one block after exploring (what travels).

    replica_ids: int64 [Rb]; loglik, energy, abs_m, accept: float64 [Rb] (see ExploreInfo).
    loglik_legs: float64 [Rb, G] or None (see ExploreInfo).
    target_ids, target_x: with a path, the replicas of the block at a target level (b = 1) and their
        states [m, d] (what the variational reference is fitted to); None otherwise.
    """

    replica_ids: np.ndarray
    loglik: np.ndarray
    energy: np.ndarray
    abs_m: np.ndarray
    accept: np.ndarray
    loglik_legs: np.ndarray | None = None
    target_ids: np.ndarray | None = None
    target_x: np.ndarray | None = None


class SwapRecord(NamedTuple):
    """Outcome of one scan of one chain, indexed by *level* (pre-swap) unless stated.

    scan: global scan index.
    levels: int64 [R], each replica's level *after* the swap step (input of the next scan).
    loglik, energy, abs_m, local_accept: float64 [K], statistics of the replica at each level.
    accept_prob: float64 [K-1], swap acceptance probability of pair (k, k+1), computed for every
        pair (proposed or not: its expectation is the same, so all scans inform the schedule).
    proposed: bool [K-1], the pairs proposed at this scan (even or odd).
    accepted: bool [K-1].
    replica_accept: float64 [R], local acceptance of each *replica* (indexed by replica id).
    target_x: float64 [n_t, d], with a path: the states at the target levels (b = 1, in level order)
        after exploring; None without one.
    """

    scan: int
    levels: np.ndarray
    loglik: np.ndarray
    energy: np.ndarray
    abs_m: np.ndarray
    local_accept: np.ndarray
    accept_prob: np.ndarray
    proposed: np.ndarray
    accepted: np.ndarray
    replica_accept: np.ndarray
    target_x: np.ndarray | None = None


def initial_record(n_replicas: int) -> SwapRecord:
    """The record that starts a chain: replica r at level r."""
    K = n_replicas
    nan = np.full(K, np.nan)
    return SwapRecord(
        scan=-1,
        levels=np.arange(K, dtype=np.int64),
        loglik=nan,
        energy=nan,
        abs_m=nan,
        local_accept=nan,
        accept_prob=np.full(K - 1, np.nan),
        proposed=np.zeros(K - 1, bool),
        accepted=np.zeros(K - 1, bool),
        replica_accept=nan,
    )


def init_block(target, replica_ids, params: ExploreParams) -> BlockState:
    """Fresh independent draws from the reference for the given replicas."""
    ids = np.asarray(replica_ids, dtype=np.int64)
    if target.kind in ("ising", "mrf"):
        init = _explorers.ising_initial_spins if target.kind == "ising" else _explorers.mrf_initial_spins
        x = init(target, ids, params.seed, params.chain)
        if params.backend == "cupy":
            from pgmflow.tasks import backend

            x = backend.cupy().asarray(x)
    else:
        x = _explorers.continuous_initial_state(target, ids, params.seed, params.chain)
    return BlockState(replica_ids=ids, x=x)


def explore_block(
    state: BlockState,
    prev: SwapRecord,
    betas: np.ndarray,
    step_sizes: np.ndarray,
    target,
    params: ExploreParams,
    scan: int,
    path=None,
):
    """Local moves of one block for one scan, at the levels ``prev.levels`` assigned.

    betas: float64 [K] ladder; step_sizes: float64 [K] per-level step (continuous explorers).
    path: None (the target's own reference) or a :class:`pgmflow.tasks.tempering.variational.Path` (the
    reference of each leg and the leg of each level).
    Returns ``(BlockState, BlockStats)``; the input state is not modified.
    """
    lv = prev.levels[state.replica_ids]
    b = np.asarray(betas, dtype=np.float64)[lv]
    if path is None and target.kind in ("ising", "mrf"):
        sweep0 = int(scan) * params.n_steps
        explore = _explorers.explore_ising if target.kind == "ising" else _explorers.explore_mrf
        x, info = explore(
            target,
            state.x,
            b,
            state.replica_ids,
            params.philox_key,
            params.chain,
            sweep0,
            params.n_steps,
            params.method,
        )
    elif target.kind == "mrf":  # an MRF on a two-leg path (reference=stabilized): each replica's leg reference
        x, info = _explorers.explore_mrf(
            target,
            state.x,
            b,
            state.replica_ids,
            params.philox_key,
            params.chain,
            int(scan) * params.n_steps,
            params.n_steps,
            params.method,
            path=path,
            leg=np.asarray(path.legs)[lv],
        )
    else:  # continuous targets, and any target on a variational path (the leg of each level)
        legs = {} if path is None else {"path": path, "leg": np.asarray(path.legs)[lv]}
        x, info = _explorers.explore_continuous(
            target,
            state.x,
            b,
            np.asarray(step_sizes)[lv],
            state.replica_ids,
            params.seed,
            params.chain,
            scan,
            params.n_steps,
            params.method,
            params.n_leapfrog,
            **legs,
        )
    if path is not None:
        at_target = b == 1.0
        stats = BlockStats(
            replica_ids=state.replica_ids,
            loglik=info.loglik,
            energy=info.energy,
            abs_m=info.abs_m,
            accept=info.accept,
            loglik_legs=info.loglik_legs,
            target_ids=state.replica_ids[at_target],
            target_x=x[at_target] if isinstance(x, np.ndarray) else _to_host(x)[at_target],  # cupy spins: host
        )
        return BlockState(replica_ids=state.replica_ids, x=x), stats
    stats = BlockStats(
        replica_ids=state.replica_ids, loglik=info.loglik, energy=info.energy, abs_m=info.abs_m, accept=info.accept
    )
    return BlockState(replica_ids=state.replica_ids, x=x), stats


def _to_host(x):
    from pgmflow.tasks.backend import to_numpy

    return to_numpy(x)


def swap_parity(scheme: str, seed: int, chain: int, scan: int) -> int:
    """0: pairs (0,1), (2,3), ...; 1: pairs (1,2), (3,4), ..."""
    if scheme == "deo":
        return int(scan) % 2
    if scheme == "seo":
        return int(_rng.generator(seed, _rng.STAGE_SWAP, chain, scan, 1).integers(2))
    raise ValueError(f"unknown swap scheme {scheme!r}; expected one of {SWAP_SCHEMES}")


def communicate(
    prev: SwapRecord,
    betas: np.ndarray,
    scheme: str,
    seed: int,
    chain: int,
    scan: int,
    *block_stats: BlockStats,
    legs=None,
) -> SwapRecord:
    """The swap step of one scan, from the blocks' small statistics only.

    The swap of levels k and k+1 is accepted with probability
    ``min(1, exp((b_{k+1} - b_k) (l(x_k) - l(x_{k+1}))))``; accepted pairs exchange levels. With
    ``legs`` (int [K], the leg of each level of a path), ``l`` is the log-likelihood against the
    reference of the pair's leg (that of level k); the pair joining two legs has both ends at b = 1
    and is always accepted.
    """
    betas = np.asarray(betas, dtype=np.float64)
    K = betas.shape[0]
    ids = np.concatenate([s.replica_ids for s in block_stats])
    order = np.argsort(ids, kind="stable")

    def by_replica(field):
        return np.concatenate([getattr(s, field) for s in block_stats])[order]

    if not np.array_equal(ids[order], np.arange(K)):
        raise ValueError(f"blocks cover replicas {sorted(ids.tolist())}, expected 0..{K - 1}")
    levels = prev.levels.copy()
    at_level = np.empty(K, dtype=np.int64)
    at_level[levels] = np.arange(K)  # replica at each level
    ll_r = by_replica("loglik")
    ll = ll_r[at_level]
    ll_lo, ll_hi = ll[:-1], ll[1:]
    if legs is not None:
        legs = np.asarray(legs, dtype=np.int64)
        ll_legs = by_replica("loglik_legs")[at_level]  # [K, G]
        ll = ll_legs[np.arange(K), legs]
        ll_lo, ll_hi = ll_legs[:-1][np.arange(K - 1), legs[:-1]], ll_legs[1:][np.arange(K - 1), legs[:-1]]
        if not np.all(np.isfinite(ll_legs)):
            ll = np.where(np.isfinite(ll_legs).all(axis=1), ll, np.nan)
    if not np.all(np.isfinite(ll)):
        bad = int(np.flatnonzero(~np.isfinite(ll))[0])
        raise FloatingPointError(
            f"non-finite log-likelihood {ll[bad]} at level {bad} (b={betas[bad]:.6g}), "
            f"scan {scan}: the target's log-density returned NaN/inf"
        )
    log_alpha = (betas[1:] - betas[:-1]) * (ll_lo - ll_hi)
    accept_prob = np.minimum(1.0, np.exp(np.minimum(log_alpha, 0.0)))
    parity = swap_parity(scheme, seed, chain, scan)
    proposed = (np.arange(K - 1) % 2) == parity
    u = _rng.generator(seed, _rng.STAGE_SWAP, chain, scan, 0).random(K - 1)
    accepted = proposed & (np.log(u) < log_alpha)
    for k in np.flatnonzero(accepted):
        r0, r1 = at_level[k], at_level[k + 1]
        levels[r0], levels[r1] = k + 1, k
    return SwapRecord(
        scan=int(scan),
        levels=levels,
        loglik=ll,
        energy=by_replica("energy")[at_level],
        abs_m=by_replica("abs_m")[at_level],
        local_accept=by_replica("accept")[at_level],
        accept_prob=accept_prob,
        proposed=proposed,
        accepted=accepted,
        replica_accept=by_replica("accept"),
        target_x=_target_states(block_stats, at_level, betas),
    )


def _target_states(block_stats, at_level, betas):
    """States of the replicas at the target levels (b = 1), in level order: [n_t, d], or None."""
    if block_stats[0].target_ids is None:
        return None
    row = {int(r): x for s in block_stats for r, x in zip(s.target_ids, s.target_x)}
    return np.stack([row[int(at_level[k])] for k in np.flatnonzero(betas == 1.0)])


def run_scans(
    state: BlockState,
    prev: list,
    betas: np.ndarray,
    step_sizes: np.ndarray,
    target,
    params: ExploreParams,
    scheme: str,
    scan0: int,
    n_scans: int,
    path=None,
):
    """Several scans of a whole chain in one task: explore all replicas, then swap, ``n_scans`` times.

    ``state`` holds *all* replicas of the chain; ``prev`` is the list of records returned by the
    previous call (its last record gives the levels). Exactly the same arithmetic as one
    :func:`explore_block` per block plus :func:`communicate` per scan, so the results are
    bit-identical to the blocked layout. Returns ``(BlockState, list[SwapRecord])``.
    """
    rec = prev[-1]
    records = []
    for s in range(int(scan0), int(scan0) + int(n_scans)):
        state, stats = explore_block(state, rec, betas, step_sizes, target, params, s, path)
        rec = communicate(
            rec, betas, scheme, params.seed, params.chain, s, stats, legs=None if path is None else path.legs
        )
        records.append(rec)
    return state, records


class RoundTrace(NamedTuple):
    """The records of one round of one chain, stacked over scans (the per-level recorder).

    scans: int64 [T]; levels: int64 [T, R] (post-swap); loglik, energy, abs_m, local_accept: [T, K];
    accept_prob: [T, K-1]; proposed, accepted: bool [T, K-1]; replica_accept: [T, R];
    target_x: [T, n_t, d] states at the target levels (with a path), else None.
    """

    scans: np.ndarray
    levels: np.ndarray
    loglik: np.ndarray
    energy: np.ndarray
    abs_m: np.ndarray
    local_accept: np.ndarray
    accept_prob: np.ndarray
    proposed: np.ndarray
    accepted: np.ndarray
    replica_accept: np.ndarray
    target_x: np.ndarray | None = None


def _stack(records, field):
    if field == "scans":
        return np.array([r.scan for r in records], dtype=np.int64)
    if getattr(records[0], field) is None:
        return None
    return np.stack([np.asarray(getattr(r, field)) for r in records])


def stack_records(records) -> RoundTrace:
    """Record a sequence of SwapRecords (in scan order) into a RoundTrace."""
    records = sorted(records, key=lambda r: r.scan)
    return RoundTrace(*(_stack(records, f) for f in RoundTrace._fields))


def merge_traces(a: RoundTrace | None, b: RoundTrace) -> RoundTrace:
    """Concatenate two traces along the scan axis (``a`` may be None: the empty recorder)."""
    if a is None:
        return b
    return RoundTrace(*(None if x is None else np.concatenate([x, y]) for x, y in zip(a, b)))
