"""Bad input to ``pgmflow pipeline=svi``: exit code 2, one line that names the field (or file), the
value and the fix, no traceback, before any task runs, and no MLflow run left RUNNING or FINISHED."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from tests.bad_input.helpers import assert_refused, pgmflow


def _uci(tmp_path, lines, D, W, vocab_words=None, name="docword.txt"):
    nnz = len(lines)
    (tmp_path / name).write_text(f"{D}\n{W}\n{nnz}\n" + "".join(f"{d} {w} {c}\n" for d, w, c in lines))
    words = vocab_words if vocab_words is not None else [f"w{i}" for i in range(W)]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    return ["corpus=uci", f"corpus.docword={tmp_path / name}", f"corpus.vocab={tmp_path / 'vocab.txt'}"]


def _good_lines():
    return [(d, w, 1 + (d * w) % 3) for d in range(1, 21) for w in range(1, 9) if (d + w) % 3]


def _negative(tmp_path):
    lines = _good_lines()
    lines[7] = (lines[7][0], lines[7][1], -2)
    return _uci(tmp_path, lines, 20, 8), "negative"


def _vocab_mismatch(tmp_path):
    return _uci(tmp_path, _good_lines(), 20, 8, vocab_words=[f"w{i}" for i in range(6)]), "corpus.docword"


def _empty_corpus(tmp_path):
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("the and of\n")
    (tmp_path / "texts" / "b.txt").write_text("\n")
    return ["corpus=text", f"corpus.folder={tmp_path / 'texts'}"], "corpus.folder"


def _shard_vocab_mismatch(tmp_path):
    """A sharded corpus whose second shard was written for a bigger vocabulary."""
    from pgmflow.tasks.lda import corpus

    rng = np.random.default_rng(0)
    a = corpus.write_corpus(str(tmp_path / "a"), [corpus.shard_from_dense(rng.integers(0, 3, (10, 20)))], 20)
    b = corpus.write_corpus(str(tmp_path / "b"), [corpus.shard_from_dense(rng.integers(0, 3, (10, 30)))], 30)
    # splice b's shard into a as its second shard, as a careless merge of two corpora would
    import json
    import shutil

    shutil.copy(tmp_path / "b" / b.meta["shards"][0]["file"], tmp_path / "a" / "shard_00001.npz")
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    s1 = dict(b.meta["shards"][0], file="shard_00001.npz", doc_offset=10)
    meta["shards"].append(s1)
    meta["n_docs"] += s1["n_docs"]
    meta["nnz"] += s1["nnz"]
    (tmp_path / "a" / "meta.json").write_text(json.dumps(meta))
    return ["corpus=sharded", f"corpus.path={a.path}"], "corpus.path"


def _gz_garbage(tmp_path):
    (tmp_path / "docword.txt.gz").write_bytes(gzip.compress(b"3\n4\nfive\n1 1 1\n"))
    (tmp_path / "vocab.txt").write_text("a\nb\nc\nd\n")
    return [
        "corpus=uci",
        f"corpus.docword={tmp_path / 'docword.txt.gz'}",
        f"corpus.vocab={tmp_path / 'vocab.txt'}",
    ], "corpus.docword"


def _no_training_documents(tmp_path):
    """A one-document corpus whose only document is held out: validation refuses the split."""
    from pgmflow.tasks.lda import corpus

    c = corpus.write_corpus(str(tmp_path / "one"), [corpus.shard_from_dense(np.array([[2.0, 1.0, 0.0, 3.0]]))], 4)
    return ["corpus=sharded", f"corpus.path={c.path}", "svi.heldout_fraction=0.999999"], "no training documents"


CASES = {
    "negative_count": _negative,
    "vocabulary_size_mismatch": _vocab_mismatch,
    "shards_with_different_vocabularies": _shard_vocab_mismatch,
    "empty_corpus": _empty_corpus,
    "corrupt_docword": _gz_garbage,
    "kappa_0.49": lambda p: (["svi.kappa=0.49"], "svi.kappa=0.49"),
    "kappa_1.2": lambda p: (["svi.kappa=1.2"], "svi.kappa=1.2"),
    "seed_mass_above_1": lambda p: (["pr.seed_words={0: [matrix]}", "pr.seed_mass=1.5"], "pr.seed_mass=1.5"),
    "topic_cap_below_1": lambda p: (["pr.topic_cap=0.5"], "pr.topic_cap=0.5"),
    "one_word_two_topics": lambda p: (
        ["pr.seed_words={0: [matrix], 1: [matrix]}", "pr.seed_mass=0.7"],
        "no distribution",
    ),
    "seed_word_not_in_vocabulary": lambda p: (["pr.seed_words={0: [matrx]}"], "matrx"),
    "seed_topic_out_of_range": lambda p: (["pr.seed_words={40: [matrix]}"], "pr.seed_words"),
    "model_for_another_pipeline": lambda p: (["model=ising"], "model='ising'"),
    "missing_docword": lambda p: (["corpus=uci"], "corpus.docword"),
    "unknown_svi_key": lambda p: (["+svi.batchsize=10"], "svi.batchsize"),
    "batch_size_0": lambda p: (["svi.batch_size=0"], "svi.batch_size=0"),
    "no_training_documents": _no_training_documents,
}


@pytest.mark.parametrize("case", list(CASES))
def test_svi_bad_input(tmp_path, case):
    args, needle = CASES[case](tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = pgmflow(
        ["pipeline=svi", *args, f"tracking.uri={uri}", "progress=false", "cluster.n_workers=1"], tmp_path, timeout=120
    )
    assert_refused(r, [needle], tmp_path, uri, "svi")
