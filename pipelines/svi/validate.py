"""Validation of pipeline=svi: the svi, model (LDA), pr and corpus sections, then the corpus itself."""

from __future__ import annotations

from pgmflow.pipelines.core.errors import ConfigError
from pgmflow.pipelines.core.validation import apply, boolean, get, integer, real, unknown_keys

SVI_MODELS = ("lda",)

SVI = {
    "batch_size": integer(lo=1),
    "tau0": real(ge=0),
    "n_epochs": integer(lo=1),
    "estep_max_iter": integer(lo=1, hi=100_000),
    "estep_tol": real(gt=0),
    "eval_every": integer(lo=0),
    "checkpoint_every": integer(lo=0),
    "restarts": integer(lo=0, hi=1000),
    "keep_in_memory": boolean,
    "top_words": integer(lo=1, hi=1000),
    "figures": boolean,
}
LDA = {"K": integer(lo=2, hi=100_000)}
PR_KEYS = {"seed_words", "seed_mass", "topic_cap", "max_iter", "tol"}
CORPUS_KEYS = {
    "shipped": {"name"},
    "synthetic": {"n_docs", "n_words", "n_topics", "alpha", "eta", "mean_length", "seed", "docs_per_shard",
                  "cache_dir"},
    "uci": {"docword", "vocab", "docs_per_shard", "cache_dir"},
    "text": {"folder", "pattern", "min_df", "max_df", "max_vocab", "stop_words", "docs_per_shard", "cache_dir"},
    "matrix_market": {"path", "vocab", "transpose", "docs_per_shard", "cache_dir"},
    "npz": {"path", "docs_per_shard", "cache_dir"},
    "sharded": {"path"},
}
SYNTHETIC = {"n_docs": integer(lo=1), "n_words": integer(lo=2), "n_topics": integer(lo=1), "alpha": real(gt=0),
             "eta": real(gt=0), "mean_length": real(gt=0), "seed": integer(lo=0), "docs_per_shard": integer(lo=1)}


def _optional_positive(path, v):
    if v is not None:
        real(gt=0)(path, v)


def check_svi(cfg: dict):
    """Every field of an SVI run, then the corpus itself (converted and checked before any task runs)."""
    unknown_keys(cfg, "svi", set(SVI) | {"kappa", "max_steps", "heldout_fraction", "max_heldout_docs"})
    apply(cfg, {f"svi.{k}": r for k, r in SVI.items()})
    s = cfg["svi"]
    kappa = get(cfg, "svi.kappa")
    real()("svi.kappa", kappa)
    if not 0.5 < float(kappa) <= 1.0:
        raise ConfigError("svi.kappa", kappa, "must lie in (0.5, 1] for the step sizes to satisfy Robbins-Monro "
                          "(sum rho = inf, sum rho^2 < inf)", "use e.g. svi.kappa=0.7")
    if s.get("max_steps") is not None:
        integer(lo=1)("svi.max_steps", s["max_steps"])
    f = get(cfg, "svi.heldout_fraction")
    real(ge=0)("svi.heldout_fraction", f)
    if f >= 1:
        raise ConfigError("svi.heldout_fraction", f, "must be below 1 (some documents must be left for training)",
                          "use e.g. svi.heldout_fraction=0.05")
    if s.get("max_heldout_docs") is not None:
        integer(lo=1)("svi.max_heldout_docs", s["max_heldout_docs"])
    model = cfg.get("model") or {}
    if model.get("name") not in SVI_MODELS:
        raise ConfigError("model", model.get("name"), "pipeline=svi fits topic models",
                          "use model=lda (or drop the model= override)")
    unknown_keys(cfg, "model", set(LDA) | {"name", "alpha", "eta"})
    apply(cfg, {f"model.{k}": r for k, r in LDA.items()})
    _optional_positive("model.alpha", model.get("alpha"))
    _optional_positive("model.eta", model.get("eta"))
    unknown_keys(cfg, "pr", PR_KEYS)
    pr = cfg.get("pr") or {}
    mass = pr.get("seed_mass", 0.7)
    if not isinstance(mass, dict):  # a dict (per topic) is checked by make_pr_config
        real(gt=0)("pr.seed_mass", mass)
        if mass > 1:
            raise ConfigError("pr.seed_mass", mass, "no distribution over topics can put more than all its mass "
                              "on one topic", "use a mass in (0, 1]")
    if pr.get("topic_cap") is not None:
        real()("pr.topic_cap", pr["topic_cap"])
        if pr["topic_cap"] < 1:
            raise ConfigError("pr.topic_cap", pr["topic_cap"], "no distribution can satisfy it: every token puts "
                              "mass 1 on some topic, so sum_k max_n q_n(k) >= 1", "use pr.topic_cap >= 1 (or null)")
    integer(lo=1)("pr.max_iter", pr.get("max_iter", 200))
    real(gt=0)("pr.tol", pr.get("tol", 1e-6))
    c = cfg.get("corpus")
    if not isinstance(c, dict) or "kind" not in c:
        raise ConfigError("corpus", c, "pipeline=svi needs a corpus", "use corpus=docstrings, corpus=synthetic, "
                          "corpus=uci corpus.docword=... corpus.vocab=..., corpus=text corpus.folder=...")
    from pgmflow.pipelines.svi import corpora

    if c["kind"] not in CORPUS_KEYS:
        raise ConfigError("corpus.kind", c["kind"], "unknown corpus source", f"use one of: {', '.join(CORPUS_KEYS)}")
    unknown_keys(cfg, "corpus", CORPUS_KEYS[c["kind"]] | {"kind"})
    if c["kind"] == "synthetic":
        apply(cfg, {f"corpus.{k}": r for k, r in SYNTHETIC.items()})
    elif "docs_per_shard" in c:
        integer(lo=1)("corpus.docs_per_shard", c["docs_per_shard"])
    info = corpora.resolve(cfg)
    corpora.pr_config(cfg, info)  # word lookups and feasibility

