"""``pgmflow pipeline=bounds``: MF, Bethe and TRW bounds on log Z, one task per temperature.

The model is the Ising model of ``model=ising`` at ``variational.temperatures`` (default:
``model.T``), or any pairwise binary MRF from a file (``model=mrf model.path=FILE.npz`` with a
symmetric coupling matrix ``J``, optional fields ``h`` and edge appearance probabilities ``rho``),
with bounds on every node's marginal when ``variational.marginals=true``.
"""

from __future__ import annotations

import dask
import numpy as np

from pgmflow.bounds import figures
from pgmflow.bounds.models import Temperature
from pgmflow.bounds.plan import BoundsPlan
from pgmflow.core import artifacts, datasets
from pgmflow.core.partial import PartialResults
from pgmflow.core.progress import Progress
from pgmflow.tasks.bounds import summary
from pgmflow.tasks.bounds.per_temperature import bounds_task, small_exact_marginals


def _solve(ctx, plan: BoundsPlan) -> list:
    """The bounds at every temperature, in order. Each temperature's result is saved as it completes
    (``partial/bounds_*.npz``); a resumed run reads them back and computes only the missing ones."""
    ex, jobs = ctx.executor, plan.model.temperatures
    saved = PartialResults(
        ctx.tracker, "bounds", summary.Bounds, ctx.resumed, every=plan.variational.checkpoint_seconds
    )
    if ctx.resumed:
        ctx.say(saved.describe(len(jobs), "temperatures"))
    todo = [k for k in range(len(jobs)) if f"T{k}" not in saved]
    rhos = [job.rho if isinstance(job.rho, str) else ex.scatter(job.rho) for job in jobs]  # arrays moved once
    opts = plan.variational.solver_options(ctx.backend)
    tasks = [
        dask.delayed(bounds_task, pure=True)(
            jobs[k].task_model(), rhos[k], opts, jobs[k].lattice, dask_key_name=f"bounds-{ctx.token}-T{k}"
        )
        for k in todo
    ]
    bar = Progress(len(jobs), "bounds", "temperatures", enabled=ctx.progress)
    bar.update(len(jobs) - len(todo))

    def finished(j, b):
        saved.add(f"T{todo[j]}", b)
        bar.update(1)

    ex.release(ex.compute(tasks, watch=range(len(tasks)), on_result=finished))
    saved.close()
    bar.close()
    if ctx.resumed:
        ctx.tracker.set_tags(
            {"pgmflow.resume.temperatures_saved": len(jobs) - len(todo), "pgmflow.resume.temperatures_run": len(todo)}
        )
    return [saved.done[f"T{k}"] for k in range(len(jobs))]


def _row(job: Temperature, b) -> dict:
    exact, how = job.exact()
    return {
        "T": job.T,
        "beta": 1.0 / job.T,
        "mf": b.mf,
        "bethe": b.bethe,
        "trw": b.trw,
        "exact": exact,
        "exact_source": how,
        "mf_converged": b.mf_converged,
        "bp_converged": b.bp_converged,
        "trw_converged": b.trw_converged,
        "trw_minus_mf": b.trw - b.mf,
        "seconds": b.seconds,
    }


def _result(tracker, rows, n) -> dict:
    """The result dict, with the per-temperature metrics logged at steps 0, 1, ..."""
    result = {"n_nodes": n, "temperatures": [r["T"] for r in rows]}
    for k, r in enumerate(rows):
        sfx = "" if len(rows) == 1 else f"_T{k}"
        for key in ("mf", "bethe", "trw", "trw_minus_mf"):
            result[f"log_z_{key}{sfx}"] = r[key]
            result[f"log_z_{key}_per_site{sfx}"] = r[key] / n
        if r["exact"] is not None:
            result[f"log_z_exact{sfx}"] = r["exact"]
        tracker.log_metrics(
            {f"log_z_{key}_per_site": r[key] / n for key in ("mf", "bethe", "trw")}
            | ({"log_z_exact_per_site": r["exact"] / n} if r["exact"] is not None else {})
            | {"trw_minus_mf_per_site": r["trw_minus_mf"] / n},
            step=k,
        )
    result["objective"] = float(np.mean([r["trw_minus_mf"] / n for r in rows]))  # the bound gap per site
    result["all_converged"] = all(r["mf_converged"] and r["bp_converged"] and r["trw_converged"] for r in rows)
    return result


