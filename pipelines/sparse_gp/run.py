"""Inducing-point GP regression: statistics summed over data chunks held by the workers.

The data ``X`` [n, d], ``y`` [n] is cut into chunks of ``sparse_gp.chunk_size`` rows (the chunks
depend on that alone). In-memory data (synthetic, CSV, .npz) is standardised on the driver and each
chunk is put on the cluster once (``Executor.scatter``, with lineage); later tasks take its future.
An ``.npy`` file is never loaded whole: a chunk task receives ``FileRows`` (the path and a row
range, a few hundred bytes) and reads its rows from the memory-mapped file, so a worker's memory is
bounded by the chunk size. Each row is a training or a held-out row by a hash of its index
(``pgmflow.tasks.gp.data.heldout_rows``), whatever the chunking.

SGPR, DTC, FITC (``sparse_gp.method``): L-BFGS-B on the driver (``scipy.optimize.minimize``,
``jac=True``) over the log hyperparameters and, with ``optimize_inducing``, the inducing inputs ``Z``.
One function evaluation::

    driver: theta --> chunk_stats(chunk c) for every c                 one task per chunk
    driver: sum the statistics in chunk order; bounds.objective (m x m algebra) -> value, adjoints
    driver: adjoints (m x m) onto the cluster once --> chunk_grad(chunk c) for every c
    driver: sum the gradients in chunk order; bounds.finish_grad -> the gradient

SVGP: minibatch ``t`` holds the training rows ``pgmflow.tasks.gp.svgp.minibatch_indices(seed, t, ...)``; one
task per chunk returns its rows of a block of minibatches, and the driver takes a natural-gradient
step of ``q(u)`` and an Adam step of the hyperparameters per minibatch. The full-data ELBO is a
chunked pass every ``svgp_eval_every`` steps. Exact GP: one task fits ``pgmflow.tasks.gp.exact.fit`` on the
training rows (at most ``EXACT_MAX_N``) and predicts the held-out rows.

Test RMSE and NLPD are a chunked pass too (per-chunk sums, added in chunk order), in original units.
Every sum runs in chunk order and every random number comes from ``pgmflow.tasks.rng`` with ``STAGE_GP`` and
an identity (inducing-input subsample, k-means++, minibatch step), so the results are bit-identical
on any number of workers. With ``backend=cupy`` the chunk statistics and gradients are computed on
CuPy arrays (the chunk is moved to the GPU inside the task; the sums come back as NumPy).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
import time
from typing import NamedTuple

import dask
import numpy as np

from pgmflow.core import artifacts
from pgmflow.core.graph import Executor
from pgmflow.sparse_gp import data as gp_data
from pgmflow.sparse_gp import kernel_config as kc
from pgmflow.sparse_gp import model as gp_model
from pgmflow.sparse_gp.evaluations import Chunks, chunk_ranges, chunk_refs, inducing_pool, initial_inducing
from pgmflow.sparse_gp.fit import FitResult, fit_collapsed, fit_exact, fit_restarts, fit_svgp, initial_params
from pgmflow.sparse_gp.plan import Plan
from pgmflow.tasks.gp import likelihoods as glik
from pgmflow.tasks.gp import stats as gstats
from pgmflow.tasks.gp.chunks import Chunk, chunk_test_task, predict_f

SLICE_POINTS = 200


# auto: data of at most this many rows x inducing inputs are fitted in the driver's process, without
# a round trip to the workers per evaluation (benchmarks/results/issue21-sparse-gp-in-process-*.md:
# the crossover of the two paths on 2 workers)
IN_PROCESS_MAX_WORK = 2_000_000


class Slice(NamedTuple):
    """The slice figure's points: input ``j`` over ``xs`` [P] (original units, its training range and 5 %
    beyond), the others at their training medians ``median`` [d]; ``grid`` [P, d]: the same points
    standardised; ``mean``, ``var`` [P]: the latent f there (standardised units)."""

    j: int
    xs: np.ndarray
    grid: np.ndarray
    median: np.ndarray
    mean: np.ndarray | None = None
    var: np.ndarray | None = None


class Scores(NamedTuple):
    """The test pass, in original units: RMSE and mean NLPD over ``n_test`` scored rows (NaN without any),
    and the run's seconds from the chunks' placement to the end of the test pass."""

    rmse: float
    nlpd: float
    n_test: int
    seconds: float
    likelihood: dict | None = None  # a non-Gaussian likelihood's held-out metrics (likelihoods.test_metrics)
    reliability: np.ndarray | None = None  # Bernoulli: [3, bins] rows, summed probabilities, positives per bin


def in_process(plan: Plan) -> bool:
    """Whether the fit runs in the driver: ``sparse_gp.in_process`` true/false, or auto: in-memory
    data whose rows x m is at most :data:`IN_PROCESS_MAX_WORK`. The bits are the same either way (the
    same chunks, summed in the same order, with one BLAS thread everywhere)."""
    data = plan.data
    if plan.in_process in (True, False):
        return bool(plan.in_process) and not data.memmap
    return not data.memmap and data.n * max(plan.m, 1) <= IN_PROCESS_MAX_WORK


def work_seconds(plan: Plan) -> float | None:
    """Rough single-core seconds of the fit (``pgmflow.core.smallwork``), when it runs in the driver anyway
    (:func:`in_process`; None otherwise: the workers do it): per objective evaluation ~n m^2 (exact: n^3 / 3)
    multiply-adds at ~1 GFLOP/s, times the iteration cap (SVGP: steps of a minibatch) and the restarts."""
    if not in_process(plan):
        return None
    n, m = plan.data.n, max(plan.m, 1)
    if plan.method == "svgp":
        flops = plan.svgp.steps * min(plan.svgp.batch_size, n) * m * m
    elif plan.method == "exact":
        flops = plan.fit.max_iter * n**3 / 3
    else:
        flops = plan.fit.max_iter * n * m * m
    return (1 + plan.fit.restarts) * flops * 1e-9


def _describe(ctx, plan: Plan, n_chunks: int, access: str):
    """The run's opening lines: the data, a chunk size the data overrides (said, not silent), the method."""
    data, chunk_size, m = plan.data, plan.chunk_size, plan.m
    ctx.say(gp_data.describe(data))
    if chunk_size > data.n:
        ctx.say(f"sparse_gp.chunk_size={chunk_size} is more than the {data.n} rows: one chunk of {data.n} rows is used")
    ctx.say(
        f"method {plan.method}, kernel {plan.kernel}"
        + (f", m={m} inducing inputs" if plan.method != "exact" else "")
        + f"; {n_chunks} chunk(s) of <= {chunk_size} rows ({access.split(':')[0]}); backend {ctx.backend}"
    )


