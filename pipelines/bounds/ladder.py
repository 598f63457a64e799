"""``bounds=true`` in the tempering pipeline: MF, Bethe and TRW at every level of the ladder."""

from __future__ import annotations

import math

import dask
import numpy as np

from pgmflow.bounds.models import ising_model, ising_rho
from pgmflow.bounds.settings import VariationalSettings
from pgmflow.tasks.bounds import trw
from pgmflow.tasks.bounds.per_temperature import bounds_task, lattice_of, mrf_level


def _levels(settings: VariationalSettings, target, b, leg_targets=None, legs=None):
    """What each level's task takes (``(target, b)`` or the level's MRF), rho, the lattice (or None), and the
    inverse temperature of each level: an Ising lattice at ``b * beta_model``; an MRF target
    (``pgmflow.tasks.tempering.mrf_target``) at level b is the MRF of couplings ``b J`` and fields
    ``b h + (1 - b) a`` (``a``: its reference fields, those of the level's leg with two legs), whose log Z is
    the path's ``log Z_b``."""
    if target.kind == "mrf":
        per = [target] * b.size if legs is None else [leg_targets[int(g)] for g in legs]
        models = [mrf_level(t, float(bk)) for t, bk in zip(per, b)]
        rho = trw.spanning_tree_rho(target.model, n_trees=settings.n_trees, seed=0)
        return models, rho, None, b
    rho = ising_rho(target, ising_model(target, float(b[-1])), settings)
    return [(target, float(bk)) for bk in b], rho, lattice_of(target), b * target.beta_model


def _path_estimates(target, b, ll, legs, q):
    """The tempering estimate of each level's ``log Z_b`` and its SE: ``log Z_ref`` + the stepping stone over
    the levels from the reference to it. With two legs (``legs``; reference=stabilized on an MRF, whose
    second leg's reference is ``q``, a ``ProductReference``) each leg from its own reference: leg 1's
    log-likelihoods carry the constant ``log Z_q - log Z_ref`` (``explore_mrf``), taken out again here."""
    from pgmflow.tasks.tempering import estimators, variational

    est, se = np.zeros(b.size), np.zeros(b.size)
    groups = [np.arange(b.size)] if legs is None else variational.leg_levels(legs)
    for g, lv in enumerate(groups):
        base = target.log_z_reference if g == 0 else q.log_z
        est[lv[0]] = base
        for j in range(1, lv.size):
            e = estimators.stepping_stone_joint(b[lv[: j + 1]], ll[lv[: j + 1]])
            shift = 0.0 if g == 0 else b[lv[j]] * (q.log_z - target.log_z_reference)
            est[lv[j]] = base + float(e.estimate) - shift
            se[lv[j]] = float(e.se)
    return est.tolist(), se.tolist()


def tempering_bounds(
    ctx, settings: VariationalSettings, target, betas_per_chain, traces, group: int, legs=None, q=None
) -> dict:
    """``bounds=true`` in the tempering pipeline: MF, Bethe and TRW at every level of chain 0's ladder
    (one task per level), beside the tempering estimate of log Z there.

    ``target``: the task-side Ising target (``pgmflow.tasks.tempering.targets.IsingTarget``) or MRF target
    (``pgmflow.tasks.tempering.mrf_target.MRFTarget``); the validation refuses bounds=true on others. The
    tempering estimate at level k is ``log Z_ref + stepping stone over levels 0..k`` of each chain (the
    cumulative sum of the ladder's ratio estimates), with its standard error. With two legs (``legs``, chain
    0's leg of each level, and ``q``, the second leg's product reference: reference=stabilized on an MRF)
    each level is bounded as the MRF of its own leg and estimated from its leg's reference. Returns the rows
    (in level order, with each level's leg), the index of the row at the target (b = 1; the fixed leg's with
    two legs) and the figure's data; the caller logs them.
    """
    opts = settings.solver_options(ctx.backend)
    ex = ctx.executor
    b = np.asarray(betas_per_chain[0], dtype=np.float64)
    legs = None if legs is None or int(np.max(legs)) == 0 else np.asarray(legs, dtype=np.int64)
    leg_targets = None if legs is None else (target, target._replace(ref_field=np.asarray(q.field)))
    models, rho, lat, beta_of = _levels(settings, target, b, leg_targets, legs)
    rho = rho if isinstance(rho, str) else ex.scatter(rho)
    tasks = [
        dask.delayed(bounds_task, pure=True)(m, rho, opts, lat, dask_key_name=f"bounds-{ctx.token}-g{group}-k{k}")
        for k, m in enumerate(models)
    ]
    res = ex.gather(ex.compute(tasks))
    n = target.n_sites
    est, se = _path_estimates(target, b, traces[0].loglik.T, legs, q)  # chain 0's loglik [K, T]
    rows = []
    for k in range(b.size):
        beta = float(beta_of[k])
        r = res[k]
        tol = 2 * se[k] + 1e-9 * max(1.0, abs(est[k]))  # (at b = 0 all three are exact: rounding only)
        lo_ok = r.mf <= est[k] + tol
        up_ok = est[k] - tol <= r.trw
        rows.append(
            {
                "level": k,
                **({} if legs is None else {"leg": int(legs[k])}),
                "b": float(b[k]),
                "beta": beta,
                "T": (1.0 / beta) if beta > 0 else math.inf,
                "mf_per_site": r.mf / n,
                "bethe_per_site": r.bethe / n,
                "trw_per_site": r.trw / n,
                "tempering_per_site": est[k] / n,
                "tempering_se_per_site": se[k] / n,
                "gap_tempering_minus_mf": (est[k] - r.mf) / n,
                "gap_trw_minus_tempering": (r.trw - est[k]) / n,
                "order_holds_2se": bool(lo_ok and up_ok),
                "converged": bool(r.mf_converged and r.bp_converged and r.trw_converged),
            }
        )
    target_row = b.size - 1 if legs is None else int(fixed_leg_target(legs))
    return {"rows": rows, "n": n, "target_row": target_row}


def fixed_leg_target(legs) -> int:
    """The level where the fixed leg reaches the target (b = 1) in a two-leg chain: ``K_0 - 1``."""
    return int(np.sum(np.asarray(legs) == 0)) - 1
