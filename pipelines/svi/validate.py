"""Validation of pipeline=svi: the svi, model (LDA), pr and corpus sections, then the corpus itself.

The only module of the workload that reads the config: :func:`check_svi` returns the run's
:class:`~pgmflow.svi.plan.Plan`, with the corpus opened and checked once.
"""

from __future__ import annotations

import json
import math

from pgmflow.core.errors import ConfigError
from pgmflow.core.validation import apply, boolean, get, integer, real, unknown_keys
from pgmflow.svi import corpora
from pgmflow.svi.plan import EStep, HeldOut, LDAModel, Outputs, Plan, PRSettings, Schedule, StepSize

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
    "synthetic": {
        "n_docs",
        "n_words",
        "n_topics",
        "alpha",
        "eta",
        "mean_length",
        "seed",
        "docs_per_shard",
        "cache_dir",
    },
    "uci": {"docword", "vocab", "docs_per_shard", "cache_dir"},
    "text": {"folder", "pattern", "min_df", "max_df", "max_vocab", "stop_words", "docs_per_shard", "cache_dir"},
    "matrix_market": {"path", "vocab", "transpose", "docs_per_shard", "cache_dir"},
    "npz": {"path", "docs_per_shard", "cache_dir"},
    "sharded": {"path"},
}
SYNTHETIC = {
    "n_docs": integer(lo=1),
    "n_words": integer(lo=2),
    "n_topics": integer(lo=1),
    "alpha": real(gt=0),
    "eta": real(gt=0),
    "mean_length": real(gt=0),
    "seed": integer(lo=0),
    "docs_per_shard": integer(lo=1),
}


def _optional_positive(path, v):
    if v is not None:
        real(gt=0)(path, v)


def check_svi(cfg: dict) -> Plan:
    """Every field of an SVI run, then the corpus itself (converted and checked before any task runs);
    returns the run's plan."""
    s = _check_svi_section(cfg)
    model = _check_model(cfg)
    pr = _check_pr(cfg)
    source = corpus_source(_check_corpus(cfg))
    info = corpora.open_checked(source)  # the one time a run opens its corpus
    K = int(model["K"])
    lda = LDAModel(K=K, alpha=_symmetric_prior(model.get("alpha"), K), eta=_symmetric_prior(model.get("eta"), K))
    settings = PRSettings(
        seed_words=pr.get("seed_words"),
        seed_mass=pr.get("seed_mass", 0.7),
        topic_cap=pr.get("topic_cap"),
        max_iter=int(pr.get("max_iter", 200)),
        tol=float(pr.get("tol", 1e-6)),
    )
    constraints = pr_constraints(settings, lda.K, info)  # word lookups and feasibility
    seed = int(cfg["seed"])
    heldout = heldout_settings(s)
    fraction = heldout.fraction_for(info.n_docs)
    return Plan(
        seed=seed,
        model=lda,
        step_size=StepSize(tau0=float(s["tau0"]), kappa=float(s["kappa"])),
        estep=EStep(max_iter=int(s["estep_max_iter"]), tol=float(s["estep_tol"])),
        schedule=_schedule(s, info, seed, fraction),
        heldout=heldout,
        heldout_fraction=fraction,
        outputs=Outputs(
            eval_every=int(s["eval_every"]),
            checkpoint_every=int(s["checkpoint_every"]),
            top_words=int(s["top_words"]),
            figures=bool(s.get("figures", True)),
        ),
        restarts=int(s.get("restarts", 0)),
        keep_in_memory=bool(s["keep_in_memory"]),
        pr=settings,
        constraints=constraints,
        source=source,
        corpus=info,
    )


