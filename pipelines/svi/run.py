"""Stochastic variational inference for LDA: the graph of each minibatch step and the ordered reduce.

One minibatch step ``t``::

    driver: lambda --exp(E[log beta]) of the words group g needs--> estep(group g, step t)   one task per worker
    worker: its shards' documents of step t --E-step--> per-shard statistics (+ the words of step t+1)
    driver: sum the per-shard statistics in shard order -> lambda <- (1-rho) lambda + rho (eta + D/S sstats)

Shards are loaded once by the worker that keeps them (``prepare`` tasks pinned to a worker); later
tasks take their futures, so the corpus never travels. Only the topic-word columns a group's
documents use go out, and only per-shard statistics over the words used come back. Which documents
form step ``t`` depends on (seed, shard, epoch, step) alone (``pgmflow.tasks.lda.shard_tasks``), and the
statistics are summed in shard order, so lambda is bit-identical for any number of workers.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from typing import NamedTuple

import dask
import numpy as np

from pgmflow.core import artifacts
from pgmflow.core.progress import Progress
from pgmflow.svi import model as lda_model
from pgmflow.svi import report
from pgmflow.svi.plan import Plan
from pgmflow.tasks.lda import shard_tasks, svi


@dataclass(frozen=True)
class Fit:
    """What stays fixed while the run fits: the plan, where the shards live and what was loaded once.

    plan: the run's plan; groups: shard indices per group (group g is held by ``group_worker[g]``, None
    on the synchronous scheduler); states: per group, the futures of its shards' states
    (``shard_tasks.ShardState``); heldout_cols: per group, the words of its held-out documents."""

    plan: Plan
    groups: list[list[int]]
    group_worker: list[str | None]
    states: list[list]  # [group][shard]: futures (or values, on the synchronous scheduler)
    heldout_cols: list[np.ndarray]


class Trained(NamedTuple):
    """The end of a fit: the final global state, the perplexity history, documents seen in this run."""

    state: svi.SVIState
    history: list
    docs: int


def _groups(n_shards: int, workers: list[str]) -> list[list[int]]:
    """Shards per worker, round-robin (group g is held by workers[g])."""
    W = max(1, len(workers))
    return [[j for j in range(n_shards) if j % W == g] for g in range(min(W, n_shards))]


def _workers(ex) -> list:
    """The workers' addresses, sorted ([None] without a cluster); waits for one to join when none is there
    (a cluster whose every worker is restarting)."""
    if not ex.distributed:
        return [None]
    workers = sorted(ex.client.scheduler_info(n_workers=-1)["workers"])
    if not workers:
        ex.client.wait_for_workers(1, timeout=300)
        workers = sorted(ex.client.scheduler_info(n_workers=-1)["workers"])
    return workers


def _annotate(ex, worker):
    if ex.distributed and worker is not None:
        return dask.annotate(workers=[worker], allow_other_workers=True)
    return contextlib.nullcontext()


def _announce(ctx, plan: Plan, n_groups: int) -> None:
    """The corpus and the schedule: tags, step-0 metrics and one line."""
    info, sch = plan.corpus, plan.schedule
    ctx.tracker.set_tags(
        {
            "pgmflow.svi.corpus": info.meta.get("source", info.path),
            "pgmflow.svi.shards": len(info.shard_docs),
            "pgmflow.svi.groups": n_groups,
            "pgmflow.svi.pr": plan.constraints is not None,
        }
    )
    ctx.tracker.log_metrics(
        {
            "corpus_docs": info.n_docs,
            "corpus_words": plan.n_words,
            "corpus_tokens": info.n_tokens,
            "train_docs": sch.n_train,
            "steps_per_epoch": sch.steps_per_epoch,
        },
        step=0,
    )
    ctx.say(
        f"corpus {info.path}: {info.n_docs} documents ({sch.n_train} for training), {plan.n_words} words, "
        f"{len(info.shard_docs)} shards; K={plan.model.K}, S={sch.batch_docs}, {sch.n_steps} steps"
    )
    if sch.batch_size > sch.n_train:  # a setting the data overrides: said, not silent
        ctx.say(
            f"svi.batch_size={sch.batch_size} is more than the {sch.n_train} training documents: each step uses "
            f"all {sch.n_train} ({sch.n_steps} steps in all); set svi.batch_size below {sch.n_train} for "
            "stochastic steps"
        )


def _load_shards(ctx, plan: Plan, groups: list[list[int]], group_worker: list[str | None]) -> Fit:
    """Each group's shards onto its worker, once (``prepare`` tasks pinned to the worker), and the words
    of each group's held-out documents."""
    ex = ctx.executor
    prep = []
    for g, shards in enumerate(groups):
        with _annotate(ex, group_worker[g]):
            prep.append(
                [
                    dask.delayed(shard_tasks.prepare_shard, pure=True)(
                        plan.corpus.path,
                        j,
                        plan.seed,
                        plan.heldout_fraction,
                        plan.keep_in_memory,
                        dask_key_name=f"svi-shard-{ctx.token}-j{j}",
                    )
                    for j in shards
                ]
            )
    it = iter(ex.compute([d for grp in prep for d in grp]))
    states = [[next(it) for _ in grp] for grp in prep]
    heldout_cols = ex.gather_ordered(
        [
            dask.delayed(shard_tasks.heldout_words, pure=True)(states[g], dask_key_name=f"svi-hwords-{ctx.token}-g{g}")
            for g in range(len(groups))
        ]
    )
    return Fit(plan, groups, group_worker, states, heldout_cols)


