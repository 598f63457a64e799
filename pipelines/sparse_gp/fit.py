"""The three fits of the sparse-GP workload: L-BFGS-B on a collapsed bound (SGPR, DTC, FITC) with
one stats pass and one gradient pass over the chunks per evaluation; SVGP by natural-gradient and
Adam steps on minibatches fetched from the chunks; the exact GP in one task."""

from __future__ import annotations

import math
import time

import dask
import numpy as np

from pgmflow.pipelines.core import artifacts
from pgmflow.pipelines.core.errors import ConfigError
from pgmflow.pipelines.core.tracking import QuietTracker
from pgmflow.pipelines.core.progress import Progress
from pgmflow.pipelines.sparse_gp import lbfgsb
from pgmflow.pipelines.sparse_gp.evaluations import EXACT_MAX_N, LOG_BOX, Evaluations, lbfgs_box, restart_params
from pgmflow.tasks.gp import kernels as kern
from pgmflow.tasks.gp import svgp as gsvgp
from pgmflow.tasks.gp.chunks import Predictor, chunk_elbo_task, chunk_rows_task, exact_task

SVGP_BLOCK = 20  # SVGP minibatches fetched per round of chunk tasks


def fit_collapsed(ctx, scfg, method, kernel, refs, data, params0, Z0, tok, backend):
    tracker = ctx.tracker
    opt = bool(scfg["optimize_inducing"])
    m, d = Z0.shape
    max_iter = int(scfg["max_iter"])
    ev = Evaluations(ctx.executor, refs, method, kernel, d, m, Z0, opt, float(scfg["jitter"]),
                     int(scfg["max_tries"]), backend, tok, direct=scfg.get("evaluate", "direct") == "direct")
    theta0 = kern.pack(params0, Z0 if opt else None)
    saved = _resume_state(ctx, ev) if ctx.resumed else None
    if saved is None:
        f0, _ = ev(theta0)
        if not math.isfinite(f0):
            raise ConfigError("sparse_gp.jitter", scfg["jitter"], f"Kuu = K(Z, Z) could not be factored at the "
                              f"initial hyperparameters even with the jitter raised {scfg['max_tries']} times",
                              "raise sparse_gp.jitter or sparse_gp.max_tries, or start from a shorter "
                              "sparse_gp.lengthscale")
        trace = [(0, -f0, ev.records[theta0.tobytes()][3])]
        tracker.log_metrics({"bound": -f0, "jitter": trace[0][2]}, step=0)
    else:
        trace = [tuple(row) for row in saved["trace"].tolist()]
    _note_jitter(ctx.say, ev, scfg)
    bar = Progress(max_iter, f"sparse_gp {method}", "iterations", enabled=ctx.progress)
    bar.update(len(trace) - 1)

    def callback(x, fun):
        rec = ev.records.get(np.asarray(x).tobytes())
        k = len(trace)
        trace.append((k, -float(fun), rec[3] if rec is not None else float("nan")))
        tracker.log_metrics({"bound": -float(fun), "jitter": trace[-1][2]}, step=k)
        bar.update(1, bound=-float(fun))

    t0 = time.monotonic()
    res, saving = _optimise(ctx, scfg, ev, theta0, lbfgs_box(d, m, opt), max_iter, callback, trace, saved)
    seconds = time.monotonic() - t0
    bar.close()
    _note_jitter(ctx.say, ev, scfg)
    _note_direct(ctx, ev)
    x = np.asarray(res.x)
    rec = ev.records.get(x.tobytes())
    if rec is None:  # the answer is the point a resumed run started from: its record again, not counted
        _uncounted(ev, x)
        rec = ev.records.get(x.tobytes())
    if rec is None:
        raise RuntimeError("the bound could not be evaluated at the optimiser's answer")
    params, Z = ev.unpack(x)
    value, st, jit_abs, rel, _, jit0 = rec
    pred = Predictor(method, kernel, params, Z, st, None, jit0, int(scfg["max_tries"]))
    return {"predictor": pred, "trace": trace, "value": value, "iterations": int(res.nit), "evaluations": ev.count,
            "failed_evaluations": ev.failed, "success": bool(res.success), "message": str(res.message),
            "fit_seconds": seconds, "seconds_per_evaluation": ev.seconds / max(ev.count, 1),
            "checkpoint_seconds": saving,
            "jitter_max": max(ev.jitters), "jitter_final": rel, "jitter_abs_final": jit_abs}