def run(ctx, plan: Plan) -> dict:
    data, method, kernel, m, chunk_size = plan.data, plan.method, plan.kernel, plan.m, plan.chunk_size
    if in_process(plan) and ctx.executor.distributed:
        ctx = dataclasses.replace(ctx, executor=Executor(None))
        ctx.say(
            f"small data ({data.n} rows x m={m}): fitted in this process, no round trip to the "
            "workers per evaluation (sparse_gp.in_process=false to use them)"
        )
    tracker, ex = ctx.tracker, ctx.executor
    n_chunks = len(chunk_ranges(data, chunk_size))
    access = (
        f"memmap: each chunk task reads its rows of {data.path}"
        if data.memmap
        else "scattered: each chunk put on the cluster once"
    )
    _describe(ctx, plan, n_chunks, access)
    tracker.set_tags(
        {
            "pgmflow.gp.method": method,
            "pgmflow.gp.kernel": str(kernel)[:250],
            "pgmflow.gp.source": data.source[:250],
            "pgmflow.gp.data_access": access[:250],
            "pgmflow.gp.backend": ctx.backend,
        }
    )
    gp_model.log_inputs(ctx, plan)  # MLflow dataset tracking: the training and test rows, with digests
    t_start = time.monotonic()
    refs, train_counts = chunk_refs(ex, data, chunk_size, plan.seed, plan.test_fraction)
    chunks = Chunks(ex, refs, train_counts, ctx.token, ctx.backend)
    ref_bytes = max(len(pickle.dumps(r)) for r in refs) if data.memmap else 0
    tracker.log_metrics(
        {
            "rows": data.n,
            "inputs": data.d,
            "train_rows": data.n_train,
            "test_rows": data.n_test,
            "chunks": n_chunks,
            **({"chunk_ref_bytes": ref_bytes} if data.memmap else {}),
        },
        step=0,
    )

    std = data.standardizer
    pool = inducing_pool(data, plan.seed, plan.test_fraction, plan.kmeans_points)
    median = np.median(pool, axis=0)
    lo, hi = pool.min(axis=0), pool.max(axis=0)
    params0 = (
        initial_params(plan.start, data.d) if plan.kernel_setup is None else plan.kernel_setup.params0(plan.start.noise)
    )
    Z0 = (
        None
        if method == "exact"
        else initial_inducing(std.apply_X(pool), m, plan.seed, plan.kmeans_iter, plan.kmeans_points)
    )

    if method in gstats.METHODS:
        fit = fit_collapsed(ctx, plan, chunks, params0, Z0)
        if plan.fit.restarts:
            fit = fit_restarts(ctx, plan, chunks, fit, Z0, std.apply_X(pool))
    elif method == "svgp":
        fit = fit_svgp(ctx, plan, chunks, params0, Z0)
    j_slice = plan.slice_dim
    if method == "exact":
        dims = [j_slice] if j_slice is not None else list(range(min(data.d, 50)))
        slices = {j: _slice(data, median, lo, hi, j) for j in dims}  # every candidate: the fit picks one
        fit = fit_exact(ctx, plan, chunks, params0, np.concatenate([slices[j].grid for j in dims]))
        if j_slice is None:
            j_slice = dims[_shortest(plan, fit.predictor.params, dims)]
        k = dims.index(j_slice)
        mean, var = fit.exact.slice
        sl = slices[j_slice]._replace(
            mean=mean[k * SLICE_POINTS : (k + 1) * SLICE_POINTS], var=var[k * SLICE_POINTS : (k + 1) * SLICE_POINTS]
        )
        sums = fit.exact.sums
    else:
        if j_slice is None:
            j_slice = _shortest(plan, fit.predictor.params, list(range(data.d)))
        sl = _slice(data, median, lo, hi, j_slice)
        h_pred = ex.scatter(fit.predictor)  # summed statistics (m x m) or q(u): to the cluster once
        scored = list(refs) + _test_file_refs(ex, plan)
        outs = [
            dask.delayed(chunk_test_task, pure=True)(h_pred, ref, std, dask_key_name=f"gp-test-{ctx.token}-c{c}")
            for c, ref in enumerate(scored)
        ]
        sums = ex.gather_ordered(outs, release=True)
        ex.release([h_pred])
        sl = sl._replace(**dict(zip(("mean", "var"), predict_f(fit.predictor, sl.grid))))
    seconds = time.monotonic() - t_start
    n_test = sum(s[0] for s in sums)
    sse = 0.0
    nlpd = 0.0
    for s in sums:  # chunk order
        sse += s[1]
        nlpd += s[2]
    rmse = math.sqrt(sse / n_test) if n_test else float("nan")  # no held-out rows: nothing to score
    mean_nlpd = nlpd / n_test if n_test else float("nan")
    scores = Scores(rmse, mean_nlpd, n_test, seconds)
    if not plan.likelihood.conjugate:
        scores = _likelihood_scores(plan.likelihood, sums, scores)
    return finish(ctx, plan, fit, scores, sl)


