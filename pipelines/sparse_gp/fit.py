"""The fits of the sparse-GP workload: L-BFGS-B on a collapsed objective (SGPR, Titsias 2009; DTC; FITC,
Snelson and Ghahramani 2006) with one stats pass and one gradient pass over the chunks per evaluation, and
restarts from seeded starting points; SVGP (Hensman, Fusi and Lawrence 2013) by natural-gradient and Adam
steps on minibatches fetched from the chunks; the exact GP in one task. Also the fits' constants: the
optimiser's box (:data:`LOG_BOX`), the starting points (:func:`initial_params`, :func:`restart_params`)."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import NamedTuple

import dask
import numpy as np

from pgmflow.core import artifacts
from pgmflow.core.errors import ConfigError
from pgmflow.core.progress import Progress
from pgmflow.core.tracking import QuietTracker
from pgmflow.sparse_gp import lbfgsb
from pgmflow.sparse_gp.evaluations import Chunks, Evaluations
from pgmflow.tasks import rng as trng
from pgmflow.tasks.gp import kernels as kern
from pgmflow.tasks.gp import svgp as gsvgp
from pgmflow.tasks.gp.chunks import Predictor, chunk_elbo_task, chunk_rows_task, exact_task

EXACT_MAX_N = 20_000  # method=exact factors an n x n matrix: refused above this many training rows
LOG_BOX = (math.log(1e-5), math.log(1e5))  # L-BFGS-B box on every log hyperparameter (as pgmflow.tasks.gp.exact)
SVGP_BLOCK = 20  # SVGP minibatches fetched per round of chunk tasks
GP_STREAM_RESTART = 3  # first identity element under rng.STAGE_GP: restarts' starting points (then: restart)


def lbfgs_box(d, m, opt, kernel_setup=None):
    """L-BFGS-B's bounds on ``theta = pack(params, Z)``: :data:`LOG_BOX` on the d + 2 log hyperparameters,
    none on the m x d inducing inputs (``opt``: they are optimised). A kernel object: its own bounds
    (``kernel_setup``, :class:`~pgmflow.sparse_gp.kernel_config.KernelSetup`), the global scale held at 1."""
    if kernel_setup is not None:
        return kernel_setup.box(LOG_BOX, d, m, opt)
    return [LOG_BOX] * (d + 2) + ([(None, None)] * (m * d) if opt else [])


def initial_params(start, d: int) -> kern.GPParams:
    """The configured starting point (:class:`~pgmflow.sparse_gp.plan.Start`) for ``d`` inputs."""
    ls = start.lengthscale
    return kern.make_params(list(ls) if isinstance(ls, tuple) else ls, start.variance, start.noise, d=d)


RESTART_SPACING_QUANTILE = 0.1  # restarts' shortest lengthscale: this quantile of nearest-neighbour distances
RESTART_SPACING_POINTS = 20_000  # ... over at most this many of the inputs k-means++ runs on (a seeded subsample)


def restart_lengthscale_range(pool_std: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` [d]: the lengthscales restarts draw from, per input (standardised units). ``hi`` is twice
    the input's range over ``pool_std`` (the training inputs k-means++ runs on); ``lo`` is the smaller of 5 %
    of that range and the typical spacing of the inputs: the :data:`RESTART_SPACING_QUANTILE` quantile of the
    distances from each distinct input point to its nearest neighbour (Euclidean, over every input). On
    a weekly record that is the week; in many inputs the spacing exceeds 5 % of a range, which stays the
    floor there. Deterministic given the seed (a seeded subsample beyond :data:`RESTART_SPACING_POINTS`)."""
    import scipy.spatial

    span = np.ptp(pool_std, axis=0)
    span = np.where(span > 0, span, 1.0)
    pts = np.unique(pool_std, axis=0)
    if pts.shape[0] > RESTART_SPACING_POINTS:
        g = trng.generator(seed, trng.STAGE_GP, GP_STREAM_RESTART, 0)
        pts = pts[np.sort(g.choice(pts.shape[0], size=RESTART_SPACING_POINTS, replace=False))]
    lo = 0.05 * span
    if pts.shape[0] > 1:
        dist, _ = scipy.spatial.KDTree(pts).query(pts, k=2)
        near = dist[:, 1][dist[:, 1] > 0]
        if near.size:
            lo = np.minimum(lo, float(np.quantile(near, RESTART_SPACING_QUANTILE)))
    return lo, 2.0 * span


