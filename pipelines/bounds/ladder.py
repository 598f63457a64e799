"""``bounds=true`` in the tempering pipeline: MF, Bethe and TRW at every level of the ladder."""

from __future__ import annotations

import math

import dask
import numpy as np

from pgmflow.bounds.models import ising_model, ising_rho
from pgmflow.bounds.settings import VariationalSettings
from pgmflow.tasks.bounds.per_temperature import bounds_task, lattice_of


def tempering_bounds(ctx, settings: VariationalSettings, target, betas_per_chain, traces, group: int) -> dict:
    """``bounds=true`` in the tempering pipeline: MF, Bethe and TRW at every level of chain 0's ladder
    (one task per level), beside the tempering estimate of log Z there.

    ``target``: the task-side Ising target (``pgmflow.tasks.tempering.targets.IsingTarget``; the
    validation refuses bounds=true on other targets). The tempering estimate at level k is
    ``log Z_ref + stepping stone over levels 0..k`` of each chain (the cumulative sum of the ladder's
    ratio estimates), with its standard error. Returns the rows and the figure's data; the caller logs them.
    """
    from pgmflow.tasks.tempering import estimators

    opts = settings.solver_options(ctx.backend)
    ex = ctx.executor
    b = np.asarray(betas_per_chain[0], dtype=np.float64)
    rho = ising_rho(target, ising_model(target, float(b[-1])), settings)
    rho = rho if isinstance(rho, str) else ex.scatter(rho)
    lat = lattice_of(target)
    tasks = [
        dask.delayed(bounds_task, pure=True)(
            (target, float(bk)), rho, opts, lat, dask_key_name=f"bounds-{ctx.token}-g{group}-k{k}"
        )
        for k, bk in enumerate(b)
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
        beta = float(b[k] * target.beta_model)
        r = res[k]
        lo_ok = r.mf <= est[k] + 2 * se[k]
        up_ok = est[k] - 2 * se[k] <= r.trw
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