def _likelihood_scores(lik, sums, scores: Scores) -> Scores:
    """A non-Gaussian likelihood's held-out metrics from the chunks' ``likelihoods.test_sums`` (chunk order),
    and a Bernoulli's reliability-diagram counts."""
    total = [0, 0.0, 0.0, 0.0]
    rel = None
    for s in sums:  # chunk order
        for i in range(4):
            total[i] += s[i]
        if len(s) > 4:
            rel = s[4] if rel is None else rel + s[4]
    return scores._replace(likelihood=glik.test_metrics(lik, total), reliability=rel)


def _test_file_refs(ex, plan: Plan) -> list:
    """Chunks of the rows of ``gp_data.test_path`` (scored only: no training rows), standardised with
    the training rows' standardisation."""
    test, data, chunk_size = plan.test_rows, plan.data, plan.chunk_size
    if test is None:
        return []
    X, y = test.X, test.y
    std = data.standardizer
    empty = np.zeros((0, data.d))
    return [
        ex.scatter(
            Chunk(
                empty,
                np.zeros(0),
                np.ascontiguousarray(std.apply_X(X[a : a + chunk_size])),
                np.ascontiguousarray(y[a : a + chunk_size]),
            )
        )
        for a in range(0, X.shape[0], chunk_size)
    ]


