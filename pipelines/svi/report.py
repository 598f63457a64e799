"""The end of an SVI run: held-out perplexity, topic coherence, topic recovery against a known truth,
the posterior-regularization report, and the artifacts (lambda, top-word tables, results, figures)."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import NamedTuple

import dask
import numpy as np

from pgmflow.core import artifacts
from pgmflow.tasks.lda import evaluate, shard_tasks, svi


class Timing(NamedTuple):
    """Seconds of the fit (every step, restarts included) and of the preparation before it (shards
    loaded onto the workers, the first step's words)."""

    fit_seconds: float
    prepare_seconds: float


def finish(ctx, fit, trained, timing: Timing) -> dict:
    """Evaluate the final topics of ``trained`` (a ``run.Trained``), log the metrics and artifacts, print
    the summary; returns the results. ``fit`` is the run's ``run.Fit`` (plan, shard futures)."""
    plan, state = fit.plan, trained.state
    lam = state.lam
    ppl, n_test = heldout_perplexity(ctx, fit, lam)
    if not n_test:  # svi.heldout_fraction=0: no held-out perplexity, and so no objective to rank the run by
        ppl = None
    top = evaluate.top_words(lam, plan.outputs.top_words)
    vocab = plan.corpus.vocab
    names = [[(vocab[w] if vocab else str(int(w))) for w in row] for row in top]
    coherence = _coherence(ctx, fit, top)
    elapsed = timing.fit_seconds
    result = {
        "objective": ppl,
        "heldout_perplexity": ppl,
        "heldout_tokens": n_test,
        "coherence_umass_mean": float(coherence.mean()),
        "coherence_umass": coherence.tolist(),
        "steps": state.count,
        "docs_seen": state.docs_seen,
        "train_docs": plan.schedule.n_train,
        "docs_per_second": trained.docs / elapsed if elapsed > 0 else float("nan"),
        "seconds": elapsed,
        "prepare_seconds": timing.prepare_seconds,
        "driver_peak_rss_mb": _peak_rss_mb(),
        "top_words": names,
    }
    if ppl is None:
        result["objective_note"] = "no held-out documents (svi.heldout_fraction=0): the run has no objective"
    if plan.corpus.true_topics:
        true = np.load(plan.corpus.true_topics)
        assign, cos = evaluate.match_topics(lam, true)
        result.update(
            {
                "topic_recovery_mean_cosine": float(cos.mean()),
                "topic_recovery_min_cosine": float(cos.min()),
                "true_model_perplexity": _true_perplexity(ctx, fit, true),
                "topic_assignment": assign.tolist(),
            }
        )
    if plan.constraints is not None:
        result.update(_pr_report(ctx, fit, lam))
    artifacts.log_final_metrics(ctx.tracker, result, step=state.count)
    _log_artifacts(ctx, plan, trained, result, Topics(names, coherence))
    _print_summary(ctx.say, result, names)
    return result


class Topics(NamedTuple):
    """The final topics' top words (names, [K][top_words]) and UMass coherence (Mimno et al. 2011), float64 [K]."""

    names: list
    coherence: np.ndarray


def heldout_perplexity(ctx, fit, lam) -> tuple[float, float]:
    """(perplexity, test tokens) of the held-out documents by document completion (Hoffman, Blei, Bach
    2010, Sec. 4), per-shard sums added in shard order."""
    plan = fit.plan
    rowsum = lam.sum(axis=1)
    alpha = plan.model.alpha_vector()
    outs = [
        dask.delayed(shard_tasks.heldout_group, pure=True)(
            fit.states[g],
            fit.heldout_cols[g],
            np.ascontiguousarray(lam[:, fit.heldout_cols[g]]),
            rowsum,
            alpha,
            plan.estep.max_iter,
            plan.estep.tol,
        )
        for g in range(len(fit.groups))
    ]
    res = ctx.executor.gather_ordered(outs, flatten=True, key=lambda r: r[0])
    n_tokens = math.fsum(r[2] for r in res)
    return evaluate.perplexity(math.fsum(r[1] for r in res), n_tokens), n_tokens


def _coherence(ctx, fit, top) -> np.ndarray:
    """UMass topic coherence over the training documents, co-occurrences summed over shards in order."""
    ids = np.unique(top)
    parts = ctx.executor.gather_ordered(
        [
            dask.delayed(shard_tasks.cooccurrence_group, pure=True)(
                fit.states[g], ids, dask_key_name=f"svi-cooc-{ctx.token}-g{g}"
            )
            for g in range(len(fit.groups))
        ],
        flatten=True,
        key=lambda r: r[0],
    )
    df = np.zeros(ids.size)
    co = np.zeros((ids.size, ids.size))
    for _, d, c in parts:
        df += d
        co += c
    return evaluate.umass_coherence(top, ids, df, co)


def _log_artifacts(ctx, plan, trained, result: dict, topics: Topics):
    tracker, state = ctx.tracker, trained.state
    lam = state.lam
    artifacts.log_npz(
        tracker,
        "lambda.npz",
        dict(lam=lam, alpha=plan.model.alpha_vector(), eta=np.float64(plan.model.eta), count=np.int64(state.count)),
        compressed=True,
    )
    n_top = plan.outputs.top_words
    rows = ["topic,coherence_umass," + ",".join(f"word_{i + 1}" for i in range(n_top))]
    for k in range(lam.shape[0]):
        rows.append(f"{k},{topics.coherence[k]:.4f}," + ",".join(_csv_field(w) for w in topics.names[k]))
    tracker.log_text("\n".join(rows) + "\n", "tables/top_words.csv")
    tracker.log_text(_top_words_markdown(topics.names, topics.coherence), "tables/top_words.md")
    artifacts.log_results(tracker, result)
    if plan.outputs.figures:
        from pgmflow.svi import figures

        artifacts.log_figures(tracker, figures.svi_figures(trained.history, lam, topics, plan.corpus.vocab))


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


def _true_perplexity(ctx, fit, true) -> float:
    """Held-out perplexity of the true model (synthetic corpora): the floor SVI should approach."""
    plan = fit.plan
    a_path = Path(plan.corpus.path) / "true_alpha.npy"
    a_true = np.load(a_path) if a_path.exists() else plan.model.alpha_vector()
    res = ctx.executor.gather_ordered(
        [
            dask.delayed(shard_tasks.true_heldout_group, pure=True)(
                fit.states[g],
                true,
                a_true,
                plan.estep.max_iter,
                plan.estep.tol,
                dask_key_name=f"svi-true-{ctx.token}-g{g}",
            )
            for g in range(len(fit.groups))
        ],
        flatten=True,
        key=lambda r: r[0],
    )
    return evaluate.perplexity(math.fsum(r[1] for r in res), math.fsum(r[2] for r in res))


def _pr_report(ctx, fit, lam) -> dict:
    """How the constraints (Ganchev et al. 2010) changed the document posteriors: topics used per
    document with and without posterior regularization."""
    plan, ex = fit.plan, ctx.executor
    pr = plan.constraints
    rowsum = lam.sum(axis=1)
    alpha = plan.model.alpha_vector()
    cols_g = ex.gather_ordered(
        [
            dask.delayed(shard_tasks.words_of_group, pure=True)(
                fit.states[g], dask_key_name=f"svi-prw-{ctx.token}-g{g}"
            )
            for g in range(len(fit.groups))
        ]
    )
    res = {"with": [], "without": []}
    for label, p in (("with", pr), ("without", None)):
        tasks = [
            dask.delayed(shard_tasks.gamma_group, pure=True)(
                fit.states[g],
                cols_g[g],
                svi.exp_elog_beta(lam, cols_g[g], rowsum),
                alpha,
                plan.estep.max_iter,
                plan.estep.tol,
                p,
                dask_key_name=f"svi-prg-{label}-{ctx.token}-g{g}",
            )
            for g in range(len(fit.groups))
        ]
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
    held = (
        f"held-out perplexity {result['heldout_perplexity']:.2f} on {result['heldout_tokens']:.0f} test tokens"
        if result["heldout_perplexity"] is not None
        else "no held-out documents (svi.heldout_fraction=0), so no held-out perplexity and no objective"
    )
    say(
        f"{held}; UMass coherence {result['coherence_umass_mean']:.2f}; {result['docs_per_second']:.0f} documents/s",
        summary=True,
    )
    if "topic_recovery_mean_cosine" in result:
        say(
            f"true topics recovered with mean cosine {result['topic_recovery_mean_cosine']:.3f} "
            f"(min {result['topic_recovery_min_cosine']:.3f}); true model's perplexity "
            f"{result['true_model_perplexity']:.2f}",
            summary=True,
        )
    for k, row in enumerate(names[:10]):
        say(f"  topic {k:2d}: {' '.join(row[:8])}", prefix="")
    if len(names) > 10:
        say(f"  ... {len(names) - 10} more topics in tables/top_words.csv", prefix="")
