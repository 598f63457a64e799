"""SVI figures logged to MLflow: held-out perplexity, topics."""

from __future__ import annotations

import numpy as np

from pgmflow.core.plotting import plt


def svi_figures(history: list, lam: np.ndarray, topics: tuple, vocab: tuple | None) -> dict:
    """Figures of an SVI run for LDA: held-out perplexity against documents seen (``history``, one
    entry per evaluation), the top words of each topic with its UMass coherence (``topics``, a ``report.Topics``),
    and a topic-word heatmap of ``lam`` [K, V] over the leading words of every topic (labelled by ``vocab``)."""
    names, coherence = topics
    figs = {}
    if history:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([h["docs_seen"] for h in history], [h["perplexity"] for h in history], "o-")
        ax.set_xlabel("documents seen")
        ax.set_ylabel("held-out perplexity (document completion)")
        ax.set_title("SVI for LDA: held-out perplexity")
        ax.grid(alpha=0.3)
        figs["perplexity"] = fig
    K = lam.shape[0]
    n_show = min(8, len(names[0]) if names else 0)
    fig, ax = plt.subplots(figsize=(min(14, 2 + 1.2 * n_show), 0.35 * K + 1))
    ax.axis("off")
    for k in range(K):
        ax.text(
            0.0,
            1 - (k + 0.5) / K,
            f"{k:>3d}  ({coherence[k]:6.1f})  " + "  ".join(names[k][:n_show]),
            family="monospace",
            fontsize=9,
            va="center",
            transform=ax.transAxes,
        )
    ax.set_title("top words per topic (UMass coherence)")
    figs["top_words"] = fig
    beta = lam / lam.sum(axis=1, keepdims=True)
    lead = []
    for k in range(K):
        for w in np.argsort(-beta[k])[:3]:
            if w not in lead:
                lead.append(int(w))
    lead = lead[:60]
    fig, ax = plt.subplots(figsize=(min(16, 2 + 0.25 * len(lead)), 0.3 * K + 2))
    im = ax.imshow(beta[:, lead], aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(lead)))
    ax.set_xticklabels([vocab[w] if vocab else str(w) for w in lead], rotation=90, fontsize=7)
    ax.set_ylabel("topic")
    ax.set_title("topic-word probabilities of each topic's leading words")
    fig.colorbar(im, ax=ax, fraction=0.03)
    fig.tight_layout()
    figs["topic_word_heatmap"] = fig
    return figs