RESTART_NOISE = (1e-4, 0.5)  # restarts' starting noise variances (standardised units): log-uniform over this


def restart_params(start, ls_range: tuple[np.ndarray, np.ndarray], seed: int, n: int) -> list[kern.GPParams]:
    """The starting hyperparameters of restarts 1 .. ``n`` (standardised units), drawn from ``(seed, n)`` alone:
    a Latin hypercube over the logarithms. Each input's lengthscale is log-uniform over ``ls_range``
    (:func:`restart_lengthscale_range`: from the inputs' spacing to twice their range), stratified: the
    restarts take the ``n`` equal slices of that log range in a seeded order, each a log-uniform point of its
    slice. The noise is log-uniform over :data:`RESTART_NOISE`, stratified the same way, its slices handed
    out in the order of the restarts' mean lengthscale slice: the restart with the shortest lengthscales
    starts with the least noise (a short lengthscale explains more of the target as signal; a short
    lengthscale started with much noise falls into the everything-is-noise optimum). The signal variance is
    the configured one (``start.variance``) times exp(N(0, 0.5^2)). Everything inside the optimiser's box."""
    g = trng.generator(seed, trng.STAGE_GP, GP_STREAM_RESTART, int(n), 0)
    lo_ls, hi_ls = ls_range
    d = lo_ls.size
    strata = np.stack([g.permutation(n) for _ in range(d)], axis=1)  # [n, d]: restart r's slice of input j
    u = (strata + g.uniform(size=(n, d))) / n
    ls = np.exp(np.log(lo_ls) + u * (np.log(hi_ls) - np.log(lo_ls)))
    rank = np.argsort(np.argsort(strata.mean(axis=1), kind="stable"), kind="stable")
    u_noise = (rank + g.uniform(size=n)) / n
    noise = np.exp(math.log(RESTART_NOISE[0]) + u_noise * math.log(RESTART_NOISE[1] / RESTART_NOISE[0]))
    variance = start.variance * np.exp(g.normal(0.0, 0.5, size=n))
    lo, hi = math.exp(LOG_BOX[0]), math.exp(LOG_BOX[1])
    return [
        kern.make_params(
            np.clip(ls[r], lo, hi), float(np.clip(variance[r], lo, hi)), float(np.clip(noise[r], lo, hi)), d=d
        )
        for r in range(n)
    ]


class ExactOutputs(NamedTuple):
    """What the exact GP's one task also returns: the test pass's per-chunk ``sums`` (rows, squared errors,
    NLPD terms), the latent mean and variance on the slice grids (``slice``), and the standardised training
    rows ``X`` [n, d], ``y`` [n] the model keeps."""

    sums: list
    slice: tuple
    X: np.ndarray
    y: np.ndarray


class FitTotals(NamedTuple):
    """The sums over every fit a run made with restarts (the configured start and each restart that could
    start): ``fits`` made, their ``iterations``, ``evaluations``, ``failed_evaluations`` and ``seconds``."""

    fits: int
    iterations: int
    evaluations: int
    failed_evaluations: int
    seconds: float

    def results(self) -> dict:
        """As ``results.json`` names them (``all_fits_*``: apart from the kept fit's own counts)."""
        return {
            "all_fits_count": self.fits,
            "all_fits_iterations": self.iterations,
            "all_fits_evaluations": self.evaluations,
            "all_fits_failed_evaluations": self.failed_evaluations,
            "all_fits_seconds": self.seconds,
        }