def _forecast(plan: Plan, fit: FitResult) -> dict:
    """``{"forecast": figure}`` for one input scored on a test file or ``gp_data.forecast_from``'s rows."""
    if plan.test_rows is None or plan.data.d != 1 or plan.data.X is None or plan.method == "exact":
        return {}
    from pgmflow.sparse_gp.forecast import forecast_figure

    return {"forecast": forecast_figure(fit.predictor, plan.data, plan.test_rows)}


def _kernel_results(plan: Plan, params, std) -> dict:
    """A kernel object's fitted hyperparameters by name, in original units (none for a named kernel)."""
    if plan.kernel_setup is None:
        return {}
    return {"kernel_hyperparameters": kc.hyperparameters(plan.kernel, params, std)}


def _lengthscales(plan: Plan, params) -> np.ndarray:
    """float64 [d]: the ARD lengthscales (standardised units); a kernel object's shortest per input (NaN where
    none of its kernels has one: ``kernel_config.shortest_lengthscales``)."""
    if plan.kernel_setup is None:
        return np.asarray(params.lengthscale)
    return kc.shortest_lengthscales(plan.kernel, params, plan.data.d)


def _shortest(plan: Plan, params, dims) -> int:
    """The index into ``dims`` of the input with the shortest lengthscale (the first where none has one)."""
    ls = _lengthscales(plan, params)[dims]
    return int(np.nanargmin(ls)) if np.any(np.isfinite(ls)) else 0


def _slice(data, median, lo, hi, j) -> Slice:
    """Input j over its training range (and 5% beyond), the others at their training medians."""
    span = hi[j] - lo[j]
    pad = 0.05 * span if span > 0 else 1.0
    xs = np.linspace(lo[j] - pad, hi[j] + pad, SLICE_POINTS)
    G = np.tile(median, (SLICE_POINTS, 1))
    G[:, j] = xs
    return Slice(j, xs, data.standardizer.apply_X(G), median)


