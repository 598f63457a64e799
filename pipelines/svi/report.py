"""The end of an SVI run: held-out perplexity, topic coherence, topic recovery against a known truth,
the posterior-regularization report, and the artifacts (lambda, top-word tables, results, figures)."""

from __future__ import annotations

import io
import math
from pathlib import Path

import dask
import numpy as np

from pgmflow.pipelines.core import artifacts
from pgmflow.tasks.lda import evaluate, shard_tasks, svi


def finish(ctx, su, state, history, states, heldout_cols, elapsed, docs_in_run, prepare_seconds) -> dict:
    scfg = ctx.cfg["svi"]
    lam = state.lam
    ppl, n_test = heldout_perplexity(ctx, su, states, heldout_cols, lam)
    top = evaluate.top_words(lam, int(scfg["top_words"]))
    vocab = su.info.vocab
    names = [[(vocab[w] if vocab else str(int(w))) for w in row] for row in top]
    coherence = _coherence(ctx, su, states, top)
    result = {"objective": ppl, "heldout_perplexity": ppl, "heldout_tokens": n_test,
              "coherence_umass_mean": float(coherence.mean()), "coherence_umass": coherence.tolist(),
              "steps": state.count, "docs_seen": state.docs_seen, "train_docs": su.n_train,
              "docs_per_second": docs_in_run / elapsed if elapsed > 0 else float("nan"),
              "seconds": elapsed, "prepare_seconds": prepare_seconds, "driver_peak_rss_mb": _peak_rss_mb(),
              "top_words": names}
    if su.info.true_topics:
        true = np.load(su.info.true_topics)
        assign, cos = evaluate.match_topics(lam, true)
        result.update({"topic_recovery_mean_cosine": float(cos.mean()), "topic_recovery_min_cosine": float(cos.min()),
                       "true_model_perplexity": _true_perplexity(ctx, su, states, true),
                       "topic_assignment": assign.tolist()})
    if su.pr is not None:
        result.update(_pr_report(ctx, su, states, lam))
    artifacts.log_final_metrics(ctx.tracker, result, step=state.count)
    _log_artifacts(ctx, su, state, result, names, coherence, history)
    _print_summary(ctx.say, result, names)
    return result


def heldout_perplexity(ctx, su, states, heldout_cols, lam) -> tuple[float, float]:
    """(perplexity, test tokens) of the held-out documents, per-shard sums added in shard order."""
    scfg = ctx.cfg["svi"]
    rowsum = lam.sum(axis=1)
    outs = [dask.delayed(shard_tasks.heldout_group, pure=True)(
        states[g], heldout_cols[g], np.ascontiguousarray(lam[:, heldout_cols[g]]), rowsum, su.alpha,
        int(scfg["estep_max_iter"]), float(scfg["estep_tol"])) for g in range(len(su.groups))]
    res = ctx.executor.gather_ordered(outs, flatten=True, key=lambda r: r[0])
    n_tokens = math.fsum(r[2] for r in res)
    return evaluate.perplexity(math.fsum(r[1] for r in res), n_tokens), n_tokens


def _coherence(ctx, su, states, top) -> np.ndarray:
    """UMass topic coherence over the training documents, co-occurrences summed over shards in order."""
    ids = np.unique(top)
    parts = ctx.executor.gather_ordered([dask.delayed(shard_tasks.cooccurrence_group, pure=True)(
        states[g], ids, dask_key_name=f"svi-cooc-{ctx.token}-g{g}") for g in range(len(su.groups))],
        flatten=True, key=lambda r: r[0])
    df = np.zeros(ids.size)
    co = np.zeros((ids.size, ids.size))
    for _, d, c in parts:
        df += d
        co += c
    return evaluate.umass_coherence(top, ids, df, co)


