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

import dask
import numpy as np

from pgmflow.pipelines.core import artifacts
from pgmflow.pipelines.core.errors import ConfigError
from pgmflow.pipelines.core.progress import Progress
from pgmflow.pipelines.svi import corpora, report
from pgmflow.pipelines.svi import model as lda_model
from pgmflow.tasks.lda import shard_tasks, svi


@dataclass
class Setup:
    """What stays fixed for the run: the corpus, the model's constants, the schedule, the placement."""

    info: object  # pgmflow.tasks.lda.corpus.CorpusInfo
    K: int
    alpha: np.ndarray
    eta: float
    pr: object  # PRConfig or None
    heldout_fraction: float
    n_train: int
    T: int  # steps per epoch
    n_steps: int
    groups: list  # shard indices per group (group g is held by group_worker[g])
    group_worker: list

    @property
    def V(self) -> int:
        return int(self.info.n_words)


def _groups(n_shards: int, workers: list[str]) -> list[list[int]]:
    """Shards per worker, round-robin (group g is held by workers[g])."""
    W = max(1, len(workers))
    return [[j for j in range(n_shards) if j % W == g] for g in range(min(W, n_shards))]


def _annotate(ex, worker):
    if ex.distributed and worker is not None:
        return dask.annotate(workers=[worker], allow_other_workers=True)
    return contextlib.nullcontext()


def _setup(ctx) -> Setup:
    cfg, ex = ctx.cfg, ctx.executor
    scfg, mcfg = cfg["svi"], cfg["model"]
    seed = int(cfg["seed"])
    info = corpora.resolve(cfg)
    K = int(mcfg["K"])
    heldout_fraction = corpora.heldout_fraction(scfg, info.n_docs)
    n_train = sum(shard_tasks.train_split(n, seed, j, heldout_fraction).size for j, n in enumerate(info.shard_docs))
    if n_train == 0:
        raise ConfigError("svi.heldout_fraction", scfg["heldout_fraction"], "no training documents are left",
                          "lower svi.heldout_fraction")
    S = min(int(scfg["batch_size"]), n_train)
    T = max(1, math.ceil(n_train / S))  # steps per epoch
    n_steps = T * int(scfg["n_epochs"])
    if scfg.get("max_steps"):
        n_steps = min(n_steps, int(scfg["max_steps"]))
    workers = sorted(ex.client.scheduler_info()["workers"]) if ex.distributed else [None]
    groups = _groups(len(info.shard_docs), workers)
    setup = Setup(info=info, K=K, alpha=np.full(K, float(mcfg["alpha"]) if mcfg.get("alpha") is not None else 1.0 / K),
                  eta=float(mcfg["eta"]) if mcfg.get("eta") is not None else 1.0 / K, pr=corpora.pr_config(cfg, info),
                  heldout_fraction=heldout_fraction, n_train=n_train, T=T, n_steps=n_steps, groups=groups,
                  group_worker=[workers[g] if ex.distributed else None for g in range(len(groups))])
    ctx.tracker.set_tags({"pgmflow.svi.corpus": info.meta.get("source", info.path), "pgmflow.svi.shards": len(
        info.shard_docs), "pgmflow.svi.groups": len(groups), "pgmflow.svi.pr": setup.pr is not None})
    ctx.tracker.log_metrics({"corpus_docs": info.n_docs, "corpus_words": setup.V, "corpus_tokens": info.n_tokens,
                             "train_docs": n_train, "steps_per_epoch": T}, step=0)
    ctx.say(f"corpus {info.path}: {info.n_docs} documents ({n_train} for training), {setup.V} words, "
            f"{len(info.shard_docs)} shards; K={K}, S={S}, {n_steps} steps")
    return setup


def _load_shards(ctx, su: Setup) -> list:
    """Each group's shards onto its worker, once: per group, the futures of the shard states."""
    scfg, seed = ctx.cfg["svi"], int(ctx.cfg["seed"])
    prep = []
    for g, shards in enumerate(su.groups):
        with _annotate(ctx.executor, su.group_worker[g]):
            prep.append([dask.delayed(shard_tasks.prepare_shard, pure=True)(
                su.info.path, j, seed, su.heldout_fraction, bool(scfg["keep_in_memory"]),
                dask_key_name=f"svi-shard-{ctx.token}-j{j}") for j in shards])
    it = iter(ctx.executor.compute([d for grp in prep for d in grp]))
    return [[next(it) for _ in grp] for grp in prep]