@dataclasses.dataclass(frozen=True)
class FitResult:
    """A finished fit, whatever the method.

    predictor: ``pgmflow.tasks.gp.chunks.Predictor`` (standardised units). trace: ``[(iteration, objective,
    relative jitter)]``. value: the final objective (bound, log marginal likelihood or full-data ELBO).
    iterations, evaluations, failed_evaluations: the optimiser's counts (SVGP: steps). success, message: the
    optimiser's verdict. fit_seconds, seconds_per_evaluation, checkpoint_seconds: timings. jitter_max,
    jitter_final: the relative jitter, largest and final; jitter_abs_final: the final absolute one.
    minibatch_trace: SVGP's ``[(step, minibatch ELBO)]``. With restarts, the counts and timings above are the
    kept fit's (``checkpoint_seconds``: the first fit's, the only one that writes checkpoints), and restart_bounds,
    best_restart and all_fits (:class:`FitTotals`) say what every fit did. exact: the exact GP's
    :class:`ExactOutputs`.
    """

    predictor: Predictor
    trace: list
    value: float
    iterations: int
    evaluations: int
    failed_evaluations: int
    success: bool
    message: str
    fit_seconds: float
    seconds_per_evaluation: float
    jitter_max: float
    jitter_final: float
    jitter_abs_final: float
    checkpoint_seconds: float = 0.0
    minibatch_trace: list | None = None
    restart_bounds: list | None = None
    best_restart: int | None = None
    all_fits: FitTotals | None = None
    exact: ExactOutputs | None = None


def fit_collapsed(ctx, plan, chunks: Chunks, params0, Z0) -> FitResult:
    """L-BFGS-B on ``plan.method``'s objective from ``params0`` and ``Z0`` (``plan.fit``: its settings), or
    continued from the run's newest checkpoint when the run is resumed."""
    tracker, fs = ctx.tracker, plan.fit
    ev = Evaluations(chunks, plan.method, plan.kernel, Z0, fs)
    ev.kernel_setup = plan.kernel_setup  # a kernel object's bounds (None: the named kernels' box)
    theta0 = kern.pack(params0, Z0 if ev.opt else None)
    saved = _resume_state(ctx, ev) if ctx.resumed else None
    if saved is None:
        f0, _ = ev(theta0)
        if not math.isfinite(f0):
            raise ConfigError(
                "sparse_gp.jitter",
                fs.jitter,
                f"Kuu = K(Z, Z) could not be factored at the "
                f"initial hyperparameters even with the jitter raised {fs.max_tries} times",
                "raise sparse_gp.jitter or sparse_gp.max_tries, or start from a shorter sparse_gp.lengthscale",
            )
        trace = [(0, -f0, ev.records[theta0.tobytes()].jitter_rel)]
        tracker.log_metrics({"bound": -f0, "jitter": trace[0][2]}, step=0)
    else:
        trace = [tuple(row) for row in saved["trace"].tolist()]
    _note_jitter(ctx.say, ev)
    bar = Progress(fs.max_iter, f"sparse_gp {plan.method}", "iterations", enabled=ctx.progress)
    bar.update(len(trace) - 1)

    def callback(x, fun):
        rec = ev.records.get(np.asarray(x).tobytes())
        k = len(trace)
        trace.append((k, -float(fun), rec.jitter_rel if rec is not None else float("nan")))
        tracker.log_metrics({"bound": -float(fun), "jitter": trace[-1][2]}, step=k)
        bar.update(1, bound=-float(fun))

    t0 = time.monotonic()
    res, saving = _optimise(ctx, fs, ev, theta0, callback, trace, saved)
    seconds = time.monotonic() - t0
    bar.close()
    _note_jitter(ctx.say, ev)
    x = np.asarray(res.x)
    rec = ev.records.get(x.tobytes())
    if rec is None:  # the answer is the point a resumed run started from: its record again, not counted
        _uncounted(ev, x)
        rec = ev.records.get(x.tobytes())
    if rec is None:
        raise RuntimeError("the bound could not be evaluated at the optimiser's answer")
    params, Z = ev.unpack(x)
    pred = Predictor(plan.method, plan.kernel, params, Z, rec.stats, None, rec.jitter_start, fs.max_tries)
    return FitResult(
        pred,
        trace,
        rec.value,
        int(res.nit),
        ev.count,
        ev.failed,
        bool(res.success),
        str(res.message),
        seconds,
        ev.seconds / max(ev.count, 1),
        max(ev.jitters),
        rec.jitter_rel,
        rec.jitter_abs,
        checkpoint_seconds=saving,
    )