def _check_svi_section(cfg: dict) -> dict:
    """The ``svi`` section, checked; returns it."""
    unknown_keys(cfg, "svi", set(SVI) | {"kappa", "max_steps", "heldout_fraction", "max_heldout_docs"})
    apply(cfg, {f"svi.{k}": r for k, r in SVI.items()})
    s = cfg["svi"]
    kappa = get(cfg, "svi.kappa")
    real()("svi.kappa", kappa)
    if not 0.5 <= float(kappa) <= 1.0:  # 0.5: the Robbins-Monro boundary, standard in practice (docs/svi.md)
        raise ConfigError(
            "svi.kappa",
            kappa,
            "must lie in [0.5, 1]: below 0.5 the step sizes rho_t = (tau0 + t)^-kappa have sum rho^2 = inf",
            "use e.g. svi.kappa=0.7, or 0.5 with svi.tau0=64 (Hoffman, Blei and Bach 2010)",
        )
    if s.get("max_steps") is not None:
        integer(lo=1)("svi.max_steps", s["max_steps"])
    f = get(cfg, "svi.heldout_fraction")
    real(ge=0)("svi.heldout_fraction", f)
    if f >= 1:
        raise ConfigError(
            "svi.heldout_fraction",
            f,
            "must be below 1 (some documents must be left for training)",
            "use e.g. svi.heldout_fraction=0.05",
        )
    if s.get("max_heldout_docs") is not None:
        integer(lo=1)("svi.max_heldout_docs", s["max_heldout_docs"])
    return s


def _check_model(cfg: dict) -> dict:
    """The ``model`` section (LDA), checked; returns it."""
    model = cfg.get("model") or {}
    if model.get("name") not in SVI_MODELS:
        raise ConfigError(
            "model", model.get("name"), "pipeline=svi fits topic models", "use model=lda (or drop the model= override)"
        )
    unknown_keys(cfg, "model", set(LDA) | {"name", "alpha", "eta"})
    apply(cfg, {f"model.{k}": r for k, r in LDA.items()})
    _optional_positive("model.alpha", model.get("alpha"))
    _optional_positive("model.eta", model.get("eta"))
    return model


def _check_pr(cfg: dict) -> dict:
    """The ``pr`` section, checked (what needs the corpus: :func:`pr_constraints`); returns it."""
    unknown_keys(cfg, "pr", PR_KEYS)
    pr = cfg.get("pr") or {}
    mass = pr.get("seed_mass", 0.7)
    if not isinstance(mass, dict):  # a dict (per topic) is checked by make_pr_config
        real(gt=0)("pr.seed_mass", mass)
        if mass > 1:
            raise ConfigError(
                "pr.seed_mass",
                mass,
                "no distribution over topics can put more than all its mass on one topic",
                "use a mass in (0, 1]",
            )
    if pr.get("topic_cap") is not None:
        real()("pr.topic_cap", pr["topic_cap"])
        if pr["topic_cap"] < 1:
            raise ConfigError(
                "pr.topic_cap",
                pr["topic_cap"],
                "no distribution can satisfy it: every token puts mass 1 on some topic, so sum_k max_n q_n(k) >= 1",
                "use pr.topic_cap >= 1 (or null)",
            )
    integer(lo=1)("pr.max_iter", pr.get("max_iter", 200))
    real(gt=0)("pr.tol", pr.get("tol", 1e-6))
    return pr


def _check_corpus(cfg: dict) -> dict:
    """The ``corpus`` section's fields, checked (the corpus itself: ``corpora.open_checked``); returns it."""
    c = cfg.get("corpus")
    if not isinstance(c, dict) or "kind" not in c:
        raise ConfigError(
            "corpus",
            c,
            "pipeline=svi needs a corpus",
            "use corpus=docstrings, corpus=synthetic, "
            "corpus=uci corpus.docword=... corpus.vocab=..., corpus=text corpus.folder=...",
        )
    if c["kind"] not in CORPUS_KEYS:
        raise ConfigError("corpus.kind", c["kind"], "unknown corpus source", f"use one of: {', '.join(CORPUS_KEYS)}")
    unknown_keys(cfg, "corpus", CORPUS_KEYS[c["kind"]] | {"kind"})
    if c["kind"] == "synthetic":
        apply(cfg, {f"corpus.{k}": r for k, r in SYNTHETIC.items()})
    elif "docs_per_shard" in c:
        integer(lo=1)("corpus.docs_per_shard", c["docs_per_shard"])
    return c