def _initial(ctx, su: Setup) -> tuple[svi.SVIState, list, int]:
    """(state, history, first step index): from the newest checkpoint when resuming, else fresh."""
    ckpt = artifacts.newest_checkpoint(ctx.tracker) if ctx.resumed else None
    if ckpt is None:
        return svi.init(su.K, su.V, int(ctx.cfg["seed"])), [], 0
    state = svi.SVIState(int(ckpt["count"]), np.array(ckpt["lam"]), int(ckpt["docs_seen"]))
    start = int(ckpt["step_index"])
    ctx.say(f"resuming after step {start} of {su.n_steps}")
    return state, json.loads(str(ckpt["history"])), start


def _step(ctx, su: Setup, states, state, i: int, next_cols: list, buf: np.ndarray) -> tuple:
    """One minibatch step ``i``: E-step tasks per group, the ordered reduce, the global update.
    Returns (new state, the next step's words per group, metrics, documents in the batch)."""
    scfg, seed = ctx.cfg["svi"], int(ctx.cfg["seed"])
    epoch, step = divmod(i, su.T)
    nxt = divmod(i + 1, su.T) if i + 1 < su.n_steps else None
    t0 = time.monotonic()
    union = np.unique(np.concatenate([np.zeros(0, np.int64)] + list(next_cols)))
    eeb_union = svi.exp_elog_beta(state.lam, union)  # [C, K], one array for every group
    outs = []
    for g in range(len(su.groups)):
        pos = np.searchsorted(union, next_cols[g])
        with _annotate(ctx.executor, su.group_worker[g]):
            outs.append(dask.delayed(shard_tasks.estep_group, pure=True, nout=2)(
                states[g], seed, epoch, step, su.T, next_cols[g], np.ascontiguousarray(eeb_union[pos]), su.alpha,
                int(scfg["estep_max_iter"]), float(scfg["estep_tol"]), su.pr, nxt, ctx.backend,
                dask_key_name=f"svi-estep-{ctx.token}-i{i}-g{g}"))
    results = ctx.executor.gather_ordered(outs)
    per_shard = sorted((s for grp, _ in results for s in grp), key=lambda s: s.index)
    for s in per_shard:  # ordered reduce: shard 0, 1, 2, ... whatever the grouping
        buf[:, s.cols] += s.sstats.T
    S_t = sum(s.n_docs for s in per_shard)
    bound = math.fsum(s.doc_bound for s in per_shard)
    ntok = math.fsum(s.n_tokens for s in per_shard)
    state, sinfo = svi.update(state, buf, S_t, su.n_train, su.eta, float(scfg["tau0"]), float(scfg["kappa"]))
    buf[:] = 0.0
    dt = time.monotonic() - t0
    metrics = {"rho": sinfo.rho, "batch_docs": S_t, "batch_bound_per_word": bound / ntok if ntok else float("nan"),
               "docs_per_second": S_t / dt if dt > 0 else float("nan"), "docs_seen": state.docs_seen,
               "estep_iterations_per_doc": sum(s.iterations for s in per_shard) / max(S_t, 1),
               "step_seconds": dt, "estep_seconds_max_worker": max(sum(s.seconds for s in grp) for grp, _ in results)}
    return state, [n for _, n in results], metrics, S_t


def _first_words(ctx, su: Setup, states, start: int) -> tuple[list | None, list]:
    """The words each group needs for step ``start``, and the words of each group's held-out documents."""
    ex, seed = ctx.executor, int(ctx.cfg["seed"])
    next_cols = None
    if start < su.n_steps:
        e0, t0 = divmod(start, su.T)
        next_cols = ex.gather_ordered([dask.delayed(shard_tasks.step_words, pure=True)(
            states[g], seed, e0, t0, su.T, dask_key_name=f"svi-words-{ctx.token}-i{start}-g{g}")
            for g in range(len(su.groups))])
    heldout_cols = ex.gather_ordered([dask.delayed(shard_tasks.heldout_words, pure=True)(
        states[g], dask_key_name=f"svi-hwords-{ctx.token}-g{g}") for g in range(len(su.groups))])
    return next_cols, heldout_cols


