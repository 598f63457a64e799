"""The reference end of the path: fixed (the target's own), variational (a Gaussian fitted between
rounds to the target-end draws of the previous round) or stabilized (both legs, joined at the
target end). Surjanovic, Syed, Bouchard-Côté, Campbell (NeurIPS 2022); see
``pgmflow.tasks.tempering.variational`` for the numerics and docs/tempering.md for the user's view.

Everything here runs in the driver on gathered, ordered data (the fit uses the round's records in
scan order), so the fitted reference, and every result after it, is the same for any number of
workers, blocks or scans per task, and after a resume (the reference is in the checkpoint).
"""

from __future__ import annotations

import numpy as np

from pgmflow.tasks.tempering import diagnostics, schedule, variational

REFERENCES = ("fixed", "variational", "stabilized")


def legs_of(tcfg: dict, K: int) -> np.ndarray | None:
    """The leg of each of the K levels: None for reference=fixed (the historical single path), zeros
    for variational, [0]*K0 + [1]*K1 (K0 = K // 2) for stabilized."""
    ref = tcfg.get("reference", "fixed")
    if ref == "fixed":
        return None
    if ref == "variational":
        return np.zeros(K, dtype=np.int64)
    K0 = K // 2
    return np.concatenate([np.zeros(K0, dtype=np.int64), np.ones(K - K0, dtype=np.int64)])


def initial_betas(legs, K: int, make) -> np.ndarray:
    """The initial global ladder: ``make(n)`` (an increasing ladder of n levels) per leg."""
    if legs is None or legs.max() == 0:
        return make(K)
    return variational.stabilized_betas(make(int((legs == 0).sum())), make(int((legs == 1).sum())))


def adapt(betas, legs, rejection) -> np.ndarray:
    """Each leg's ladder re-spaced from its own swap rejections (the legs' shared target end stays)."""
    if legs is None:
        return schedule.adapt_schedule(betas, rejection)
    new = np.array(betas, dtype=np.float64, copy=True)
    for lv, pairs in zip(variational.leg_levels(legs), variational.leg_pairs(legs)):
        new[lv] = schedule.adapt_schedule(new[lv], np.asarray(rejection)[pairs])
    return new


def path(target, legs, q):
    """The Path of a chain for the next round: None (fixed); (q,) (variational; the target's own
    reference until the first fit); (fixed, q) (stabilized)."""
    if legs is None:
        return None
    q = target.reference if q is None else q
    refs = (q,) if legs.max() == 0 else (target.reference, q)
    return variational.Path(legs=legs, references=refs)


def fit(trace, family: str):
    """Moment-matched Gaussian from a round's target-end draws (every scan, every target level)."""
    x = trace.target_x  # [T, n_t, d]
    return variational.fit_gaussian(x.reshape(-1, x.shape[-1]), family)


def leg_round_trips_init(legs):
    if legs is None or legs.max() == 0:
        return None
    return [diagnostics.round_trip_init(len(legs)) for _ in variational.leg_levels(legs)]


def leg_round_trips_update(states, legs, level_trace):
    """Each leg's own round trips (its reference -> target -> its reference; a replica in the other
    leg counts as at this leg's target end)."""
    if states is None:
        return None
    out = []
    for g, (st, lv) in enumerate(zip(states, variational.leg_levels(legs))):
        out.append(diagnostics.round_trip_update(st, variational.leg_level_map(legs, g)[level_trace], len(lv)))
    return out


def to_arrays(qs, leg_rts, dim: int) -> dict:
    """The references and per-leg round-trip counters of every chain, as checkpoint arrays."""
    C = len(qs)
    if all(q is None for q in qs) and all(r is None for r in leg_rts):
        return {}
    kind = np.zeros(C, dtype=np.int64)
    mean, scale, inv = np.zeros((C, dim)), np.zeros((C, dim, dim)), np.zeros((C, dim, dim))
    for c, q in enumerate(qs):
        if isinstance(q, variational.DiagonalGaussian):
            kind[c], mean[c], scale[c] = 1, q.mean, np.diag(q.std)
        elif isinstance(q, variational.FullGaussian):
            kind[c], mean[c], scale[c], inv[c] = 2, q.mean, q.chol, q.chol_inv
    out = {"ref_kind": kind, "ref_mean": mean, "ref_scale": scale, "ref_scale_inv": inv}
    if leg_rts[0] is not None:
        out["leg_rt_phase"] = np.stack([[s.phase for s in r] for r in leg_rts])
        out["leg_rt_trips"] = np.stack([[s.trips for s in r] for r in leg_rts])
    return out


def from_arrays(ckpt: dict, C: int):
    """Inverse of :func:`to_arrays`: (references, per-leg round-trip counters) per chain."""
    if "ref_kind" not in ckpt:
        return [None] * C, [None] * C
    qs = []
    for kind, mean, scale, inv in zip(ckpt["ref_kind"], ckpt["ref_mean"], ckpt["ref_scale"], ckpt["ref_scale_inv"]):
        if kind == 1:
            qs.append(variational.DiagonalGaussian(mean=np.array(mean), std=np.array(np.diag(scale))))
        elif kind == 2:
            qs.append(variational.FullGaussian(mean=np.array(mean), chol=np.array(scale), chol_inv=np.array(inv)))
        else:
            qs.append(None)
    if "leg_rt_phase" not in ckpt:
        return qs, [None] * C
    rts = [[diagnostics.RoundTripState(phase=np.array(p), trips=np.array(t)) for p, t in zip(ph, tr)]
           for ph, tr in zip(ckpt["leg_rt_phase"], ckpt["leg_rt_trips"])]
    return qs, rts