def _symmetric_prior(v, K: int) -> float:
    """A symmetric Dirichlet parameter as configured, or 1/K for null."""
    return float(v) if v is not None else 1.0 / K


def heldout_settings(s: dict) -> HeldOut:
    """The held-out settings of an ``svi`` section."""
    cap = s.get("max_heldout_docs")
    return HeldOut(fraction=float(s["heldout_fraction"]), max_docs=int(cap) if cap is not None else None)


def _schedule(s: dict, info, seed: int, heldout_fraction: float) -> Schedule:
    """Minibatches and steps of the corpus ``info``; refuses a split that leaves no training document."""
    from pgmflow.tasks.lda import shard_tasks

    n_train = sum(shard_tasks.train_split(n, seed, j, heldout_fraction).size for j, n in enumerate(info.shard_docs))
    if n_train == 0:
        raise ConfigError(
            "svi.heldout_fraction",
            s["heldout_fraction"],
            "no training documents are left",
            "lower svi.heldout_fraction",
        )
    batch = min(int(s["batch_size"]), n_train)
    T = max(1, math.ceil(n_train / batch))  # steps per epoch
    n_steps = T * int(s["n_epochs"])
    if s.get("max_steps"):
        n_steps = min(n_steps, int(s["max_steps"]))
    return Schedule(
        batch_size=int(s["batch_size"]),
        n_epochs=int(s["n_epochs"]),
        max_steps=int(s["max_steps"]) if s.get("max_steps") is not None else None,
        n_train=n_train,
        steps_per_epoch=T,
        n_steps=n_steps,
    )


def recorded_source(cfg: dict) -> corpora.Source:
    """The corpus source of a whole config (e.g. a recorded run's config.yaml), unchecked."""
    return corpus_source(cfg["corpus"])


def corpus_source(c: dict) -> corpora.Source:
    """The typed source of a ``corpus`` section (its fields checked by :func:`check_svi`)."""
    kind = c.get("kind")
    if kind == "shipped":
        return corpora.Shipped(name=c.get("name"))
    if kind == "sharded":
        return corpora.Sharded(path=c.get("path"))
    if kind not in corpora.KINDS:
        raise ConfigError("corpus.kind", kind, "unknown corpus source", f"use one of: {', '.join(corpora.KINDS)}")
    settings = json.dumps(
        {k: v for k, v in sorted(c.items()) if k not in ("cache_dir", "kind")}, sort_keys=True, default=str
    )
    conv = corpora.Conversion(
        docs_per_shard=int(c.get("docs_per_shard") or corpora.DEFAULT_DOCS_PER_SHARD),
        cache_dir=c.get("cache_dir"),
        settings=settings,
    )
    if kind == "synthetic":
        return corpora.Synthetic(
            n_docs=int(c["n_docs"]),
            n_words=int(c["n_words"]),
            n_topics=int(c["n_topics"]),
            alpha=float(c["alpha"]),
            eta=float(c["eta"]),
            mean_length=float(c["mean_length"]),
            seed=int(c.get("seed") or 0),
            conversion=conv,
        )
    if kind == "uci":
        return corpora.UCI(docword=c.get("docword"), vocab=c.get("vocab"), conversion=conv)
    if kind == "text":
        stop = c.get("stop_words", "english")
        return corpora.TextFolder(
            folder=c.get("folder"),
            pattern=c.get("pattern", "*.txt"),
            min_df=c.get("min_df", 2),
            max_df=c.get("max_df", 0.5),
            max_vocab=c.get("max_vocab"),
            stop_words=tuple(stop) if isinstance(stop, list) else stop,
            conversion=conv,
        )
    if kind == "matrix_market":
        return corpora.MatrixMarket(
            path=c.get("path"), vocab=c.get("vocab"), transpose=bool(c.get("transpose", False)), conversion=conv
        )
    return corpora.Npz(path=c.get("path"), conversion=conv)


