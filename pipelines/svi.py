"""Stochastic variational inference for LDA: the graph builder, the ordered reduce, evaluation,
checkpoints and logging.

One minibatch step ``t``::

    driver: lambda --exp(E[log beta]) of the words group g needs--> estep(group g, step t)   one task per worker
    worker: its shards' documents of step t --E-step--> per-shard statistics (+ the words of step t+1)
    driver: sum the per-shard statistics in shard order -> lambda <- (1-rho) lambda + rho (eta + D/S sstats)

Shards are loaded once by the worker that keeps them (``prepare`` tasks pinned to a worker); later
tasks take their futures, so the corpus never travels. Only the topic-word columns a group's
documents use go out, and only per-shard statistics over the words used come back. Which documents
form step ``t`` depends on (seed, shard, epoch, step) alone (``tasks.lda.shard_tasks``), and the
statistics are summed in shard order, so lambda is bit-identical for any number of workers.
"""

from __future__ import annotations

import io
import json
import math
import tempfile
import time
from pathlib import Path

import dask
import numpy as np

from pipelines import corpora
from pipelines.progress import Progress
from tasks.lda import evaluate, shard_tasks, svi

CHECKPOINT_DIR = "checkpoints"


# --- placement --------------------------------------------------------------------------------

def _groups(n_shards: int, workers: list[str]) -> list[list[int]]:
    """Shards per worker, round-robin (group g is held by workers[g])."""
    W = max(1, len(workers))
    return [[j for j in range(n_shards) if j % W == g] for g in range(min(W, n_shards))]


def _annotate(ex, worker):
    if ex.distributed and worker is not None:
        return dask.annotate(workers=[worker], allow_other_workers=True)
    import contextlib

    return contextlib.nullcontext()


# --- checkpoints ------------------------------------------------------------------------------

def _save_checkpoint(path: Path, state: svi.SVIState, history: list, step_index: int):
    np.savez(path, count=np.int64(state.count), lam=state.lam, docs_seen=np.int64(state.docs_seen),
             step_index=np.int64(step_index), history=np.array(json.dumps(history)))


