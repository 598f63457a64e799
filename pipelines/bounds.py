"""Variational bounds on log Z: naive mean field (lower), loopy BP (Bethe), TRW (upper).

Two entry points share the farming (one task per temperature):

* ``pgmflow pipeline=bounds`` runs the bounds alone on a model: the Ising model of
  ``model=ising`` at ``variational.temperatures`` (default: ``model.T``), or any pairwise binary
  MRF from a file (``model=mrf model.path=FILE.npz`` with a symmetric coupling matrix ``J``,
  optional fields ``h`` and edge appearance probabilities ``rho``), with bounds on every node's
  marginal when ``variational.marginals=true``.
* ``pgmflow pipeline=tempering bounds=true`` computes them at every temperature of the tempering
  ladder, beside the tempering estimate of log Z there (:func:`tempering_bounds`).
"""

from __future__ import annotations

import io
import math

import dask
import numpy as np

from pipelines.errors import ConfigError
from tasks.bounds import mrf as _mrf
from tasks.bounds import summary, trw


def ising_model(target, b: float = 1.0) -> _mrf.PairwiseMRF:
    """The tempering target at ladder level ``b`` (inverse temperature ``b * beta_model``) as an MRF."""
    return _mrf.ising_lattice(target.L, J=target.J_abs, h=target.h, beta=b * target.beta_model,
                              bonds_h=target.bonds_h, bonds_v=target.bonds_v)


def ising_rho(target, model: _mrf.PairwiseMRF, vcfg: dict):
    """TRW's rho for the periodic lattice: "uniform", (n-1)/E, for sides >= 3 (see trw.lattice_rho),
    else from random spanning trees."""
    if target.L >= 3 and vcfg.get("rho", "auto") in ("auto", "uniform"):
        return "uniform"
    return trw.spanning_tree_rho(model, n_trees=int(vcfg["n_trees"]), seed=0)


def _settings(vcfg: dict, backend: str = "numpy") -> dict:
    return dict(damping=float(vcfg["damping"]), max_iter=int(vcfg["max_iter"]), tol=float(vcfg["tol"]),
                mf_restarts=int(vcfg["mf_restarts"]), backend=backend)


def _lattice_of(target):
    return (target.L, target.L, True) if target.L >= 3 else None


def bounds_task(model, rho, settings: dict, lattice=None) -> summary.Bounds:
    """One temperature: MF, BP and TRW (what a Dask task runs). ``model`` is a PairwiseMRF or
    ``(target, b)``, an Ising target at ladder level b, built here on the worker (the graph then
    carries the lattice's bond signs, not its edge arrays); ``rho`` an array [E] or the string
    "uniform" for ``(n - 1) / E``."""
    if not isinstance(model, _mrf.PairwiseMRF):  # (target, b)
        model = ising_model(*model)
    if isinstance(rho, str):
        rho = np.full(model.E, (model.n - 1) / model.E)
    return summary.compute_bounds(model, rho, lattice=lattice, **settings)


def load_mrf(mcfg: dict) -> tuple[_mrf.PairwiseMRF, np.ndarray | None]:
    """``model=mrf``: the model and TRW's rho from ``model.path`` (ConfigError on any problem)."""
    from pathlib import Path

    path = mcfg.get("path")
    if not path:
        raise ConfigError("model.path", path, "model=mrf needs a file with the couplings",
                          "pass model.path=FILE.npz holding J [n, n] (and optionally h [n], rho)")
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise ConfigError("model.path", str(path), "no such file", "check the path")
    try:
        z = np.load(p, allow_pickle=False)
        arrays = {k: z[k] for k in z.files} if hasattr(z, "files") else {"J": np.asarray(z)}
    except Exception as exc:
        raise ConfigError("model.path", str(path), f"cannot read it as .npz/.npy ({type(exc).__name__})",
                          "save the couplings with numpy.savez(path, J=..., h=...)") from None
    if "J" not in arrays:
        raise ConfigError("model.path", str(path), f"has no array 'J' (found: {', '.join(arrays) or 'none'})",
                          "save the coupling matrix under the name J")
    beta = float(mcfg.get("beta", 1.0))
    try:
        model = _mrf.from_dense(beta * np.asarray(arrays["J"], dtype=np.float64),
                                None if "h" not in arrays else beta * np.asarray(arrays["h"], dtype=np.float64))
    except _mrf.MRFError as exc:
        raise ConfigError("model.path", str(path), f"{exc.what} {exc.problem}", exc.fix) from None
    rho = None
    if "rho" in arrays:
        r = np.asarray(arrays["rho"], dtype=np.float64)
        if r.ndim == 2:  # a symmetric [n, n] matrix of edge probabilities
            if r.shape != (model.n, model.n):
                raise ConfigError("model.path", str(path), f"rho has shape {r.shape}, the couplings need "
                                  f"({model.n}, {model.n}) or ({model.E},)", "save one probability per edge")
            r = r[model.edges[:, 0], model.edges[:, 1]]
        try:
            trw.check_rho(model, r)
        except _mrf.MRFError as exc:
            raise ConfigError("model.path", str(path), f"rho: {exc.problem}", exc.fix) from None
        rho = r
    return model, rho


