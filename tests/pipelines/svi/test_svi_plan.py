"""The SVI plan: the config is read once, in validation, and every corpus source is opened once per run.

Each corpus source of ``conf/corpus/`` (shipped, synthetic, uci, text, matrix_market, npz, sharded) runs
twice in one process, end to end (Hydra composition, the synchronous scheduler, a real MLflow store),
with counting wrappers around the loaders:

- the source is converted (or generated) once, on the first run; the second run finds the converted
  corpus in the cache and converts nothing;
- the pipeline opens the corpus (``meta.json`` and the vocabulary) exactly once per run, in validation:
  no module-level cache hands the first run's corpus to the second;
- each shard is prepared on a worker exactly once per run.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import compose
from tests.pipelines.helpers import run

BASE = [
    "pipeline=svi",
    "model.K=3",
    "svi.batch_size=20",
    "svi.max_steps=2",
    "svi.eval_every=0",
    "svi.checkpoint_every=0",
    "svi.figures=false",
    "progress=false",
]
BUILDERS = {
    "synthetic": ("pgmflow.tasks.lda.synthetic", "generate_corpus"),
    "uci": ("pgmflow.tasks.lda.corpus", "from_uci"),
    "text": ("pgmflow.tasks.lda.corpus", "from_text_folder"),
    "matrix_market": ("pgmflow.tasks.lda.corpus", "from_matrix_market"),
    "npz": ("pgmflow.tasks.lda.corpus", "from_npz"),
    "shipped": ("pgmflow.tasks.lda.corpus", "shipped_corpus_path"),
}


def _counts(rng, n_docs=60, n_words=40):
    """A document-term count matrix [n_docs, n_words], every document and word used."""
    X = rng.poisson(0.6, (n_docs, n_words)).astype(np.float64)
    X[np.arange(n_docs), np.arange(n_docs) % n_words] += 1
    return X


def _words(n):
    letters = "bcdfghjklmnpqrstvwxz"
    return [f"{letters[i % 20]}{letters[(i // 20) % 20]}o{letters[(7 * i) % 20]}a" for i in range(n)]


def _source(kind, d, rng) -> list[str]:
    """The overrides of a small corpus of ``kind`` written under ``d``."""
    import scipy.io
    import scipy.sparse as sp

    from pgmflow.tasks.lda import corpus

    cache = f"corpus.cache_dir={d / 'cache'}"
    if kind == "shipped":
        return ["corpus=docstrings"]
    if kind == "synthetic":
        return [
            "corpus=synthetic",
            "corpus.n_docs=60",
            "corpus.n_words=40",
            "corpus.n_topics=3",
            "corpus.docs_per_shard=30",
            "corpus.mean_length=30",
            cache,
        ]
    X = _counts(rng)
    if kind == "sharded":
        corpus.write_corpus(
            str(d / "sharded"), [corpus.shard_from_dense(X[:30]), corpus.shard_from_dense(X[30:], 30)], X.shape[1]
        )
        return ["corpus=sharded", f"corpus.path={d / 'sharded'}"]
    if kind == "npz":
        sp.save_npz(d / "c.npz", sp.csr_matrix(X))
        return ["corpus=npz", f"corpus.path={d / 'c.npz'}", "corpus.docs_per_shard=30", cache]
    if kind == "matrix_market":
        scipy.io.mmwrite(str(d / "c.mtx"), sp.coo_matrix(X))
        return ["corpus=matrix_market", f"corpus.path={d / 'c.mtx'}", "corpus.docs_per_shard=30", cache]
    if kind == "uci":
        rows, cols = np.nonzero(X)
        lines = [str(X.shape[0]), str(X.shape[1]), str(rows.size)]
        lines += [f"{r + 1} {c + 1} {int(X[r, c])}" for r, c in zip(rows, cols)]
        (d / "docword.txt").write_text("\n".join(lines) + "\n")
        (d / "vocab.txt").write_text("\n".join(_words(X.shape[1])) + "\n")
        return [
            "corpus=uci",
            f"corpus.docword={d / 'docword.txt'}",
            f"corpus.vocab={d / 'vocab.txt'}",
            "corpus.docs_per_shard=30",
            cache,
        ]
    assert kind == "text"
    words = _words(100)
    (d / "texts").mkdir()
    for i in range(60):
        (d / "texts" / f"doc{i:03d}.txt").write_text(" ".join(rng.choice(words, 25)))
    return ["corpus=text", f"corpus.folder={d / 'texts'}", "corpus.docs_per_shard=30", cache]


def _counting(monkeypatch, module, name, calls, label):
    import importlib

    mod = importlib.import_module(module)
    original = getattr(mod, name)

    @functools.wraps(original)
    def counted(*args, **kwargs):
        calls[label] = calls.get(label, 0) + 1
        return original(*args, **kwargs)

    monkeypatch.setattr(mod, name, counted)


@pytest.mark.parametrize(
    "kind",
    ["synthetic"]
    + [pytest.param(k, marks=pytest.mark.slow) for k in ("shipped", "uci", "text", "matrix_market", "npz", "sharded")],
)  # about 10 s each (two runs)
def test_each_corpus_source_is_opened_once_per_run(kind, tmp_path, mlflow_uri, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the checked-corpus stamps (.pgmflow/validated) go here
    monkeypatch.setenv("PGMFLOW_ORIG_CWD", str(tmp_path))
    ov = BASE + _source(kind, tmp_path, np.random.default_rng(0))
    calls: dict[str, int] = {}
    if kind in BUILDERS:
        _counting(monkeypatch, *BUILDERS[kind], calls, "build")
    _counting(monkeypatch, "pgmflow.tasks.lda.corpus", "open_corpus", calls, "open")
    _counting(monkeypatch, "pgmflow.tasks.lda.shard_tasks", "prepare_shard", calls, "prepare")
    results = []
    for attempt in range(2):
        calls.clear()
        res, tr = run(ov, mlflow_uri)
        results.append(res["heldout_perplexity"])
        n_shards = int(tr.client.get_run(res["run_id"]).data.tags["pgmflow.svi.shards"])
        built = calls.pop("build", 0)
        if kind == "shipped":
            assert built == 1, calls  # the shipped corpus's directory is looked up once
        elif kind in BUILDERS:
            assert built == (1 if attempt == 0 else 0), (attempt, built)  # converted once, then reused
        assert calls == {"open": 1, "prepare": n_shards}, (attempt, calls)  # one open; each shard prepared once
    assert results[0] == results[1]


def test_validation_returns_a_frozen_typed_plan(tmp_path, monkeypatch):
    from pgmflow.svi import corpora
    from pgmflow.svi.plan import Plan
    from pgmflow.svi.validate import check_svi

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PGMFLOW_ORIG_CWD", str(tmp_path))
    plan = check_svi(compose(["experiment=lda_seeded", "svi.max_heldout_docs=50", "model.alpha=0.5"]))
    assert isinstance(plan, Plan) and isinstance(plan.source, corpora.Shipped)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.seed = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.estep.tol = 1.0  # type: ignore[misc]
    assert (plan.model.K, plan.model.alpha, plan.model.eta) == (20, 0.5, 1 / 20)
    assert plan.heldout_fraction == 50 / plan.corpus.n_docs  # the cap, resolved against the corpus
    assert plan.constraints is not None and plan.constraints.seed_word_ids.size == 16
    assert plan.constraints.cap == 3.0
    sch = plan.schedule
    assert sch.steps_per_epoch == -(-sch.n_train // sch.batch_docs) and sch.n_steps == sch.steps_per_epoch * 10


def test_below_validation_nothing_reads_the_config():
    """run, report, model, figures, corpora and plan read no config dict (``ctx.cfg``, ``cfg[...]``):
    validate.py is the one module that does."""
    root = Path(__file__).resolve().parents[3] / "pipelines" / "svi"
    found = []
    for path in sorted(root.glob("*.py")):
        if path.name == "validate.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "cfg":
                found.append(f"{path.name}:{node.lineno} .cfg")
            if isinstance(node, ast.Name) and node.id in ("cfg", "scfg", "mcfg", "ccfg"):
                found.append(f"{path.name}:{node.lineno} {node.id}")
    assert not found, found