def _note_direct(ctx, ev):
    """The tag ``pgmflow.gp.direct_evaluations`` (how many evaluations ran by direct calls to the workers, and how
    many went through the scheduler because a worker was lost or its chunks had moved), and a note when any did."""
    if not ev.direct_count and not ev.fallbacks:
        return
    from pgmflow.pipelines.core.tracking import QuietTracker

    if not isinstance(ctx.tracker, QuietTracker):  # the main fit's (a restart's evaluations are not tagged)
        ctx.tracker.set_tags({"pgmflow.gp.direct_evaluations": f"{ev.direct_count} direct, {ev.fallbacks} through a "
                                                               "graph after a failed direct call"})
    if ev.fallbacks:
        ctx.say(f"note: {ev.fallbacks} evaluation(s) went through the scheduler: a worker was lost or "
                "could not be reached, or held other chunks than expected (the same bits either way)")


CHECKPOINT = "lbfgs"  # checkpoints/lbfgs_0.npz and lbfgs_1.npz, written in turn: the newer readable one counts


def _optimise(ctx, scfg, ev, theta0, box, max_iter, callback, trace, saved):
    """L-BFGS-B from ``theta0``, or continued from ``saved``; its whole state checkpointed every
    ``sparse_gp.checkpoint_every`` iterations (pipelines/sparse_gp/lbfgsb.py). Returns the result and
    the seconds spent writing checkpoints."""
    every = int(scfg.get("checkpoint_every", 1))
    slot = [1 - int(saved["slot"]) if saved is not None else 0]  # the slot not holding the newest checkpoint

    spent = [0.0]

    def checkpoint(nit, state, final=False):
        if every > 0 and (nit % every == 0 or final):
            t0 = time.monotonic()
            artifacts.save_checkpoint(ctx.tracker, f"{CHECKPOINT}_{slot[0]}", {
                **state, "nit": np.int64(nit), "scipy": np.asarray(_scipy_version()),
                "trace": np.asarray(trace, dtype=np.float64), "ev_count": np.int64(ev.count),
                "ev_failed": np.int64(ev.failed), "ev_seconds": np.float64(ev.seconds),
                "ev_jitters": np.asarray(ev.jitters, dtype=np.float64),
                "ev_first_growth": np.asarray(ev.first_growth if ev.first_growth else (-1, np.nan), dtype=np.float64)})
            slot[0] = 1 - slot[0]
            spent[0] += time.monotonic() - t0

    exact = lbfgsb.available()
    if saved is not None and not lbfgsb.continues(saved):
        exact = False  # written by the scipy-driven optimiser of earlier versions (or by the fallback)
    if not exact:
        return _optimise_fresh(ctx, ev, theta0, box, max_iter, callback, trace, saved, checkpoint), spent[0]
    opt = lbfgsb.LBFGSB(ev, theta0, box, max_iter) if saved is None else lbfgsb.LBFGSB.from_state(ev, saved)
    if saved is not None:
        ctx.tracker.set_tags({"pgmflow.gp.resumed_from_iteration": opt.nit})
        ctx.say(f"resuming: L-BFGS-B continues from iteration {opt.nit} ({ev.count} evaluations done)")
    res = opt.run(callback=callback, on_iteration=lambda o: checkpoint(o.nit, o.state(), o.done))
    return res, spent[0]