CHECKPOINT = "lbfgs"  # checkpoints/lbfgs_0.npz and lbfgs_1.npz, written in turn: the newer readable one counts


def _optimise(ctx, fs, ev, theta0, callback, trace, saved):
    """L-BFGS-B from ``theta0``, or continued from ``saved``, for ``fs.max_iter`` iterations at most; its whole
    state checkpointed (pipelines/sparse_gp/lbfgsb.py) after every ``fs.checkpoint_every``-th iteration at which
    ``fs.checkpoint_every_seconds`` have passed since the last checkpoint (or the start), and after the last
    iteration always. Returns the result and the seconds spent writing checkpoints."""
    box = lbfgs_box(ev.d, ev.m, ev.opt, getattr(ev, "kernel_setup", None))
    every, max_iter = fs.checkpoint_every, fs.max_iter
    slot = [1 - int(saved["slot"]) if saved is not None else 0]  # the slot not holding the newest checkpoint

    spent = [0.0]
    last = [time.monotonic()]  # when the last checkpoint was written (or the optimiser started)

    def due(nit, final):
        return every > 0 and (final or (nit % every == 0 and time.monotonic() - last[0] >= fs.checkpoint_every_seconds))

    def checkpoint(nit, state, final=False):
        if due(nit, final):
            # the metrics so far first (a resumed run must find them): delivered now instead of at the end of the
            # run, so not counted as the checkpoint's time
            ctx.tracker.flush()
            t0 = time.monotonic()
            artifacts.save_checkpoint(
                ctx.tracker,
                f"{CHECKPOINT}_{slot[0]}",
                {
                    **state,
                    "nit": np.int64(nit),
                    "scipy": np.asarray(_scipy_version()),
                    "trace": np.asarray(trace, dtype=np.float64),
                    "ev_count": np.int64(ev.count),
                    "ev_failed": np.int64(ev.failed),
                    "ev_seconds": np.float64(ev.seconds),
                    "ev_jitters": np.asarray(ev.jitters, dtype=np.float64),
                    "ev_first_growth": np.asarray(
                        ev.first_growth if ev.first_growth else (-1, np.nan), dtype=np.float64
                    ),
                },
            )
            slot[0] = 1 - slot[0]
            last[0] = time.monotonic()
            spent[0] += last[0] - t0

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
        ctx.say(
            f"note: this scipy's L-BFGS-B cannot be continued exactly; restarting it from iteration {start}'s "
            "point with a fresh memory (the result may move slightly)"
        )
    it = [start]

    def record(intermediate_result):  # scipy passes its OptimizeResult to a parameter of this name
        it[0] += 1
        callback(intermediate_result.x, intermediate_result.fun)
        checkpoint(it[0], {"x": np.asarray(intermediate_result.x, dtype=np.float64)}, it[0] >= max_iter)

    if start >= max_iter:
        return lbfgsb.Result(x0, float("nan"), start, 0, False, "STOP: TOTAL NO. OF ITERATIONS REACHED LIMIT")
    res = scipy.optimize.minimize(
        ev, x0, jac=True, method="L-BFGS-B", bounds=box, callback=record, options={"maxiter": max_iter - start}
    )
    return lbfgsb.Result(
        res.x, float(res.fun), start + int(res.nit), int(res.nfev), bool(res.success), str(res.message)
    )


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