def run(ctx, plan) -> dict:
    scfg = ctx.cfg["svi"]
    su = _setup(ctx)
    lda_model.log_corpus(ctx, su.info)  # MLflow dataset tracking: the corpus, with a digest
    t_prep = time.monotonic()
    states = _load_shards(ctx, su)
    state, history, start = _initial(ctx, su)
    next_cols, heldout_cols = _first_words(ctx, su, states, start)
    prepare_seconds = time.monotonic() - t_prep
    t_run = time.monotonic()
    state, history, docs_in_run = _train(ctx, su, states, state, history, start, next_cols, heldout_cols,
                                         int(scfg["checkpoint_every"]))
    if int(scfg.get("restarts", 0)):
        state, history, docs = _restarts(ctx, su, states, heldout_cols, state, history)
        docs_in_run += docs
    elapsed = time.monotonic() - t_run
    ctx.tracker.flush()
    result = report.finish(ctx, su, state, history, states, heldout_cols, elapsed, docs_in_run, prepare_seconds)
    lda_model.log_model(ctx, su.info, state.lam, su.alpha)  # the pyfunc model "lda_model"
    return result


def _train(ctx, su: Setup, states, state, history, start, next_cols, heldout_cols, ckpt_every) -> tuple:
    """Minibatch steps ``start`` .. the end: (final state, perplexity history, documents seen)."""
    eval_every = int(ctx.cfg["svi"]["eval_every"])
    bar = Progress(su.n_steps - start, "svi", "steps", enabled=ctx.progress)
    t_run = time.monotonic()
    docs_in_run = 0
    buf = np.zeros((su.K, su.V))
    for i in range(start, su.n_steps):
        state, next_cols, metrics, S_t = _step(ctx, su, states, state, i, next_cols, buf)
        docs_in_run += S_t
        done = i + 1
        if eval_every > 0 and (done % eval_every == 0 or done == su.n_steps):
            ppl, _ = report.heldout_perplexity(ctx, su, states, heldout_cols, state.lam)
            metrics["heldout_perplexity"] = ppl
            history.append({"step": done, "docs_seen": state.docs_seen, "perplexity": ppl,
                            "seconds": time.monotonic() - t_run})
        ctx.tracker.log_metrics(metrics, step=done)
        bar.update(1, docs_s=f"{docs_in_run / max(time.monotonic() - t_run, 1e-9):.0f}", rho=f"{metrics['rho']:.3f}",
                   **({"perplexity": f"{history[-1]['perplexity']:.1f}"} if history else {}))
        if ckpt_every > 0 and (done % ckpt_every == 0) and done < su.n_steps:
            artifacts.save_checkpoint(ctx.tracker, f"step_{done:07d}", dict(
                count=np.int64(state.count), lam=state.lam, docs_seen=np.int64(state.docs_seen),
                step_index=np.int64(done), history=np.array(json.dumps(history))))
    bar.close()
    return state, history, docs_in_run


def _restarts(ctx, su: Setup, states, heldout_cols, state0, history0) -> tuple:
    """``svi.restarts`` more fits from seeded initial topics (``svi.init(..., restart=r)``), each over the
    same minibatches; the one with the lowest held-out perplexity is kept (the first on a tie). Each
    restart's perplexity is the metric ``restart_heldout_perplexity`` at step r (0: the first fit)."""
    import dataclasses

    from pgmflow.pipelines.core.tracking import QuietTracker

    seed = int(ctx.cfg["seed"])
    best = (report.heldout_perplexity(ctx, su, states, heldout_cols, state0.lam)[0], 0, state0, history0)
    ctx.tracker.log_metrics({"restart_heldout_perplexity": best[0]}, step=0)
    found, docs = [best[0]], 0
    for r in range(1, int(ctx.cfg["svi"]["restarts"]) + 1):
        quiet = dataclasses.replace(ctx, tracker=QuietTracker(ctx.tracker, f"r{r}"), resumed=False)
        next_cols, _ = _first_words(quiet, su, states, 0)
        state, history, d = _train(quiet, su, states, svi.init(su.K, su.V, seed, restart=r), [], 0, next_cols,
                                   heldout_cols, 0)
        docs += d
        ppl = report.heldout_perplexity(ctx, su, states, heldout_cols, state.lam)[0]
        ctx.tracker.log_metrics({"restart_heldout_perplexity": ppl}, step=r)
        found.append(ppl)
        if ppl < best[0]:
            best = (ppl, r, state, history)
    ctx.say(f"{len(found) - 1} restart(s): held-out perplexity {', '.join(f'{v:.2f}' for v in found)}; kept restart "
            f"{best[1]}")
    ctx.tracker.set_tags({"pgmflow.svi.best_restart": best[1]})
    return best[2], best[3], docs
