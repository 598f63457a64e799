"""``bounds=true`` in the tempering pipeline: MF, Bethe and TRW at every level of the ladder."""

from __future__ import annotations

import math

import dask
import numpy as np

from pgmflow.bounds.models import ising_model, ising_rho
from pgmflow.bounds.settings import VariationalSettings
from pgmflow.tasks.bounds import trw
from pgmflow.tasks.bounds.per_temperature import bounds_task, lattice_of, mrf_level


def _levels(settings: VariationalSettings, target, b):
    """What each level's task takes (``(target, b)`` or the level's MRF), rho, the lattice (or None), and the
    inverse temperature of each level: an Ising lattice at ``b * beta_model``; an MRF target
    (``pgmflow.tasks.tempering.mrf_target``) at level b is the MRF of couplings ``b J`` and fields
    ``b h + (1 - b) a`` (``a``: its reference fields), whose log Z is the path's ``log Z_b``."""
    if target.kind == "mrf":
        models = [mrf_level(target, float(bk)) for bk in b]
        rho = trw.spanning_tree_rho(target.model, n_trees=settings.n_trees, seed=0)
        return models, rho, None, b
    rho = ising_rho(target, ising_model(target, float(b[-1])), settings)
    return [(target, float(bk)) for bk in b], rho, lattice_of(target), b * target.beta_model


def tempering_bounds(ctx, settings: VariationalSettings, target, betas_per_chain, traces, group: int) -> dict:
    """``bounds=true`` in the tempering pipeline: MF, Bethe and TRW at every level of chain 0's ladder
    (one task per level), beside the tempering estimate of log Z there.

    ``target``: the task-side Ising target (``pgmflow.tasks.tempering.targets.IsingTarget``) or MRF target
    (``pgmflow.tasks.tempering.mrf_target.MRFTarget``); the validation refuses bounds=true on others. The
    tempering estimate at level k is ``log Z_ref + stepping stone over levels 0..k`` of each chain (the
    cumulative sum of the ladder's ratio estimates), with its standard error. Returns the rows and the
    figure's data; the caller logs them.
    """
    from pgmflow.tasks.tempering import estimators

    opts = settings.solver_options(ctx.backend)
    ex = ctx.executor
    b = np.asarray(betas_per_chain[0], dtype=np.float64)
    models, rho, lat, beta_of = _levels(settings, target, b)
    rho = rho if isinstance(rho, str) else ex.scatter(rho)
    tasks = [
        dask.delayed(bounds_task, pure=True)(m, rho, opts, lat, dask_key_name=f"bounds-{ctx.token}-g{group}-k{k}")
        for k, m in enumerate(models)
    ]
    res = ex.gather(ex.compute(tasks))
    n = target.n_sites
    ll = traces[0].loglik.T  # [K, T] chain 0
    est, se = [target.log_z_reference], [0.0]
    for k in range(1, b.size):
        e = estimators.stepping_stone_joint(b[: k + 1], ll[: k + 1])
        est.append(target.log_z_reference + float(e.estimate))
        se.append(float(e.se))
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
    return {"rows": rows, "n": n}