def _optimise_fresh(ctx, ev, theta0, box, max_iter, callback, trace, saved, checkpoint):
    """Where L-BFGS-B's state cannot be continued (another scipy): ``scipy.optimize.minimize`` from the
    checkpointed point (iteration ``start``) with a fresh memory, for the iterations left; the point
    (not the memory) checkpointed every iteration."""
    import scipy.optimize

    start = len(trace) - 1
    x0 = theta0 if saved is None else np.asarray(saved["x"], dtype=np.float64)
    if saved is not None:
        ctx.tracker.set_tags({"pgmflow.gp.resumed_from_iteration": start, "pgmflow.gp.resume_exact": "false"})
        ctx.say(f"note: this scipy's L-BFGS-B cannot be continued exactly; restarting it from iteration {start}'s "
                "point with a fresh memory (the result may move slightly)")
    it = [start]

    def record(intermediate_result):  # scipy passes its OptimizeResult to a parameter of this name
        it[0] += 1
        callback(intermediate_result.x, intermediate_result.fun)
        checkpoint(it[0], {"x": np.asarray(intermediate_result.x, dtype=np.float64)}, it[0] >= max_iter)

    if start >= max_iter:
        return lbfgsb.Result(x0, float("nan"), start, 0, False, "STOP: TOTAL NO. OF ITERATIONS REACHED LIMIT")
    res = scipy.optimize.minimize(ev, x0, jac=True, method="L-BFGS-B", bounds=box, callback=record,
                                  options={"maxiter": max_iter - start})
    return lbfgsb.Result(res.x, float(res.fun), start + int(res.nit), int(res.nfev), bool(res.success),
                         str(res.message))


def _scipy_version() -> str:
    import scipy

    return str(scipy.__version__)


def _resume_state(ctx, ev) -> dict | None:
    """The newest readable L-BFGS-B checkpoint of the run (its slot as ``slot``; the Evaluations
    counters restored from it), or None."""
    best = None
    try:
        names = [n for n in ctx.tracker.list_artifacts(artifacts.CHECKPOINT_DIR) if f"/{CHECKPOINT}_" in f"/{n}"]
    except Exception:
        names = []
    for name in names:
        try:
            with np.load(ctx.tracker.download(name), allow_pickle=False) as z:
                state = {k: z[k] for k in z.files}
            state["slot"] = int(name.rsplit("_", 1)[1].split(".")[0])
        except Exception:
            continue  # cut short by the interruption
        if best is None or int(state["nit"]) > int(best["nit"]):
            best = state
    if best is None:
        return None
    ev.count, ev.failed, ev.seconds = int(best["ev_count"]), int(best["ev_failed"]), float(best.get("ev_seconds", 0.0))
    ev.jitters = [float(v) for v in best["ev_jitters"]]
    k, rel = (float(v) for v in best["ev_first_growth"])
    ev.first_growth = None if k < 0 else (int(k), rel)
    return best


def fit_restarts(ctx, scfg, method, kernel, refs, data, fit0, Z0, pool_std, seed, tok, backend) -> dict:
    """``sparse_gp.restarts`` more fits from seeded starting points (:func:`restart_params`), one after
    the other on the same chunks; the fit with the highest bound is kept (the first on a tie). Every
    restart's bound is the metric ``restart_bound`` at step r (r = 0: the configured start)."""
    import dataclasses

    n = int(scfg.get("restarts", 0))
    fits = [fit0]
    ctx.tracker.log_metrics({"restart_bound": fit0["value"]}, step=0)
    for r in range(1, n + 1):
        quiet = dataclasses.replace(ctx, tracker=QuietTracker(ctx.tracker, f"r{r}"), resumed=False)
        params = restart_params(scfg, pool_std, seed, r)
        try:
            f = fit_collapsed(quiet, {**scfg, "checkpoint_every": 0}, method, kernel, refs, data, params, Z0,
                              f"{tok}r{r}", backend)
        except ConfigError:  # Kuu would not factor at this start: the restart is skipped
            ctx.say(f"restart {r}: Kuu could not be factored at its starting point; skipped")
            continue
        ctx.tracker.log_metrics({"restart_bound": f["value"]}, step=r)
        fits.append(f | {"restart": r})
    best = max(range(len(fits)), key=lambda i: (fits[i]["value"], -i))
    out = dict(fits[best])
    out["restart_bounds"] = [float(f["value"]) for f in fits]
    out["best_restart"] = int(fits[best].get("restart", 0))
    out["checkpoint_seconds"] = fit0.get("checkpoint_seconds", 0.0)  # restarts write none
    ctx.say(f"{n} restart(s): bounds {', '.join(f'{v:.6g}' for v in out['restart_bounds'])}; kept restart "
            f"{out['best_restart']} (bound {out['value']:.6g})")
    return out