def fit_restarts(ctx, plan, chunks: Chunks, fit0: FitResult, Z0, pool_std) -> FitResult:
    """``plan.fit.restarts`` more fits from seeded starting points (:func:`restart_params`), one after
    the other on the same chunks; the fit with the highest bound is kept (the first on a tie), with the totals
    over every fit (:class:`FitTotals`). Every restart's bound is the metric ``restart_bound`` at step r (r = 0:
    the configured start)."""
    n = plan.fit.restarts
    fits = [(0, fit0)]  # (restart, fit)
    ctx.tracker.log_metrics({"restart_bound": fit0.value}, step=0)
    quiet_plan = dataclasses.replace(plan, fit=dataclasses.replace(plan.fit, checkpoint_every=0))
    starts = restart_params(plan.start, restart_lengthscale_range(pool_std, plan.seed), plan.seed, n)
    for r, params in enumerate(starts, start=1):
        quiet = dataclasses.replace(ctx, tracker=QuietTracker(ctx.tracker, f"r{r}"), resumed=False)
        try:
            f = fit_collapsed(quiet, quiet_plan, chunks._replace(tok=f"{chunks.tok}r{r}"), params, Z0)
        except ConfigError:  # Kuu would not factor at this start: the restart is skipped
            ctx.say(f"restart {r}: Kuu could not be factored at its starting point; skipped")
            continue
        ctx.tracker.log_metrics({"restart_bound": f.value}, step=r)
        fits.append((r, f))
    best = max(range(len(fits)), key=lambda i: (fits[i][1].value, -i))
    out = dataclasses.replace(
        fits[best][1],
        restart_bounds=[float(f.value) for _, f in fits],
        best_restart=int(fits[best][0]),
        checkpoint_seconds=fit0.checkpoint_seconds,  # restarts write none
        all_fits=FitTotals(
            len(fits),
            sum(f.iterations for _, f in fits),
            sum(f.evaluations for _, f in fits),
            sum(f.failed_evaluations for _, f in fits),
            sum(f.fit_seconds for _, f in fits),
        ),
    )
    ctx.say(
        f"{n} restart(s): bounds {', '.join(f'{v:.6g}' for v in out.restart_bounds)}; kept restart "
        f"{out.best_restart} (bound {out.value:.6g})"
    )
    return out


def _uncounted(ev, x):
    """Evaluate ``x`` for its record only: the counters stay as they are."""
    count, failed, jitters, seconds, growth = ev.count, ev.failed, list(ev.jitters), ev.seconds, ev.first_growth
    ev(x)
    ev.count, ev.failed, ev.jitters, ev.seconds, ev.first_growth = count, failed, jitters, seconds, growth


def _note_jitter(say, ev):
    if ev.first_growth is not None and not ev.growth_noted:
        ev.growth_noted = True
        k, rel = ev.first_growth
        say(
            f"note: the Cholesky factorisation of Kuu = K(Z, Z) + jitter s I failed with the "
            f"jitter {ev.jitter:.3g} x s at evaluation {k}; retried with a tenfold larger jitter each "
            f"time, it succeeded with {rel:.3g} x s (every iteration's jitter is the metric 'jitter', the largest "
            "'final_jitter_max')"
        )


