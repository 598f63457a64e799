"""The reference end of the path: fixed (the target's own), variational (a Gaussian fitted between
rounds to the target-end draws of the previous round) or stabilized (both legs, joined at the
target end). Surjanovic, Syed, Bouchard-Côté, Campbell (NeurIPS 2022); see
``pgmflow.tasks.tempering.variational`` for the numerics and docs/tempering.md for the user's view.

On an MRF target (``model=mrf``) the references are products of independent spins
(:class:`pgmflow.tasks.tempering.mrf_target.ProductReference`): reference=stabilized joins the uniform leg
(the target's own reference) and a product leg, which starts at the mean-field fixed point and is then
fitted, between rounds, to the target-end draws (the spins' means). reference=variational on an MRF is the
mean-field product built into the target (one leg, no path; ``pgmflow.tempering.mrf``).

Everything here runs in the driver on gathered, ordered data (the fit uses the round's records in
scan order), so the fitted reference, and every result after it, is the same for any number of
workers, blocks or scans per task, and after a resume (the reference is in the checkpoint).
"""

from __future__ import annotations

import numpy as np

from pgmflow.tasks.tempering import diagnostics, schedule, variational

REFERENCES = ("fixed", "variational", "stabilized")


def legs_of(ref: str, K: int) -> np.ndarray | None:
    """The leg of each of the K levels at the start (``ref``: ``tempering.reference``): None for
    reference=fixed (the historical single path), zeros for variational, [0]*K0 + [1]*K1 (K0 = K // 2)
    for stabilized (the split then follows the legs' barriers, :func:`adapt`, unless
    ``tempering.stabilized_split=half``)."""
    if ref == "fixed":
        return None
    if ref == "variational":
        return np.zeros(K, dtype=np.int64)
    return variational.leg_sizes_to_legs(K // 2, K - K // 2)


def initial_betas(legs, K: int, make) -> np.ndarray:
    """The initial global ladder: ``make(n)`` (an increasing ladder of n levels) per leg."""
    if legs is None or legs.max() == 0:
        return make(K)
    return variational.stabilized_betas(make(int((legs == 0).sum())), make(int((legs == 1).sum())))


def adapt(betas, legs, rejection, split: str = "adaptive") -> tuple[np.ndarray, np.ndarray | None]:
    """The next round's ladder and legs. One leg: re-spaced to equalise its swap rejections. Two legs:
    with ``split=adaptive`` the levels are first shared between the legs in proportion to their
    barriers (:func:`pgmflow.tasks.tempering.variational.stabilized_split`), then each leg's ladder
    is re-spaced on its own rejections to its new number of levels; ``split=half`` keeps the split.
    Returns ``(betas [N], legs [N] or None)``."""
    rej = np.asarray(rejection, dtype=np.float64)
    if legs is None or legs.max() == 0:
        return schedule.adapt_schedule(betas, rej), legs
    betas = np.asarray(betas, dtype=np.float64)
    sizes = [int((legs == g).sum()) for g in (0, 1)]
    per_leg = [(betas[lv], rej[pairs]) for lv, pairs in zip(variational.leg_levels(legs), variational.leg_pairs(legs))]
    if split == "adaptive":
        sizes = variational.stabilized_split([schedule.communication_barrier(b, r)[0] for b, r in per_leg], len(betas))
    new = [schedule.adapt_schedule(b, r, n_levels=n) for (b, r), n in zip(per_leg, sizes)]
    return variational.stabilized_betas(*new), variational.leg_sizes_to_legs(*sizes)


def round_trip_ends(legs):
    """The end code of each level for the whole-chain round trips (None: level 0 and K-1)."""
    return None if legs is None else variational.round_trip_ends(legs)


def initial_reference(target, legs):
    """The variational leg's reference before the first fit: None (the target's own, continuous targets;
    :func:`path` fills it in) or, on an MRF target with two legs, the mean-field product (reference fields
    ``atanh(m)`` at the mean-field fixed point)."""
    if legs is None or target.kind != "mrf":
        return None
    from pgmflow.tasks.tempering import mrf_target

    return mrf_target.ProductReference(field=mrf_target.mean_field_reference(target.model)[0])


def _own_reference(target):
    if target.kind == "mrf":
        from pgmflow.tasks.tempering.mrf_target import ProductReference

        return ProductReference(field=target.ref_field)
    return target.reference


def path(target, legs, q):
    """The Path of a chain for the next round: None (fixed); (q,) (variational; the target's own
    reference until the first fit); (fixed, q) (stabilized)."""
    if legs is None:
        return None
    own = _own_reference(target)
    q = own if q is None else q
    refs = (q,) if legs.max() == 0 else (own, q)
    return variational.Path(legs=legs, references=refs)


def fit(trace, family: str):
    """Moment-matched reference from a round's target-end draws (every scan, every target level): a
    Gaussian of ``family``, or for spins (an MRF target, int8 draws) the product of independent spins with
    the draws' means (``family`` does not apply)."""
    x = trace.target_x  # [T, n_t, d]
    x = x.reshape(-1, x.shape[-1])
    if x.dtype == np.int8:
        from pgmflow.tasks.tempering import mrf_target

        q, min_var = mrf_target.fit_product(x)
        return q, variational.FitInfo(n=int(x.shape[0]), family="product", min_var=min_var)
    return variational.fit_gaussian(x, family)


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


def to_arrays(qs, leg_rts, legs, dim: int) -> dict:
    """The references, legs and per-leg round-trip counters of every chain, as checkpoint arrays."""
    C = len(qs)
    if all(lg is None for lg in legs):
        return {}
    kind = np.zeros(C, dtype=np.int64)
    mean, scale, inv = np.zeros((C, dim)), np.zeros((C, dim, dim)), np.zeros((C, dim, dim))
    for c, q in enumerate(qs):
        if isinstance(q, variational.DiagonalGaussian):
            kind[c], mean[c], scale[c] = 1, q.mean, np.diag(q.std)
        elif isinstance(q, variational.FullGaussian):
            kind[c], mean[c], scale[c], inv[c] = 2, q.mean, q.chol, q.chol_inv
        elif q is not None:  # a product of independent spins (an MRF target): its fields
            kind[c], mean[c] = 3, q.field
    out = {"ref_kind": kind, "ref_mean": mean, "ref_scale": scale, "ref_scale_inv": inv, "legs": np.stack(legs)}
    if leg_rts[0] is not None:
        out["leg_rt_phase"] = np.stack([[s.phase for s in r] for r in leg_rts])
        out["leg_rt_trips"] = np.stack([[s.trips for s in r] for r in leg_rts])
        out["leg_rt_restarts"] = np.stack([[s.restarts for s in r] for r in leg_rts])
    return out


def from_arrays(ckpt: dict, C: int, legs0):
    """Inverse of :func:`to_arrays`: (references, per-leg round-trip counters, legs) per chain."""
    if "ref_kind" not in ckpt:
        return [None] * C, [None] * C, [legs0] * C
    qs = []
    for kind, mean, scale, inv in zip(ckpt["ref_kind"], ckpt["ref_mean"], ckpt["ref_scale"], ckpt["ref_scale_inv"]):
        if kind == 1:
            qs.append(variational.DiagonalGaussian(mean=np.array(mean), std=np.array(np.diag(scale))))
        elif kind == 2:
            qs.append(variational.FullGaussian(mean=np.array(mean), chol=np.array(scale), chol_inv=np.array(inv)))
        elif kind == 3:
            from pgmflow.tasks.tempering.mrf_target import ProductReference

            qs.append(ProductReference(field=np.array(mean)))
        else:
            qs.append(None)
    legs = [np.array(lg, dtype=np.int64) for lg in ckpt["legs"]]
    if "leg_rt_phase" not in ckpt:
        return qs, [None] * C, legs
    rts = [
        [
            diagnostics.RoundTripState(phase=np.array(p), trips=np.array(t), restarts=np.array(r))
            for p, t, r in zip(ph, tr, rs)
        ]
        for ph, tr, rs in zip(ckpt["leg_rt_phase"], ckpt["leg_rt_trips"], ckpt["leg_rt_restarts"])
    ]
    return qs, rts, legs