def _log_artifacts(ctx, su, state, result, names, coherence, history):
    tracker, scfg = ctx.tracker, ctx.cfg["svi"]
    lam = state.lam
    artifacts.log_npz(tracker, "lambda.npz", dict(lam=lam, alpha=su.alpha, eta=np.float64(su.eta),
                                                  count=np.int64(state.count)), compressed=True)
    n_top = int(scfg["top_words"])
    rows = ["topic,coherence_umass," + ",".join(f"word_{i + 1}" for i in range(n_top))]
    for k in range(lam.shape[0]):
        rows.append(f"{k},{coherence[k]:.4f}," + ",".join(_csv_field(w) for w in names[k]))
    tracker.log_text("\n".join(rows) + "\n", "tables/top_words.csv")
    tracker.log_text(_top_words_markdown(names, coherence), "tables/top_words.md")
    artifacts.log_results(tracker, result)
    if scfg.get("figures", True):
        from pgmflow.pipelines.svi import figures

        artifacts.log_figures(tracker, figures.svi_figures(history, lam, names, su.info.vocab, coherence))


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


def _true_perplexity(ctx, su, states, true) -> float:
    """Held-out perplexity of the true model (synthetic corpora): the floor SVI should approach."""
    scfg = ctx.cfg["svi"]
    a_path = Path(su.info.path) / "true_alpha.npy"
    a_true = np.load(a_path) if a_path.exists() else su.alpha
    res = ctx.executor.gather_ordered([dask.delayed(shard_tasks.true_heldout_group, pure=True)(
        states[g], true, a_true, int(scfg["estep_max_iter"]), float(scfg["estep_tol"]),
        dask_key_name=f"svi-true-{ctx.token}-g{g}") for g in range(len(su.groups))], flatten=True, key=lambda r: r[0])
    return evaluate.perplexity(math.fsum(r[1] for r in res), math.fsum(r[2] for r in res))


def _pr_report(ctx, su, states, lam) -> dict:
    """How the constraints changed the document posteriors: topics used per document with and without PR."""
    scfg, ex, pr = ctx.cfg["svi"], ctx.executor, su.pr
    rowsum = lam.sum(axis=1)
    cols_g = ex.gather_ordered([dask.delayed(shard_tasks.words_of_group, pure=True)(
        states[g], dask_key_name=f"svi-prw-{ctx.token}-g{g}") for g in range(len(su.groups))])
    res = {"with": [], "without": []}
    for label, p in (("with", pr), ("without", None)):
        tasks = [dask.delayed(shard_tasks.gamma_group, pure=True)(
            states[g], cols_g[g], svi.exp_elog_beta(lam, cols_g[g], rowsum), su.alpha, int(scfg["estep_max_iter"]),
            float(scfg["estep_tol"]), p, dask_key_name=f"svi-prg-{label}-{ctx.token}-g{g}")
            for g in range(len(su.groups))]
        res[label] = [gam for grp in ex.gather_ordered(tasks) for _, _, gam in grp]
    out = {}
    for label in ("with", "without"):
        gam = np.concatenate(res[label]) if res[label] else np.zeros((0, lam.shape[0]))
        theta = gam / gam.sum(axis=1, keepdims=True)
        out[f"pr_topics_over_5pct_{label}"] = float(np.mean(np.sum(theta > 0.05, axis=1))) if len(theta) else 0.0
        if pr.seed_word_ids.size:
            k_seed = np.unique(pr.seed_topics)
            out[f"pr_seed_topic_mass_{label}"] = float(np.mean(theta[:, k_seed].sum(axis=1))) if len(theta) else 0.0
    return out


def _print_summary(say, result, names):
    say(f"held-out perplexity {result['heldout_perplexity']:.2f} on {result['heldout_tokens']:.0f} "
        f"test tokens; UMass coherence {result['coherence_umass_mean']:.2f}; "
        f"{result['docs_per_second']:.0f} documents/s", summary=True)
    if "topic_recovery_mean_cosine" in result:
        say(f"true topics recovered with mean cosine {result['topic_recovery_mean_cosine']:.3f} "
            f"(min {result['topic_recovery_min_cosine']:.3f}); true model's perplexity "
            f"{result['true_model_perplexity']:.2f}", summary=True)
    for k, row in enumerate(names[:10]):
        say(f"  topic {k:2d}: {' '.join(row[:8])}", prefix="")
    if len(names) > 10:
        say(f"  ... {len(names) - 10} more topics in tables/top_words.csv", prefix="")