def _marginals(ctx, plan: BoundsPlan) -> dict:
    """``variational.marginals=true`` on an MRF: bounds on every node's marginal, as a table."""
    v, model = plan.variational, plan.model.temperatures[0].model
    mb = summary.marginal_bounds(
        model,
        damping=v.damping,
        max_iter=v.max_iter,
        tol=v.tol,
        mf_restarts=v.mf_restarts,
        seed=plan.seed,
        n_trees=v.n_trees,
    )
    exact_m = small_exact_marginals(model)
    artifacts.log_table(
        ctx.tracker,
        [
            {
                "node": int(i),
                "lower": float(lo),
                "upper": float(up),
                "exact": "" if exact_m is None else float((1 + exact_m[i]) / 2),
            }
            for i, lo, up in zip(mb.nodes, mb.lower, mb.upper)
        ],
        "tables/marginal_bounds.csv",
    )
    out = {"marginal_width_mean": float(np.mean(mb.upper - mb.lower))}
    if exact_m is not None:
        p = (1 + exact_m) / 2
        out["marginal_bounds_contain_exact"] = bool(np.all((mb.lower <= p + 1e-9) & (p <= mb.upper + 1e-9)))
    return out


def run(ctx, plan: BoundsPlan) -> dict:
    tracker, model, v = ctx.tracker, plan.model, plan.variational
    n = model.n
    datasets.log_input(
        tracker,
        f"{model.name} model",
        datasets.arrays_of([job.model for job in model.temperatures]),
        parameters=model.spec,
        path=model.data_path,
        generator="pgmflow.bounds.models.ising_model",
    )  # MLflow dataset tracking
    ctx.say(f"bounds on {model.name} ({n} nodes, {model.E} edges) at {len(model.temperatures)} temperature(s)")
    res = _solve(ctx, plan)
    rows = [_row(job, b) for job, b in zip(model.temperatures, res)]
    result = _result(tracker, rows, n)
    artifacts.log_table(
        tracker, [{k: ("" if v is None else v) for k, v in r.items()} for r in rows], "tables/bounds.csv"
    )
    cols = ("beta", "mf", "bethe", "trw")  # the stage output (docs/stages.md): log Z bounds per temperature
    artifacts.log_npz(tracker, "bounds.npz", {k: np.array([float(r[k]) for r in rows]) for k in cols})
    if v.marginals and model.node_marginals:
        result.update(_marginals(ctx, plan))
    artifacts.log_results(tracker, result)
    if v.figures and len(rows) > 1:
        fig = figures.bounds_figure(
            [r["beta"] for r in rows],
            {k: [r[k] / n for r in rows] for k in ("mf", "bethe", "trw")},
            [None if r["exact"] is None else r["exact"] / n for r in rows],
            None,
            None,
        )
        artifacts.log_figures(tracker, {"log_z_bounds": fig})
    _print_summary(ctx, rows, n, result["all_converged"])
    return result


def _print_summary(ctx, rows, n, all_converged):
    for r in rows:
        mid = f"exact {r['exact'] / n:.6f} ({r['exact_source']})" if r["exact"] is not None else "log Z"
        ctx.say(
            f"T={r['T']:.6g}: log Z per site: MF {r['mf'] / n:.6f} <= {mid} <= TRW {r['trw'] / n:.6f}; "
            f"Bethe {r['bethe'] / n:.6f}",
            summary=True,
        )
    if not all_converged:
        ctx.say(
            "warning: some message passing did not converge within variational.max_iter; the TRW value "
            "is a bound only at convergence (raise variational.max_iter or variational.damping)"
        )