def _uncounted(ev, x):
    """Evaluate ``x`` for its record only: the counters stay as they are."""
    count, failed, jitters, seconds, growth = ev.count, ev.failed, list(ev.jitters), ev.seconds, ev.first_growth
    ev(x)
    ev.count, ev.failed, ev.jitters, ev.seconds, ev.first_growth = count, failed, jitters, seconds, growth


def _note_jitter(say, ev, scfg):
    if ev.first_growth is not None and not getattr(ev, "_noted", False):
        ev._noted = True
        k, rel = ev.first_growth
        say(f"note: a Cholesky factorisation (Kuu = K(Z, Z) + jitter s I, or I + A A') failed with the "
              f"jitter {float(scfg['jitter']):.3g} x s at evaluation {k}; retried with a tenfold larger jitter each "
              f"time, it succeeded with {rel:.3g} x s (every iteration's jitter is the metric 'jitter', the largest "
              "'final_jitter_max')")


def fit_svgp(ctx, scfg, kernel, refs, train_counts, data, params0, Z0, seed, tok):
    tracker, ex = ctx.tracker, ctx.executor
    opt = bool(scfg["optimize_inducing"])
    m, d = Z0.shape
    n = int(train_counts.sum())
    steps = int(scfg["svgp_steps"])
    bs = min(int(scfg["svgp_batch_size"]), n)
    rho, lr = float(scfg["svgp_rho"]), float(scfg["svgp_lr"])
    every = int(scfg["svgp_eval_every"])
    jitter = float(scfg["jitter"])
    offsets = np.concatenate([[0], np.cumsum(train_counts)])
    state = gsvgp.svgp_init(m)
    theta = kern.pack(params0, Z0 if opt else None)
    adam = gsvgp.adam_init(theta)
    lo_box, hi_box = LOG_BOX

    def unpack(th):
        p, Z = kern.unpack(th, d, m if opt else 0)
        return p, (Z0 if Z is None else Z)

    def full_elbo(params, Z, state, k):
        return _full_elbo(ex, tok, kernel, params, Z, state, refs, jitter, k)

    trace, mb_trace = [], []
    params, Z = unpack(theta)
    v0 = full_elbo(params, Z, state, 0)
    trace.append((0, v0))
    tracker.log_metrics({"bound": v0}, step=0)
    bar = Progress(steps, "sparse_gp svgp", "steps", enabled=ctx.progress)
    t0 = time.monotonic()
    for s0 in range(0, steps, SVGP_BLOCK):
        block = list(range(s0, min(steps, s0 + SVGP_BLOCK)))
        got = _fetch_minibatches(ex, tok, refs, offsets, [gsvgp.minibatch_indices(seed, t, n, bs) for t in block], s0)
        for k, t in enumerate(block):
            Xb = np.concatenate([g[k][0] for g in got])
            yb = np.concatenate([g[k][1] for g in got])
            params, Z = unpack(theta)
            try:
                state = gsvgp.natgrad_step(kernel, params, Z, state, Xb, yb, n, rho, jitter)
                elbo, dparams, dZ = gsvgp.svgp_elbo_and_grad(kernel, params, Z, state, Xb, yb, n, jitter)
            except kern.CholeskyError as exc:
                raise RuntimeError(f"SVGP step {t}: {exc}; fix: lower sparse_gp.svgp_lr or sparse_gp.svgp_rho, or "
                                   "raise sparse_gp.jitter") from None
            adam, step = gsvgp.adam_update(adam, -kern.pack(dparams, dZ if opt else None), lr=lr)
            theta = theta + step
            theta[:d + 2] = np.clip(theta[:d + 2], lo_box, hi_box)
            mb_trace.append((t + 1, elbo))
            tracker.log_metrics({"elbo_minibatch": elbo}, step=t + 1)
            if (t + 1) % every == 0 or t + 1 == steps:
                params, Z = unpack(theta)
                v = full_elbo(params, Z, state, t + 1)
                trace.append((t + 1, v))
                tracker.log_metrics({"bound": v}, step=t + 1)
            bar.update(1, elbo=elbo)
    seconds = time.monotonic() - t0
    bar.close()
    params, Z = unpack(theta)
    pred = Predictor("svgp", kernel, params, Z, None, state, jitter, int(scfg["max_tries"]))
    _, jit_abs = kern.inducing_cholesky(kernel, params, Z, jitter, int(scfg["max_tries"]))
    rel = jit_abs / params.variance
    return {"predictor": pred, "trace": [(k, v, float("nan")) for k, v in trace], "minibatch_trace": mb_trace,
            "value": trace[-1][1], "iterations": steps, "evaluations": steps, "failed_evaluations": 0,
            "success": True, "message": f"{steps} SVGP steps", "fit_seconds": seconds,
            "seconds_per_evaluation": seconds / max(steps, 1), "jitter_max": rel, "jitter_final": rel,
            "jitter_abs_final": jit_abs}