def _load_checkpoint(tracker):
    try:
        names = sorted(tracker.list_artifacts(CHECKPOINT_DIR))
    except Exception:
        return None
    for name in reversed(names):
        try:
            with np.load(tracker.download(name), allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        except Exception:
            continue  # cut short by the interruption: use the previous one
    return None


# --- the run ----------------------------------------------------------------------------------

def run(ctx) -> dict:
    cfg = ctx.cfg
    scfg, mcfg = cfg["svi"], cfg["model"]
    seed = int(cfg["seed"])
    tracker, ex = ctx.tracker, ctx.executor
    info = corpora.resolve(cfg)
    K = int(mcfg["K"])
    V = int(info.n_words)
    alpha = np.full(K, float(mcfg["alpha"]) if mcfg.get("alpha") is not None else 1.0 / K)
    eta = float(mcfg["eta"]) if mcfg.get("eta") is not None else 1.0 / K
    pr = corpora.pr_config(cfg, info)
    tau0, kappa = float(scfg["tau0"]), float(scfg["kappa"])
    max_iter, tol = int(scfg["estep_max_iter"]), float(scfg["estep_tol"])
    n_shards = len(info.shard_docs)
    heldout_fraction = corpora.heldout_fraction(scfg, info.n_docs)
    n_train = sum(shard_tasks.train_split(n, seed, j, heldout_fraction).size for j, n in enumerate(info.shard_docs))
    if n_train == 0:
        from pipelines.errors import ConfigError

        raise ConfigError("svi.heldout_fraction", scfg["heldout_fraction"], "no training documents are left",
                          "lower svi.heldout_fraction")
    S = min(int(scfg["batch_size"]), n_train)
    T = max(1, math.ceil(n_train / S))  # steps per epoch
    n_steps = T * int(scfg["n_epochs"])
    if scfg.get("max_steps"):
        n_steps = min(n_steps, int(scfg["max_steps"]))
    tok = tracker.run_id[:12]
    workers = sorted(ex.client.scheduler_info()["workers"]) if ex.distributed else [None]
    groups = _groups(n_shards, workers)
    group_worker = [workers[g] if ex.distributed else None for g in range(len(groups))]
    tracker.set_tags({"pgmflow.svi.corpus": info.meta.get("source", info.path), "pgmflow.svi.shards": n_shards,
                      "pgmflow.svi.groups": len(groups), "pgmflow.svi.pr": pr is not None})
    tracker.log_metrics({"corpus_docs": info.n_docs, "corpus_words": V, "corpus_tokens": info.n_tokens,
                         "train_docs": n_train, "steps_per_epoch": T}, step=0)
    print(f"pgmflow: corpus {info.path}: {info.n_docs} documents ({n_train} for training), {V} words, "
          f"{n_shards} shards; K={K}, S={S}, {n_steps} steps", flush=True)

    # ---- shards onto the workers (once) ----------------------------------------------------
    keep = bool(scfg["keep_in_memory"])
    t_prep = time.monotonic()
    prep = []
    for g, shards in enumerate(groups):
        with _annotate(ex, group_worker[g]):
            prep.append([dask.delayed(shard_tasks.prepare_shard, pure=True)(
                info.path, j, seed, heldout_fraction, keep, dask_key_name=f"svi-shard-{tok}-j{j}") for j in shards])
    flat = [d for grp in prep for d in grp]
    handles = ex.compute(flat)
    it = iter(handles)
    states = [[next(it) for _ in grp] for grp in prep]

    # ---- initial state or checkpoint --------------------------------------------------------
    ckpt = _load_checkpoint(tracker) if ctx.resumed else None
    if ckpt is not None:
        state = svi.SVIState(int(ckpt["count"]), np.array(ckpt["lam"]), int(ckpt["docs_seen"]))
        history = json.loads(str(ckpt["history"]))
        start = int(ckpt["step_index"])
        print(f"pgmflow: resuming after step {start} of {n_steps}", flush=True)
    else:
        state = svi.init(K, V, seed)
        history = []
        start = 0

    def plan(i):
        return divmod(i, T)  # (epoch, step within the epoch)

    # words needed by each group for the first step
    if start < n_steps:
        e0, t0 = plan(start)
        words = [dask.delayed(shard_tasks.step_words, pure=True)(states[g], seed, e0, t0, T,
                                                                 dask_key_name=f"svi-words-{tok}-i{start}-g{g}")
                 for g in range(len(groups))]
        next_cols = ex.gather(ex.compute(words))
    heldout_cols = ex.gather(ex.compute([dask.delayed(shard_tasks.heldout_words, pure=True)(
        states[g], dask_key_name=f"svi-hwords-{tok}-g{g}") for g in range(len(groups))]))
    prepare_seconds = time.monotonic() - t_prep

    def heldout_perplexity(lam):
        rowsum = lam.sum(axis=1)
        outs = [dask.delayed(shard_tasks.heldout_group, pure=True)(
            states[g], heldout_cols[g], np.ascontiguousarray(lam[:, heldout_cols[g]]), rowsum, alpha, max_iter, tol)
            for g in range(len(groups))]
        res = sorted((r for grp in ex.gather(ex.compute(outs)) for r in grp), key=lambda r: r[0])
        ll = math.fsum(r[1] for r in res)
        nt = math.fsum(r[2] for r in res)
        return evaluate.perplexity(ll, nt), nt

    eval_every = int(scfg["eval_every"])
    ckpt_every = int(scfg["checkpoint_every"])
    bar = Progress(n_steps - start, "svi", "steps", enabled=ctx.progress)
    t_run = time.monotonic()
    docs_in_run = 0
    buf = np.zeros((K, V))
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(start, n_steps):
            epoch, step = plan(i)
            nxt = plan(i + 1) if i + 1 < n_steps else None
            t0 = time.monotonic()
            union = np.unique(np.concatenate([np.zeros(0, np.int64)] + list(next_cols)))
            eeb_union = corpora.exp_elog_beta(state.lam, union)  # [C, K], one array for every group
            outs = []
            for g in range(len(groups)):
                pos = np.searchsorted(union, next_cols[g])
                with _annotate(ex, group_worker[g]):
                    outs.append(dask.delayed(shard_tasks.estep_group, pure=True, nout=2)(
                        states[g], seed, epoch, step, T, next_cols[g], np.ascontiguousarray(eeb_union[pos]), alpha,
                        max_iter, tol, pr, nxt, ctx.backend,
                        dask_key_name=f"svi-estep-{tok}-i{i}-g{g}"))
            results = ex.gather(ex.compute(outs))
            per_shard = sorted((s for grp, _ in results for s in grp), key=lambda s: s.index)
            next_cols = [n for _, n in results]
            # ordered reduce: shard 0, 1, 2, ... whatever the grouping
            for s in per_shard:
                buf[:, s.cols] += s.sstats.T
            S_t = sum(s.n_docs for s in per_shard)
            bound = math.fsum(s.doc_bound for s in per_shard)
            ntok = math.fsum(s.n_tokens for s in per_shard)
            state, sinfo = svi.update(state, buf, S_t, n_train, eta, tau0, kappa)
            buf[:] = 0.0
            dt = time.monotonic() - t0
            docs_in_run += S_t
            metrics = {"rho": sinfo.rho, "batch_docs": S_t,
                       "batch_bound_per_word": bound / ntok if ntok else float("nan"),
                       "docs_per_second": S_t / dt if dt > 0 else float("nan"), "docs_seen": state.docs_seen,
                       "estep_iterations_per_doc": sum(s.iterations for s in per_shard) / max(S_t, 1),
                       "step_seconds": dt, "estep_seconds_max_worker": max(
                           sum(s.seconds for s in grp) for grp, _ in results)}
            done = i + 1
            if eval_every > 0 and (done % eval_every == 0 or done == n_steps):
                ppl, _ = heldout_perplexity(state.lam)
                metrics["heldout_perplexity"] = ppl
                history.append({"step": done, "docs_seen": state.docs_seen, "perplexity": ppl,
                                "seconds": time.monotonic() - t_run})
            tracker.log_metrics(metrics, step=done)
            bar.update(1, docs_s=f"{docs_in_run / max(time.monotonic() - t_run, 1e-9):.0f}",
                       rho=f"{sinfo.rho:.3f}", **({"perplexity": f"{history[-1]['perplexity']:.1f}"}
                                                   if history else {}))
            if ckpt_every > 0 and (done % ckpt_every == 0) and done < n_steps:
                p = Path(tmp) / f"step_{done:07d}.npz"
                _save_checkpoint(p, state, history, done)
                tracker.log_artifact(p, CHECKPOINT_DIR)
                p.unlink()
        bar.close()
        elapsed = time.monotonic() - t_run
        tracker.flush()
        result = _finish(ctx, cfg, info, state, history, states, groups, alpha, eta, pr, heldout_perplexity,
                         n_train, elapsed, docs_in_run, tmp, prepare_seconds)
    return result


def _finish(ctx, cfg, info, state, history, states, groups, alpha, eta, pr, heldout_perplexity, n_train, elapsed,
            docs_in_run, tmp, prepare_seconds) -> dict:
    from pipelines import figures

    tracker, ex = ctx.tracker, ctx.executor
    scfg = cfg["svi"]
    tok = tracker.run_id[:12]
    lam = state.lam
    K = lam.shape[0]
    ppl, n_test = heldout_perplexity(lam)
    n_top = int(scfg["top_words"])
    top = evaluate.top_words(lam, n_top)
    vocab = info.vocab
    names = [[(vocab[w] if vocab else str(int(w))) for w in row] for row in top]
    # topic coherence (UMass) over the training documents, co-occurrences summed over shards
    ids = np.unique(top)
    co_parts = ex.gather(ex.compute([dask.delayed(shard_tasks.cooccurrence_group, pure=True)(
        states[g], ids, dask_key_name=f"svi-cooc-{tok}-g{g}") for g in range(len(groups))]))
    df = np.zeros(ids.size)
    co = np.zeros((ids.size, ids.size))
    for _, d, c in sorted((r for grp in co_parts for r in grp), key=lambda r: r[0]):
        df += d
        co += c
    coherence = evaluate.umass_coherence(top, ids, df, co)
    result = {"objective": ppl, "heldout_perplexity": ppl, "heldout_tokens": n_test,
              "coherence_umass_mean": float(coherence.mean()), "coherence_umass": coherence.tolist(),
              "steps": state.count, "docs_seen": state.docs_seen, "train_docs": n_train,
              "docs_per_second": docs_in_run / elapsed if elapsed > 0 else float("nan"),
              "seconds": elapsed, "prepare_seconds": prepare_seconds, "driver_peak_rss_mb": _peak_rss_mb(),
              "top_words": names}
    if info.true_topics:
        true = np.load(info.true_topics)
        assign, cos = evaluate.match_topics(lam, true)
        ll_true = _true_perplexity(ctx, states, groups, true, info, alpha, scfg, tok)
        result.update({"topic_recovery_mean_cosine": float(cos.mean()), "topic_recovery_min_cosine": float(cos.min()),
                       "true_model_perplexity": ll_true, "topic_assignment": assign.tolist()})
    if pr is not None:
        result.update(_pr_report(ctx, states, groups, lam, alpha, pr, scfg, tok))
    final = {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    tracker.log_metrics({f"final_{k}": v for k, v in final.items()}, step=state.count, flush=True)
    # artifacts: lambda, the top words table, results, figures
    p = Path(tmp) / "lambda.npz"
    np.savez_compressed(p, lam=lam, alpha=alpha, eta=np.float64(eta), count=np.int64(state.count))
    tracker.log_artifact(p)
    rows = ["topic,coherence_umass," + ",".join(f"word_{i + 1}" for i in range(n_top))]
    for k in range(K):
        rows.append(f"{k},{coherence[k]:.4f}," + ",".join(_csv_field(w) for w in names[k]))
    tracker.log_text("\n".join(rows) + "\n", "tables/top_words.csv")
    tracker.log_text(_top_words_markdown(names, coherence), "tables/top_words.md")
    tracker.log_dict({k: v for k, v in result.items()}, "results.json")
    if scfg.get("figures", True):
        for name, fig in figures.svi_figures(history, lam, names, vocab, coherence).items():
            tracker.log_figure(fig, f"figures/{name}.png")
            figures.close(fig)
    _print_summary(result, names)
    return result


def _peak_rss_mb() -> float:
    """Peak resident memory of this (driver) process so far, in MiB."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _csv_field(s: str) -> str:
    return '"' + s.replace('"', '""') + '"' if ("," in s or '"' in s) else s


def _top_words_markdown(names, coherence) -> str:
    out = io.StringIO()
    out.write("| topic | UMass | top words |\n| --- | --- | --- |\n")
    for k, row in enumerate(names):
        out.write(f"| {k} | {coherence[k]:.1f} | {' '.join(row)} |\n")
    return out.getvalue()


def _true_perplexity(ctx, states, groups, true, info, alpha, scfg, tok) -> float:
    """Held-out perplexity of the true model (synthetic corpora): the floor SVI should approach."""
    ex = ctx.executor
    a_path = Path(info.path) / "true_alpha.npy"
    a_true = np.load(a_path) if a_path.exists() else alpha
    outs = [dask.delayed(_true_heldout, pure=True)(states[g], true, a_true, int(scfg["estep_max_iter"]),
                                                   float(scfg["estep_tol"]), dask_key_name=f"svi-true-{tok}-g{g}")
            for g in range(len(groups))]
    res = sorted((r for grp in ex.gather(ex.compute(outs)) for r in grp), key=lambda r: r[0])
    return evaluate.perplexity(math.fsum(r[1] for r in res), math.fsum(r[2] for r in res))


def _true_heldout(states, topics, alpha, max_iter, tol):
    return [(st.index, *evaluate.completion_log_likelihood(st.heldout_obs, st.heldout_test, alpha, topics=topics,
                                                           max_iter=max_iter, tol=tol)) for st in states]


def _pr_report(ctx, states, groups, lam, alpha, pr, scfg, tok) -> dict:
    """How the constraints changed the document posteriors: topics used per document with and without PR."""
    ex = ctx.executor
    rowsum = lam.sum(axis=1)
    outs = []
    for g in range(len(groups)):
        cols_d = dask.delayed(shard_tasks.words_of_group, pure=True)(states[g], dask_key_name=f"svi-prw-{tok}-g{g}")
        outs.append(cols_d)
    cols_g = ex.gather(ex.compute(outs))
    res = {"with": [], "without": []}
    for label, p in (("with", pr), ("without", None)):
        tasks = []
        for g in range(len(groups)):
            eeb = corpora.exp_elog_beta(lam, cols_g[g], rowsum)
            tasks.append(dask.delayed(shard_tasks.gamma_group, pure=True)(
                states[g], cols_g[g], eeb, alpha, int(scfg["estep_max_iter"]), float(scfg["estep_tol"]), p,
                dask_key_name=f"svi-prg-{label}-{tok}-g{g}"))
        for grp in ex.gather(ex.compute(tasks)):
            for _, _, gam in grp:
                res[label].append(gam)
    out = {}
    for label in ("with", "without"):
        gam = np.concatenate(res[label]) if res[label] else np.zeros((0, lam.shape[0]))
        theta = gam / gam.sum(axis=1, keepdims=True)
        out[f"pr_topics_over_5pct_{label}"] = float(np.mean(np.sum(theta > 0.05, axis=1))) if len(theta) else 0.0
        if pr.seed_word_ids.size:
            k_seed = np.unique(pr.seed_topics)
            out[f"pr_seed_topic_mass_{label}"] = float(np.mean(theta[:, k_seed].sum(axis=1))) if len(theta) else 0.0
    return out


def _print_summary(result, names):
    print(f"pgmflow: held-out perplexity {result['heldout_perplexity']:.2f} on {result['heldout_tokens']:.0f} "
          f"test tokens; UMass coherence {result['coherence_umass_mean']:.2f}; "
          f"{result['docs_per_second']:.0f} documents/s", flush=True)
    if "topic_recovery_mean_cosine" in result:
        print(f"pgmflow: true topics recovered with mean cosine {result['topic_recovery_mean_cosine']:.3f} "
              f"(min {result['topic_recovery_min_cosine']:.3f}); true model's perplexity "
              f"{result['true_model_perplexity']:.2f}", flush=True)
    for k, row in enumerate(names[:10]):
        print(f"  topic {k:2d}: {' '.join(row[:8])}", flush=True)
    if len(names) > 10:
        print(f"  ... {len(names) - 10} more topics in tables/top_words.csv", flush=True)