def finish(ctx, plan: Plan, fit: FitResult, scores: Scores, sl: Slice) -> dict:
    tracker, data, method = ctx.tracker, plan.data, plan.method
    pred = fit.predictor
    std = data.standardizer
    params = pred.params
    ls_std = _lengthscales(plan, params)
    ls_orig = ls_std * std.x_std
    y2 = std.y_std**2
    result = {
        "method": method,
        "kernel": str(plan.kernel),
        "seconds": scores.seconds,
        "rows": data.n,
        "inputs": data.d,
        "train_rows": data.n_train,
        "test_rows": int(scores.n_test),
        "test_rmse": scores.rmse,
        "test_nlpd": scores.nlpd,
        "bound": float(fit.value),
        "bound_per_row": float(fit.value) / data.n_train,
        "iterations": fit.iterations,
        "evaluations": fit.evaluations,
        "failed_evaluations": fit.failed_evaluations,
        "converged": fit.success,
        "optimizer": fit.message,
        "fit_seconds": fit.fit_seconds,
        "seconds_per_evaluation": fit.seconds_per_evaluation,
        "checkpoint_seconds": float(fit.checkpoint_seconds),
        "jitter_max": float(fit.jitter_max),
        "jitter_final": float(fit.jitter_final),
        "jitter_requested": plan.fit.jitter if method != "exact" else 0.0,
        "noise_variance": params.noise * y2,
        "kernel_variance": params.variance * y2,
        "lengthscales": [float(v) if math.isfinite(v) else None for v in ls_orig],
        **_kernel_results(plan, params, std),
        "input_names": list(data.input_names),
        "standardizer": std.to_dict(),
        **(
            {"restart_bounds": fit.restart_bounds, "best_restart": fit.best_restart, **fit.all_fits.results()}
            if fit.restart_bounds is not None
            else {}
        ),
        "objective": scores.nlpd,
        "objective_name": "test NLPD (mean negative log predictive density of the held-out rows, original units; "
        "lower is better)",
    }
    if not scores.n_test:  # every row trained on and no test file: the fit's own bound per row is the objective
        result["objective"] = -result["bound_per_row"]
        result["objective_name"] = "negative bound per training row (no held-out rows; lower is better)"
    if not plan.likelihood.conjugate:
        _likelihood_results(plan.likelihood, result, scores, params, std)
    artifacts.log_final_metrics(tracker, result, step=max(fit.iterations, 1), flush=False)
    tracker.flush()
    arrays = _model_arrays(plan, fit, scores)
    artifacts.log_npz(tracker, "model.npz", arrays, compressed=True)
    gp_model.log_model(ctx, arrays, std.invert_X(sl.grid[:: SLICE_POINTS // 5]))  # the pyfunc model "model"
    artifacts.log_results(tracker, result)
    if plan.figures:
        from pgmflow.sparse_gp import figures

        figs = figures.gp_figures(method, fit, sl, data, ls_orig)
        if not plan.likelihood.conjugate:  # the slice in what is observed, and (Bernoulli) a reliability diagram
            extra = figures.likelihood_figures(plan.likelihood, fit.predictor.params, sl, data, scores.reliability)
            figures.plt.close(figs["slice"])
            figs.update(extra)
        artifacts.log_figures(tracker, {**figs, **_forecast(plan, fit)})
    _print_summary(ctx.say, result)
    json.dumps(result)  # results must stay JSON-serialisable (logged as results.json)
    return result


def _likelihood_results(lik, result: dict, scores: Scores, params, std) -> None:
    """A non-Gaussian likelihood's fields of ``results.json``: its name and settings, its held-out metrics
    (``test_rmse`` is of the predictive mean: the class-1 probability, the rate); Bernoulli and Poisson have
    no noise variance (the slot holds its unused starting value), the Student-t's is its squared scale."""
    result["likelihood"] = lik.name
    if lik.name == "bernoulli":
        result["link"] = lik.link
    if lik.name == "student_t":
        result["student_t_dof"] = float(lik.dof)
        result["student_t_scale"] = math.sqrt(params.noise) * std.y_std
    else:
        result.pop("noise_variance", None)
    result["quadrature_points"] = int(lik.quadrature_points)
    result.update(scores.likelihood or {})
    if scores.n_test:
        result["objective_name"] = (
            f"test NLPD ({'log loss' if lik.name == 'bernoulli' else 'mean negative log predictive density'} of "
            "the held-out rows, original units; lower is better)"
        )


def _print_summary(say, r):
    per = r["seconds_per_evaluation"]
    what = "steps" if r["method"] == "svgp" else "iterations"
    lines = [
        f"pgmflow: sparse_gp ({r['method']}, {r['kernel']}) finished in {r['seconds']:.1f} s: "
        f"{'ELBO' if r['method'] == 'svgp' else 'bound' if r['method'] == 'sgpr' else 'log marginal likelihood'} "
        f"{r['bound']:.6g} after {r['iterations']} {what}"
        + (f" ({r['evaluations']} evaluations, {per:.3g} s each)" if r["method"] in gstats.METHODS else "")
        + (f" of the kept fit (restart {r['best_restart']})" if "best_restart" in r else ""),
        (
            _likelihood_line(r)
            if "likelihood" in r
            else f"  test RMSE {r['test_rmse']:.6g}, NLPD {r['test_nlpd']:.6g} (original units, {r['test_rows']} "
            f"held-out rows); noise variance {r['noise_variance']:.4g}"
            if r["test_rows"]
            else f"  no held-out rows (sparse_gp.test_fraction=0, no gp_data.test_path): no test scores; noise "
            f"variance {r['noise_variance']:.4g}"
        ),
    ]
    if "all_fits_count" in r:
        lines.insert(
            1,
            f"  all {r['all_fits_count']} fits (the configured start and the restarts): {r['all_fits_iterations']} "
            f"iterations, {r['all_fits_evaluations']} evaluations, {r['all_fits_seconds']:.1f} s optimising",
        )
    if r["jitter_max"] > r["jitter_requested"] * 1.5 and r["method"] != "exact":
        lines.append(
            f"  note: Kuu needed a jitter of up to {r['jitter_max']:.3g} x s (asked {r['jitter_requested']:.3g}"
            f"); final {r['jitter_final']:.3g} x s"
        )
    if r["failed_evaluations"]:
        lines.append(
            f"  note: {r['failed_evaluations']} evaluation(s) could not factor Kuu and were rejected by the line search"
        )
    if not r["converged"]:
        lines.append(
            f"  note: the optimiser stopped before convergence ({r['optimizer']}); raise sparse_gp.max_iter "
            "for a tighter fit"
        )
    say("\n".join(lines), prefix="", summary=True)


def _likelihood_line(r) -> str:
    """The summary's line of held-out scores with a non-Gaussian likelihood."""
    name, rows = r["likelihood"], r["test_rows"]
    if not rows:
        return f"  likelihood {name}: no held-out rows (sparse_gp.test_fraction=0, no gp_data.test_path)"
    if name == "bernoulli":
        got = f"accuracy {r['test_accuracy']:.4g}, log loss {r['test_log_loss']:.4g}, Brier {r['test_brier']:.4g}"
        name = f"bernoulli ({r['link']})"
    elif name == "poisson":
        got = (
            f"mean deviance {r['test_deviance']:.4g}, NLPD {r['test_nlpd']:.4g}, RMSE of the rate {r['test_rmse']:.4g}"
        )
    else:
        got = (
            f"RMSE {r['test_rmse']:.6g}, NLPD {r['test_nlpd']:.6g}, 90 % interval coverage "
            f"{r['test_coverage_90']:.3g}; scale {r['student_t_scale']:.4g}, dof {r['student_t_dof']:g}"
        )
    return f"  likelihood {name}: test {got} ({rows} held-out rows)"


def _model_arrays(plan: Plan, fit: FitResult, scores: Scores) -> dict:
    """What ``model.npz`` holds: everything needed to predict again, in original units."""
    data = plan.data
    pred, std = fit.predictor, data.standardizer
    params = pred.params
    arrays = {
        "method": np.array(plan.method),
        "kernel": np.array(str(plan.kernel)),
        "log_lengthscale": np.asarray(params.log_lengthscale, dtype=np.float64),
        "log_variance": np.float64(params.log_variance),
        "log_noise": np.float64(params.log_noise),
        "x_mean": std.x_mean,
        "x_std": std.x_std,
        "y_mean": np.float64(std.y_mean),
        "y_std": np.float64(std.y_std),
        "input_names": np.array(data.input_names),
        "target_name": np.array(data.target_name),
        "jitter": np.float64(fit.jitter_abs_final),
        "bound_trace": np.array([[k, v] for k, v, _ in fit.trace], dtype=np.float64),
        "test_rmse": np.float64(scores.rmse),
        "test_nlpd": np.float64(scores.nlpd),
    }
    if pred.Z is not None:
        arrays["Z"] = np.asarray(pred.Z)
    if pred.stats is not None:
        for f, v in pred.stats._asdict().items():
            arrays[f"stats_{f}"] = np.asarray(v)
    if pred.state is not None:
        arrays["svgp_theta1"] = np.asarray(pred.state.theta1)
        arrays["svgp_theta2"] = np.asarray(pred.state.theta2)
    if fit.exact is not None:
        arrays["X_train"] = fit.exact.X
        arrays["y_train"] = fit.exact.y
    lik = plan.likelihood
    if not lik.conjugate:  # a Gaussian model's file stays as it was
        arrays["likelihood"] = np.array(lik.name)
        arrays["link"] = np.array(lik.link)
        arrays["student_t_dof"] = np.float64(lik.dof)
        arrays["quadrature_points"] = np.int64(lik.quadrature_points)
    return arrays