def fit_svgp(ctx, plan, chunks: Chunks, params0, Z0) -> FitResult:
    """SVGP (Hensman, Fusi and Lawrence 2013): ``plan.svgp.steps`` natural-gradient steps of ``q(u)`` and Adam
    steps of the hyperparameters (and ``Z``) on seeded minibatches of the training rows; the full-data ELBO
    every ``plan.svgp.eval_every`` steps."""
    tracker, sv, kernel, seed = ctx.tracker, plan.svgp, plan.kernel, plan.seed
    train_counts = chunks.train_counts
    opt = plan.fit.optimize_inducing
    m, d = Z0.shape
    n = int(train_counts.sum())
    steps = sv.steps
    bs = min(sv.batch_size, n)
    rho, lr = sv.rho, sv.lr
    every = sv.eval_every
    jitter = plan.fit.jitter
    offsets = np.concatenate([[0], np.cumsum(train_counts)])
    state = gsvgp.svgp_init(m)
    theta = kern.pack(params0, Z0 if opt else None)
    adam = gsvgp.adam_init(theta)
    q, lo_box, hi_box = _hyper_box(plan.kernel_setup, d)

    def unpack(th):
        p, Z = kern.unpack(th, d, m if opt else 0, q)
        return p, (Z0 if Z is None else Z)

    lik = None if plan.likelihood.conjugate else plan.likelihood  # None: the Gaussian's closed forms

    def full_elbo(params, Z, state, k):
        return _full_elbo(chunks, kernel, params, Z, state, jitter, k, lik)

    trace, mb_trace = [], []
    params, Z = unpack(theta)
    v0 = full_elbo(params, Z, state, 0)
    trace.append((0, v0))
    tracker.log_metrics({"bound": v0}, step=0)
    bar = Progress(steps, "sparse_gp svgp", "steps", enabled=ctx.progress)
    t0 = time.monotonic()
    for s0 in range(0, steps, SVGP_BLOCK):
        block = list(range(s0, min(steps, s0 + SVGP_BLOCK)))
        got = _fetch_minibatches(chunks, offsets, [gsvgp.minibatch_indices(seed, t, n, bs) for t in block], s0)
        for k, t in enumerate(block):
            Xb = np.concatenate([g[k][0] for g in got])
            yb = np.concatenate([g[k][1] for g in got])
            params, Z = unpack(theta)
            try:
                state = gsvgp.natgrad_step(kernel, params, Z, state, Xb, yb, n, rho, jitter, likelihood=lik)
                elbo, dparams, dZ = gsvgp.svgp_elbo_and_grad(
                    kernel, params, Z, state, Xb, yb, n, jitter, likelihood=lik
                )
            except kern.CholeskyError as exc:
                raise RuntimeError(
                    f"SVGP step {t}: {exc}; fix: lower sparse_gp.svgp_lr or sparse_gp.svgp_rho, or "
                    "raise sparse_gp.jitter"
                ) from None
            adam, step = gsvgp.adam_update(adam, -kern.pack(dparams, dZ if opt else None), lr=lr)
            theta = theta + step
            theta[: q + 2] = np.clip(theta[: q + 2], lo_box, hi_box)
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
    pred = Predictor("svgp", kernel, params, Z, None, state, jitter, plan.fit.max_tries, lik)
    _, jit_abs = kern.inducing_cholesky(kernel, params, Z, jitter, plan.fit.max_tries)
    rel = jit_abs / params.variance
    return FitResult(
        pred,
        [(k, v, float("nan")) for k, v in trace],
        trace[-1][1],
        steps,
        steps,
        0,
        True,
        f"{steps} SVGP steps",
        seconds,
        seconds / max(steps, 1),
        rel,
        rel,
        jit_abs,
        minibatch_trace=mb_trace,
    )


def _hyper_box(kernel_setup, d: int):
    """``(q, lo, hi)``: the number of kernel entries of ``pack(params)`` before the scale and the noise, and the
    box SVGP's Adam steps are clipped to on those ``q + 2`` entries (:data:`LOG_BOX`, or a kernel object's own)."""
    if kernel_setup is None:
        return d, *LOG_BOX
    lo, hi = (np.array(v) for v in zip(*kernel_setup.box(LOG_BOX, d, 0, False)))
    return kernel_setup.kernel.n_params, lo, hi