def _csv(rows) -> str:
    out = io.StringIO()
    keys = list(rows[0])
    out.write(",".join(keys) + "\n")
    for r in rows:
        out.write(",".join(f"{r[k]:.10g}" if isinstance(r[k], float) else str(r[k]) for k in keys) + "\n")
    return out.getvalue()


def run(ctx) -> dict:
    """``pipeline=bounds``: the three methods at each temperature, one task per temperature."""
    from pipelines import figures, preflight
    from pipelines.progress import Progress

    cfg = ctx.cfg
    vcfg, mcfg = cfg["variational"], cfg["model"]
    tracker, ex = ctx.tracker, ctx.executor
    tok = tracker.run_id[:12]
    settings = _settings(vcfg, ctx.backend)
    rows = []
    if mcfg["name"] == "ising":
        temps = [float(t) for t in (vcfg.get("temperatures") or [mcfg["T"]])]
        jobs = []
        for T in temps:
            target = preflight.build_target({**mcfg, "T": T})
            model = ising_model(target)
            rho = ising_rho(target, model, vcfg)
            jobs.append((T, target, model, rho if isinstance(rho, str) else ex.scatter(rho), _lattice_of(target)))
    else:
        model, rho = load_mrf(mcfg)
        if rho is None:
            rho = trw.spanning_tree_rho(model, n_trees=int(vcfg["n_trees"]), seed=int(cfg["seed"]))
        jobs = [(1.0 / float(mcfg.get("beta", 1.0)), None, model, rho, None)]
    n = jobs[0][2].n
    print(f"pgmflow: bounds on {mcfg['name']} ({n} nodes, {jobs[0][2].E} edges) at {len(jobs)} temperature(s)",
          flush=True)
    tasks = [dask.delayed(bounds_task, pure=True)((tg, 1.0) if tg is not None else m, r, settings, lat,
                                                  dask_key_name=f"bounds-{tok}-T{k}")
             for k, (_, tg, m, r, lat) in enumerate(jobs)]
    bar = Progress(len(tasks), "bounds", "temperatures", enabled=ctx.progress)
    res = ex.gather(ex.compute(tasks, watch=range(len(tasks)), on_done=lambda i: bar.update(1)))
    bar.close()
    from pipelines.tempering import reference_log_z

    for (T, target, model, _, _), b in zip(jobs, res):
        exact, how = (reference_log_z(target) if target is not None else (_small_exact(model), "enumeration"))
        row = {"T": T, "beta": 1.0 / T, "mf": b.mf, "bethe": b.bethe, "trw": b.trw, "exact": exact, "exact_source": how,
               "mf_converged": b.mf_converged, "bp_converged": b.bp_converged, "trw_converged": b.trw_converged,
               "trw_minus_mf": b.trw - b.mf, "seconds": b.seconds}
        rows.append(row)
    result = {"n_nodes": n, "temperatures": [r["T"] for r in rows]}
    for k, r in enumerate(rows):
        sfx = "" if len(rows) == 1 else f"_T{k}"
        for key in ("mf", "bethe", "trw", "trw_minus_mf"):
            result[f"log_z_{key}{sfx}"] = r[key]
            result[f"log_z_{key}_per_site{sfx}"] = r[key] / n
        if r["exact"] is not None:
            result[f"log_z_exact{sfx}"] = r["exact"]
        tracker.log_metrics({f"log_z_{key}_per_site": r[key] / n for key in ("mf", "bethe", "trw")}
                            | ({"log_z_exact_per_site": r["exact"] / n} if r["exact"] is not None else {})
                            | {"trw_minus_mf_per_site": r["trw_minus_mf"] / n}, step=k)
    result["objective"] = float(np.mean([r["trw_minus_mf"] / n for r in rows]))  # the bound gap per site
    result["all_converged"] = all(r["mf_converged"] and r["bp_converged"] and r["trw_converged"] for r in rows)
    tracker.log_text(_csv([{k: ("" if v is None else v) for k, v in r.items()} for r in rows]), "tables/bounds.csv")
    if vcfg.get("marginals") and mcfg["name"] == "mrf":
        model = jobs[0][2]
        mb = summary.marginal_bounds(model, damping=settings["damping"], max_iter=settings["max_iter"],
                                     tol=settings["tol"], mf_restarts=settings["mf_restarts"], seed=int(cfg["seed"]),
                                     n_trees=int(vcfg["n_trees"]))
        exact_m = _small_exact_marginals(model)
        mrows = [{"node": int(i), "lower": float(lo), "upper": float(up),
                  "exact": "" if exact_m is None else float((1 + exact_m[i]) / 2)}
                 for i, lo, up in zip(mb.nodes, mb.lower, mb.upper)]
        tracker.log_text(_csv(mrows), "tables/marginal_bounds.csv")
        result["marginal_width_mean"] = float(np.mean(mb.upper - mb.lower))
        if exact_m is not None:
            p = (1 + exact_m) / 2
            result["marginal_bounds_contain_exact"] = bool(np.all((mb.lower <= p + 1e-9) & (p <= mb.upper + 1e-9)))
    tracker.log_dict(result, "results.json")
    if cfg["variational"].get("figures", True) and len(rows) > 1:
        fig = figures.bounds_figure([r["beta"] for r in rows], {k: [r[k] / n for r in rows] for k in
                                    ("mf", "bethe", "trw")},
                                    [None if r["exact"] is None else r["exact"] / n for r in rows], None, None)
        tracker.log_figure(fig, "figures/log_z_bounds.png")
        figures.close(fig)
    for r in rows:
        mid = f"exact {r['exact'] / n:.6f} ({r['exact_source']})" if r["exact"] is not None else "log Z"
        print(f"pgmflow: T={r['T']:.6g}: log Z per site: MF {r['mf'] / n:.6f} <= {mid} <= TRW {r['trw'] / n:.6f}; "
              f"Bethe {r['bethe'] / n:.6f}", flush=True)
    if not result["all_converged"]:
        print("pgmflow: warning: some message passing did not converge within variational.max_iter; the TRW value "
              "is a bound only at convergence (raise variational.max_iter or variational.damping)", flush=True)
    return result