def pr_constraints(pr: PRSettings, K: int, info):
    """The posterior-regularization constraints (Ganchev et al. 2010) of ``pr`` with words mapped to ids
    of the corpus's vocabulary, checked for feasibility (a ``PRConfig``; None: no constraints)."""
    if not pr.active:
        return None
    from pgmflow.tasks.lda import regularization

    seed_ids = _seed_word_ids(pr.seed_words, K, info)
    try:
        return regularization.make_pr_config(
            seed_ids, pr.seed_mass, pr.topic_cap, K, info.n_words, max_iter=pr.max_iter, tol=pr.tol
        )
    except ValueError as exc:
        name = "topic_cap" if "cap" in str(exc) else "seed_mass" if "mass" in str(exc) else "seed_words"
        raise ConfigError(
            f"pr.{name}",
            getattr(pr, name),
            f"{exc}",
            "relax the constraint so that some distribution over topics satisfies it",
        ) from None


def _seed_word_ids(seed_words, K: int, info) -> dict[int, list[int]] | None:
    """``pr.seed_words`` (topic -> words or word ids) as topic -> word ids of the corpus's vocabulary."""
    if not seed_words:
        return None
    if not isinstance(seed_words, dict):
        raise ConfigError(
            "pr.seed_words",
            seed_words,
            "must map a topic index to a list of words",
            "e.g. pr.seed_words='{0: [matrix, eigenvalues], 3: [fourier]}'",
        )
    vocab = {w: i for i, w in enumerate(info.vocab)} if info.vocab else None
    out = {}
    for k, words in seed_words.items():
        try:
            kk = int(k)
        except (TypeError, ValueError):
            raise ConfigError("pr.seed_words", k, "topic keys must be integers", f"use 0..{K - 1}") from None
        if not 0 <= kk < K:
            raise ConfigError(
                "pr.seed_words", k, f"topic index outside 0..{K - 1}", f"use a topic index below model.K={K}"
            )
        out[kk] = [_word_id(w, vocab, info.n_words) for w in (words if isinstance(words, (list, tuple)) else [words])]
    return out


def _word_id(w, vocab: dict | None, n_words: int) -> int:
    """The id of one seed word: an id as given, or the word's index in the vocabulary."""
    if isinstance(w, int) or (isinstance(w, str) and w.isdigit() and vocab is None):
        wid = int(w)
        if not 0 <= wid < n_words:
            raise ConfigError(
                "pr.seed_words", w, f"word id outside 0..{n_words - 1}", "use ids of the corpus vocabulary"
            )
        return wid
    if vocab is None:
        raise ConfigError(
            "pr.seed_words", w, "this corpus has no vocabulary, so words must be ids", "give integer word ids"
        )
    if str(w) not in vocab:
        import difflib

        near = difflib.get_close_matches(str(w), list(vocab), n=3)
        raise ConfigError(
            "pr.seed_words",
            w,
            "not in the corpus vocabulary",
            f"did you mean {', '.join(near)}?" if near else "pick words of the vocabulary (vocab.txt of the corpus)",
        )
    return vocab[str(w)]


def recorded_corpus(cfg: dict):
    """The checked corpus of a config dict read back from a recorded run (a run itself gets its corpus from
    its plan, which :func:`check_svi` builds)."""
    return corpora.open_checked(recorded_source(cfg))


def recorded_heldout_fraction(svi_section: dict, n_docs: int) -> float:
    """The held-out fraction of a recorded run's ``svi`` section for a corpus of ``n_docs`` documents."""
    return heldout_settings(svi_section).fraction_for(n_docs)