def _full_elbo(chunks: Chunks, kernel, params, Z, state, jitter, k, likelihood=None) -> float:
    """The SVGP ELBO over every chunk's training rows (chunk order) after step ``k`` (``likelihood``: None
    for the Gaussian, else a non-conjugate ``pgmflow.tasks.gp.likelihoods.Likelihood``)."""
    lik = {} if likelihood is None else {"likelihood": likelihood}
    outs = [
        dask.delayed(chunk_elbo_task, pure=True)(
            kernel, params, Z, state, ref, jitter, **lik, dask_key_name=f"gp-elbo-{chunks.tok}-s{k}-c{c}"
        )
        for c, ref in enumerate(chunks.refs)
    ]
    parts = chunks.ex.gather_ordered(outs, release=True)
    kl = -gsvgp.svgp_elbo(kernel, params, Z, state, Z[:1], np.zeros(1), 0, jitter)  # n = 0: the KL alone
    total = 0.0
    for v, rows in parts:  # chunk order; each chunk's ELBO counts the KL once
        if rows:
            total += v + kl
    return total - kl


def _fetch_minibatches(chunks: Chunks, offsets, idx, s0) -> list:
    """The rows of the minibatches ``idx`` (global training-row indices), one task per chunk that
    holds some: per such chunk (in chunk order), a list of ``(X, y)`` per minibatch."""
    outs, tok = [], chunks.tok
    for c, ref in enumerate(chunks.refs):
        a, b = offsets[c], offsets[c + 1]
        sel = [i[(i >= a) & (i < b)] - a for i in idx]
        if any(s.size for s in sel):
            outs.append(dask.delayed(chunk_rows_task, pure=True)(ref, sel, dask_key_name=f"gp-rows-{tok}-s{s0}-c{c}"))
    return chunks.ex.gather_ordered(outs, release=True)


def fit_exact(ctx, plan, chunks: Chunks, params0, Xslice) -> FitResult:
    """The exact GP in one task (``pgmflow.tasks.gp.exact.fit``, L-BFGS-B on the log marginal likelihood, at
    most ``plan.fit.max_iter`` iterations) on every chunk's training rows; it also predicts the held-out
    rows and the standardised slice inputs ``Xslice`` [P, d] (:class:`ExactOutputs`)."""
    ex, data, kernel = chunks.ex, plan.data, plan.kernel
    if data.n_train > EXACT_MAX_N:  # preflight refuses this too
        raise ConfigError(
            "sparse_gp.method",
            "exact",
            f"the exact GP factors an n x n matrix; n = {data.n_train} training rows is more than {EXACT_MAX_N}",
            "use sparse_gp.method=sgpr",
        )
    t0 = time.monotonic()
    out = ex.gather_ordered(
        [
            dask.delayed(exact_task, pure=True)(
                kernel,
                params0,
                plan.fit.max_iter,
                list(chunks.refs),
                data.standardizer,
                Xslice,
                **({} if plan.kernel_setup is None else {"bounds": plan.kernel_setup.box(LOG_BOX, 0, 0, False)}),
                dask_key_name=f"gp-exact-{chunks.tok}",
            )
        ],
        release=True,
    )[0]
    seconds = time.monotonic() - t0
    fit = out["fit"]
    trace = [(0, out["lml0"], 0.0), (max(int(fit.n_iter), 1), float(fit.lml), 0.0)]
    for k, v, _ in trace:
        ctx.tracker.log_metrics({"bound": v}, step=k)
    pred = Predictor("exact", kernel, fit.params, None, None, None, 0.0, 0)
    return FitResult(
        pred,
        trace,
        float(fit.lml),
        int(fit.n_iter),
        int(fit.n_iter),
        0,
        bool(fit.success),
        "exact GP (pgmflow.tasks.gp.exact.fit)",
        seconds,
        float("nan"),
        0.0,
        0.0,
        0.0,
        exact=ExactOutputs(out["sums"], out["slice"], out["X"], out["y"]),
    )