def _initial(ctx, fit: Fit) -> tuple[svi.SVIState, list, int]:
    """(state, history, first step index): from the newest checkpoint when resuming, else fresh."""
    plan = fit.plan
    ckpt = artifacts.newest_checkpoint(ctx.tracker) if ctx.resumed else None
    if ckpt is None:
        return svi.init(plan.model.K, plan.n_words, plan.seed), [], 0
    state = svi.SVIState(int(ckpt["count"]), np.array(ckpt["lam"]), int(ckpt["docs_seen"]))
    start = int(ckpt["step_index"])
    ctx.say(f"resuming after step {start} of {plan.schedule.n_steps}")
    return state, json.loads(str(ckpt["history"])), start


def _step(ctx, fit: Fit, state: svi.SVIState, i: int, next_cols: list, buf: np.ndarray) -> tuple:
    """One minibatch step ``i`` (Hoffman et al. 2013, Fig. 6): E-step tasks per group, the ordered
    reduce, the global update. Returns (new state, the next step's words per group, metrics,
    documents in the batch)."""
    plan = fit.plan
    T, n_steps = plan.schedule.steps_per_epoch, plan.schedule.n_steps
    epoch, step = divmod(i, T)
    nxt = divmod(i + 1, T) if i + 1 < n_steps else None
    t0 = time.monotonic()
    union = np.unique(np.concatenate([np.zeros(0, np.int64)] + list(next_cols)))
    eeb_union = svi.exp_elog_beta(state.lam, union)  # [C, K], one array for every group
    alpha = plan.model.alpha_vector()
    outs = []
    for g in range(len(fit.groups)):
        pos = np.searchsorted(union, next_cols[g])
        with _annotate(ctx.executor, fit.group_worker[g]):
            outs.append(
                dask.delayed(shard_tasks.estep_group, pure=True, nout=2)(
                    fit.states[g],
                    plan.seed,
                    epoch,
                    step,
                    T,
                    next_cols[g],
                    np.ascontiguousarray(eeb_union[pos]),
                    alpha,
                    plan.estep.max_iter,
                    plan.estep.tol,
                    plan.constraints,
                    nxt,
                    ctx.backend,
                    dask_key_name=f"svi-estep-{ctx.token}-i{i}-g{g}",
                )
            )
    results = ctx.executor.gather_ordered(outs)
    per_shard = sorted((s for grp, _ in results for s in grp), key=lambda s: s.index)
    for s in per_shard:  # ordered reduce: shard 0, 1, 2, ... whatever the grouping
        buf[:, s.cols] += s.sstats.T
    S_t = sum(s.n_docs for s in per_shard)
    bound = math.fsum(s.doc_bound for s in per_shard)
    ntok = math.fsum(s.n_tokens for s in per_shard)
    state, sinfo = svi.update(
        state, buf, S_t, plan.schedule.n_train, plan.model.eta, plan.step_size.tau0, plan.step_size.kappa
    )
    buf[:] = 0.0
    dt = time.monotonic() - t0
    metrics = {
        "rho": sinfo.rho,
        "batch_docs": S_t,
        "batch_bound_per_word": bound / ntok if ntok else float("nan"),
        "docs_per_second": S_t / dt if dt > 0 else float("nan"),
        "docs_seen": state.docs_seen,
        "estep_iterations_per_doc": sum(s.iterations for s in per_shard) / max(S_t, 1),
        "step_seconds": dt,
        "estep_seconds_max_worker": max(sum(s.seconds for s in grp) for grp, _ in results),
    }
    return state, [n for _, n in results], metrics, S_t


def _first_words(ctx, fit: Fit, start: int) -> list | None:
    """The words each group needs for step ``start`` (None past the last step)."""
    plan = fit.plan
    if start >= plan.schedule.n_steps:
        return None
    e0, t0 = divmod(start, plan.schedule.steps_per_epoch)
    return ctx.executor.gather_ordered(
        [
            dask.delayed(shard_tasks.step_words, pure=True)(
                fit.states[g],
                plan.seed,
                e0,
                t0,
                plan.schedule.steps_per_epoch,
                dask_key_name=f"svi-words-{ctx.token}-i{start}-g{g}",
            )
            for g in range(len(fit.groups))
        ]
    )