def _full_elbo(ex, tok, kernel, params, Z, state, refs, jitter, k) -> float:
    """The SVGP ELBO over every chunk's training rows (chunk order)."""
    outs = [dask.delayed(chunk_elbo_task, pure=True)(kernel, params, Z, state, ref, jitter,
                                                    dask_key_name=f"gp-elbo-{tok}-s{k}-c{c}")
            for c, ref in enumerate(refs)]
    parts = ex.gather_ordered(outs, release=True)
    kl = -gsvgp.svgp_elbo(kernel, params, Z, state, Z[:1], np.zeros(1), 0, jitter)  # n = 0: the KL alone
    total = 0.0
    for v, rows in parts:  # chunk order; each chunk's ELBO counts the KL once
        if rows:
            total += v + kl
    return total - kl


def _fetch_minibatches(ex, tok, refs, offsets, idx, s0) -> list:
    """The rows of the minibatches ``idx`` (global training-row indices), one task per chunk that
    holds some: per such chunk (in chunk order), a list of ``(X, y)`` per minibatch."""
    outs = []
    for c, ref in enumerate(refs):
        a, b = offsets[c], offsets[c + 1]
        sel = [i[(i >= a) & (i < b)] - a for i in idx]
        if any(s.size for s in sel):
            outs.append(dask.delayed(chunk_rows_task, pure=True)(ref, sel, dask_key_name=f"gp-rows-{tok}-s{s0}-c{c}"))
    return ex.gather_ordered(outs, release=True)


def fit_exact(ctx, scfg, kernel, refs, data, params0, Xslice, tok):
    ex = ctx.executor
    if data.n_train > EXACT_MAX_N:  # preflight refuses this too
        raise ConfigError("sparse_gp.method", "exact", f"the exact GP factors an n x n matrix; n = {data.n_train} "
                          f"training rows is more than {EXACT_MAX_N}", "use sparse_gp.method=sgpr")
    t0 = time.monotonic()
    out = ex.gather_ordered([dask.delayed(exact_task, pure=True)(
        kernel, params0, int(scfg["max_iter"]), list(refs), data.standardizer, Xslice,
        dask_key_name=f"gp-exact-{tok}")], release=True)[0]
    seconds = time.monotonic() - t0
    fit = out["fit"]
    trace = [(0, out["lml0"], 0.0), (max(int(fit.n_iter), 1), float(fit.lml), 0.0)]
    for k, v, _ in trace:
        ctx.tracker.log_metrics({"bound": v}, step=k)
    pred = Predictor("exact", kernel, fit.params, None, None, None, 0.0, 0)
    return {"predictor": pred, "trace": trace, "value": float(fit.lml), "iterations": int(fit.n_iter),
            "evaluations": int(fit.n_iter), "failed_evaluations": 0, "success": bool(fit.success),
            "message": "exact GP (pgmflow.tasks.gp.exact.fit)", "fit_seconds": seconds,
            "seconds_per_evaluation": float("nan"), "jitter_max": 0.0, "jitter_final": 0.0, "jitter_abs_final": 0.0,
            "sums": out["sums"], "slice": out["slice"], "X": out["X"], "y": out["y"]}