def _small_exact(model):
    if model.n <= 20:
        from tasks.bounds import exact

        return float(exact.log_z_enumeration(model))
    return None


def _small_exact_marginals(model):
    if model.n <= 20:
        from tasks.bounds import exact

        return np.asarray(exact.exact_marginals(model).mean)
    return None


def tempering_bounds(ctx, target, betas_per_chain, traces, group: int) -> dict:
    """``bounds=true`` in the tempering pipeline: MF, Bethe and TRW at every level of chain 0's ladder
    (one task per level), beside the tempering estimate of log Z there.

    The tempering estimate at level k is ``log Z_ref + stepping stone over levels 0..k`` of each
    chain (the cumulative sum of the ladder's ratio estimates), with its standard error.
    Returns the rows and the figure's data; the caller logs them.
    """
    from tasks.tempering import estimators

    if target.kind != "ising":
        raise ConfigError("bounds", True, "variational bounds are for binary pairwise models",
                          "use model=ising with bounds=true (or drop bounds=true)")
    vcfg = ctx.cfg["variational"]
    settings = _settings(vcfg, ctx.backend)
    ex = ctx.executor
    tok = ctx.tracker.run_id[:12]
    b = np.asarray(betas_per_chain[0], dtype=np.float64)
    rho = ising_rho(target, ising_model(target, float(b[-1])), vcfg)
    rho = rho if isinstance(rho, str) else ex.scatter(rho)
    lat = _lattice_of(target)
    tasks = [dask.delayed(bounds_task, pure=True)((target, float(bk)), rho, settings, lat,
                                                  dask_key_name=f"bounds-{tok}-g{group}-k{k}")
             for k, bk in enumerate(b)]
    res = ex.gather(ex.compute(tasks))
    n = target.n_sites
    ll = traces[0].loglik.T  # [K, T] chain 0
    est, se = [target.log_z_reference], [0.0]
    for k in range(1, b.size):
        e = estimators.stepping_stone_joint(b[:k + 1], ll[:k + 1])
        est.append(target.log_z_reference + float(e.estimate))
        se.append(float(e.se))
    rows = []
    for k in range(b.size):
        beta = float(b[k] * target.beta_model)
        r = res[k]
        lo_ok = r.mf <= est[k] + 2 * se[k]
        up_ok = est[k] - 2 * se[k] <= r.trw
        rows.append({"level": k, "b": float(b[k]), "beta": beta, "T": (1.0 / beta) if beta > 0 else math.inf,
                     "mf_per_site": r.mf / n, "bethe_per_site": r.bethe / n, "trw_per_site": r.trw / n,
                     "tempering_per_site": est[k] / n, "tempering_se_per_site": se[k] / n,
                     "gap_tempering_minus_mf": (est[k] - r.mf) / n, "gap_trw_minus_tempering": (r.trw - est[k]) / n,
                     "order_holds_2se": bool(lo_ok and up_ok),
                     "converged": bool(r.mf_converged and r.bp_converged and r.trw_converged)})
    return {"rows": rows, "n": n}