def run(ctx, plan: Plan) -> dict:
    """The SVI run of ``plan`` (the minibatch algorithm of Hoffman et al. 2013, Fig. 6, with the
    E-step farmed out by shard); returns the results (``report.finish``)."""
    ex = ctx.executor
    workers = _workers(ex)
    groups = _groups(len(plan.corpus.shard_docs), workers)
    _announce(ctx, plan, len(groups))
    lda_model.log_corpus(ctx, plan.source, plan.corpus)  # MLflow dataset tracking: the corpus, with a digest
    t_prep = time.monotonic()
    fit = _load_shards(ctx, plan, groups, [workers[g] if ex.distributed else None for g in range(len(groups))])
    state, history, start = _initial(ctx, fit)
    next_cols = _first_words(ctx, fit, start)
    prepare_seconds = time.monotonic() - t_prep
    t_run = time.monotonic()
    trained = _train(ctx, fit, Trained(state, history, 0), start, next_cols, plan.outputs.checkpoint_every)
    if plan.restarts:
        trained = _restarts(ctx, fit, trained)
    elapsed = time.monotonic() - t_run
    ctx.tracker.flush()
    result = report.finish(ctx, fit, trained, report.Timing(elapsed, prepare_seconds))
    lda_model.log_model(ctx, plan, trained.state.lam)  # the pyfunc model "lda_model"
    return result


def _train(ctx, fit: Fit, begun: Trained, start: int, next_cols: list | None, checkpoint_every: int) -> Trained:
    """Minibatch steps ``start`` .. the end from ``begun`` (state, history, documents so far):
    the final state, the perplexity history, the documents seen."""
    plan = fit.plan
    n_steps, eval_every = plan.schedule.n_steps, plan.outputs.eval_every
    state, history, docs_in_run = begun
    bar = Progress(n_steps - start, "svi", "steps", enabled=ctx.progress)
    t_run = time.monotonic()
    buf = np.zeros((plan.model.K, plan.n_words))
    for i in range(start, n_steps):
        state, next_cols, metrics, S_t = _step(ctx, fit, state, i, next_cols, buf)
        docs_in_run += S_t
        done = i + 1
        if eval_every > 0 and (done % eval_every == 0 or done == n_steps):
            ppl, _ = report.heldout_perplexity(ctx, fit, state.lam)
            metrics["heldout_perplexity"] = ppl
            history.append(
                {"step": done, "docs_seen": state.docs_seen, "perplexity": ppl, "seconds": time.monotonic() - t_run}
            )
        ctx.tracker.log_metrics(metrics, step=done)
        bar.update(
            1,
            docs_s=f"{docs_in_run / max(time.monotonic() - t_run, 1e-9):.0f}",
            rho=f"{metrics['rho']:.3f}",
            **({"perplexity": f"{history[-1]['perplexity']:.1f}"} if history else {}),
        )
        if checkpoint_every > 0 and (done % checkpoint_every == 0) and done < n_steps:
            artifacts.save_checkpoint(
                ctx.tracker,
                f"step_{done:07d}",
                dict(
                    count=np.int64(state.count),
                    lam=state.lam,
                    docs_seen=np.int64(state.docs_seen),
                    step_index=np.int64(done),
                    history=np.array(json.dumps(history)),
                ),
            )
    bar.close()
    return Trained(state, history, docs_in_run)


def _restarts(ctx, fit: Fit, first: Trained) -> Trained:
    """``plan.restarts`` more fits from seeded initial topics (``svi.init(..., restart=r)``), each over the
    same minibatches; the one with the lowest held-out perplexity is kept (the first on a tie). Each
    restart's perplexity is the metric ``restart_heldout_perplexity`` at step r (0: the first fit).
    The documents seen add up over all fits."""
    import dataclasses

    from pgmflow.core.tracking import QuietTracker

    plan = fit.plan
    best = (report.heldout_perplexity(ctx, fit, first.state.lam)[0], 0, first)
    ctx.tracker.log_metrics({"restart_heldout_perplexity": best[0]}, step=0)
    found, docs = [best[0]], first.docs
    for r in range(1, plan.restarts + 1):
        quiet = dataclasses.replace(ctx, tracker=QuietTracker(ctx.tracker, f"r{r}"), resumed=False)
        init = svi.init(plan.model.K, plan.n_words, plan.seed, restart=r)
        fitted = _train(quiet, fit, Trained(init, [], 0), 0, _first_words(quiet, fit, 0), 0)
        docs += fitted.docs
        ppl = report.heldout_perplexity(ctx, fit, fitted.state.lam)[0]
        ctx.tracker.log_metrics({"restart_heldout_perplexity": ppl}, step=r)
        found.append(ppl)
        if ppl < best[0]:
            best = (ppl, r, fitted)
    ctx.say(
        f"{len(found) - 1} restart(s): held-out perplexity {', '.join(f'{v:.2f}' for v in found)}; kept restart "
        f"{best[1]}"
    )
    ctx.tracker.set_tags({"pgmflow.svi.best_restart": best[1]})
    return best[2]._replace(docs=docs)
