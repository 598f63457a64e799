"""The fitted LDA topics as a plain Python object and as an MLflow pyfunc model.

:class:`LDATransformer` maps documents to topic proportions ``theta`` [D, K] with the run's E-step at
the final topics, exactly as the held-out evaluation infers a document's proportions
(``pgmflow.tasks.lda.evaluate.completion_log_likelihood``): ``exp(E[log beta])`` from lambda (the
same digamma), the same initialisation ``gamma = alpha + N_d / K``, and the run's
``svi.estep_max_iter`` / ``svi.estep_tol``; ``theta = gamma / sum(gamma)``. A document's result does
not depend on the other documents of the call, so it is deterministic.

Documents are bag-of-words counts over the run's vocabulary (a dense array or a scipy.sparse matrix
[D, V], or a DataFrame of V count columns) or raw text (a list of strings, or a DataFrame with one
string column), tokenised by the corpus loaders' tokeniser (``pgmflow.tasks.lda.corpus.tokenize``, with the
corpus's recorded word length and stop words) and counted over the vocabulary; words outside it
are dropped.

The run logs it as an MLflow pyfunc model, the run's logged model :data:`ARTIFACT_PATH` (``lda_model``,
loadable as ``runs:/<run id>/lda_model``): documents in (a DataFrame with one string column such as ``text``,
or V count columns, or a count array), a DataFrame of columns ``topic_0 .. topic_{K-1}`` out. Its arrays are
also the run's artifact :data:`NPZ_NAME`, from which :func:`load_transformer` reads it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pgmflow.core import artifacts, models
from pgmflow.core.models import NPZ_KEY

if TYPE_CHECKING:
    from pgmflow.svi.corpora import Source
    from pgmflow.svi.plan import EStep, Plan

ARTIFACT_PATH = "lda_model"  # the name of the run's logged pyfunc model (runs:/<run id>/lda_model)
NPZ_NAME = "lda_model.npz"
TEXT_COLUMN = "text"


class LDATransformer:
    """Documents -> topic proportions with the fitted topics.

    lam: float64 [K, V] variational Dirichlet parameters of the topics; alpha: float64 [K];
    vocab: tuple of V words or None (then raw text cannot be used); max_iter, tol: the E-step's;
    min_word_len, stop_words: the tokeniser's (``pgmflow.tasks.lda.corpus.tokenize``).
    """

    def __init__(
        self,
        lam,
        alpha,
        vocab=None,
        max_iter: int = 100,
        tol: float = 1e-3,
        min_word_len: int = 2,
        stop_words="english",
    ):
        self.lam = np.ascontiguousarray(lam, dtype=np.float64)
        self.alpha = np.broadcast_to(np.asarray(alpha, dtype=np.float64), (self.lam.shape[0],)).copy()
        self.vocab = tuple(vocab) if vocab is not None and len(vocab) else None
        self.max_iter, self.tol = int(max_iter), float(tol)
        self.min_word_len, self.stop_words = int(min_word_len), stop_words
        self._ids = {w: i for i, w in enumerate(self.vocab)} if self.vocab else None

    @property
    def n_topics(self) -> int:
        return int(self.lam.shape[0])

    @property
    def n_words(self) -> int:
        return int(self.lam.shape[1])

    def to_arrays(self) -> dict:
        """What ``lda_model.npz`` holds (:meth:`from_npz` reads it back)."""
        return {
            "lam": self.lam,
            "alpha": self.alpha,
            "vocab": np.array(self.vocab or (), dtype=str),
            "estep_max_iter": np.int64(self.max_iter),
            "estep_tol": np.float64(self.tol),
            "min_word_len": np.int64(self.min_word_len),
            "stop_words": np.array("" if self.stop_words is None else str(self.stop_words)),
        }

    @classmethod
    def from_npz(cls, path) -> LDATransformer:
        with np.load(path, allow_pickle=False) as z:
            a = {k: z[k] for k in z.files}
        stop = str(a["stop_words"]) or None
        return cls(
            a["lam"],
            a["alpha"],
            [str(w) for w in a["vocab"]],
            int(a["estep_max_iter"]),
            float(a["estep_tol"]),
            int(a["min_word_len"]),
            stop,
        )

    @classmethod
    def from_artifacts(cls, directory) -> LDATransformer:
        """The transformer of an svi run's downloaded artifacts: ``directory`` is the run's artifact
        root (with ``lda_model/``) or the pyfunc model folder itself."""
        d = Path(directory)
        for p in (d / ARTIFACT_PATH / "artifacts" / NPZ_NAME, d / "artifacts" / NPZ_NAME, d / NPZ_NAME):
            if p.is_file():
                return cls.from_npz(p)
        raise FileNotFoundError(f"no {NPZ_NAME} in {d} (an svi run's artifacts, or its '{ARTIFACT_PATH}' folder)")

    # --- documents to CSR ------------------------------------------------------------------------
    def counts_of_texts(self, texts):
        """scipy.sparse CSR [D, V] of word counts of raw texts (the corpus loaders' tokeniser; words
        outside the vocabulary dropped)."""
        import scipy.sparse as sp

        from pgmflow.tasks.lda.corpus import tokenize

        if self._ids is None:
            raise ValueError("this model's corpus has no vocabulary (vocab.txt): pass word counts [D, V], not text")
        rows, cols = [], []
        for i, text in enumerate(texts):
            ids = [self._ids[t] for t in tokenize(str(text), self.min_word_len, self.stop_words) if t in self._ids]
            rows += [i] * len(ids)
            cols += ids
        data = np.ones(len(rows))
        return sp.csr_matrix((data, (rows, cols)), shape=(len(texts), self.n_words))  # duplicates are summed

    def _csr(self, docs):
        import scipy.sparse as sp

        if hasattr(docs, "columns"):  # a DataFrame: one text column, or count columns
            first = docs.dtypes.iloc[0] if docs.shape[1] else None
            if docs.shape[1] == 1 and (first.kind in "OSU" or str(first) == "string"):
                return self.counts_of_texts(docs.iloc[:, 0].tolist())
            if self.vocab and docs.shape[1] != self.n_words and set(map(str, docs.columns)) <= set(self.vocab):
                dense = np.zeros((docs.shape[0], self.n_words))  # [D, V], the named words' columns filled
                dense[:, [self._ids[str(c)] for c in docs.columns]] = docs.to_numpy(dtype=np.float64)
                docs = dense
            else:
                docs = docs.to_numpy(dtype=np.float64)
        if isinstance(docs, str):
            docs = [docs]
        if isinstance(docs, (list, tuple)) or (isinstance(docs, np.ndarray) and docs.dtype.kind in "OSU"):
            return self.counts_of_texts(list(np.ravel(np.asarray(docs, dtype=object))))
        X = sp.csr_matrix(docs, dtype=np.float64)
        if X.shape[1] != self.n_words:
            raise ValueError(
                f"expected counts over the {self.n_words} words of the vocabulary; got {X.shape[1]} columns"
            )
        if X.data.size and (not np.all(np.isfinite(X.data)) or X.data.min() < 0):
            raise ValueError("word counts must be finite and >= 0")
        return X

    def transform(self, docs) -> np.ndarray:
        """Topic proportions ``theta`` float64 [D, K] (rows sum to 1) of ``docs``: counts [D, V] (dense,
        scipy.sparse, a DataFrame) or raw text (a list of str, a DataFrame with one string column)."""
        from pgmflow.tasks.lda import estep as _estep

        X = self._csr(docs)
        X.sum_duplicates()
        X.eliminate_zeros()
        X.sort_indices()
        D = X.shape[0]
        cols = np.unique(X.indices).astype(np.int64)  # the words used, sorted
        if cols.size == 0:  # no known word anywhere: the prior mean
            return np.tile(self.alpha / self.alpha.sum(), (D, 1))
        dg = _estep.digamma  # what the held-out evaluation uses (evaluate.completion_log_likelihood)
        sub = self.lam[:, cols]
        eeb = np.ascontiguousarray(np.exp(dg(sub) - dg(self.lam.sum(axis=1))[:, None]).T)  # [C, K]
        res = _estep.estep(
            np.asarray(X.indptr, np.int64),
            np.asarray(X.indices, np.int64),
            X.data,
            np.arange(D),
            cols,
            eeb,
            self.alpha,
            max_iter=self.max_iter,
            tol=self.tol,
        )
        return res.gamma / res.gamma.sum(axis=1, keepdims=True)  # [D, K]


def load_transformer(artifact_dir) -> LDATransformer:
    """The :class:`LDATransformer` of an svi run's downloaded artifacts (what ``pgmflow.load`` returns)."""
    return LDATransformer.from_artifacts(artifact_dir)


_PythonModel = models.python_model_base()
with warnings.catch_warnings(record=True):  # MLflow asks for type hints; the model's signature is explicit instead

    class LDAPyfunc(_PythonModel):
        """The MLflow pyfunc wrapper of :class:`LDATransformer`: documents in (a ``text`` column, or
        count columns), a DataFrame of ``topic_k`` proportions out."""

        def load_context(self, context):
            self.transformer = LDATransformer.from_npz(context.artifacts[NPZ_KEY])

        def predict(self, context, model_input, params=None):
            import pandas as pd

            theta = self.transformer.transform(model_input)
            return pd.DataFrame(theta, columns=[f"topic_{k}" for k in range(theta.shape[1])])


def from_run(corpus_info, lam, alpha, estep: EStep) -> LDATransformer:
    """The transformer of a finished run: its final lambda, alpha, the corpus's vocabulary and
    tokeniser settings (``meta.json``), and the run's E-step settings."""
    tok = (corpus_info.meta or {}).get("tokenizer") or {}
    stop = tok.get("stop_words", None)
    # custom stop words ("415 custom words") are not recorded; none of them is in the vocabulary, so
    # leaving them in changes no count
    stop = stop if stop in ("english", None) else None
    return LDATransformer(
        lam, alpha, corpus_info.vocab, estep.max_iter, estep.tol, int(tok.get("min_word_len", 1)), stop if tok else None
    )


def log_model(ctx, plan: Plan, lam) -> None:
    """Log the run's topics ``lam`` [K, V] as the pyfunc model ``lda_model`` (see the module docstring)."""
    import pandas as pd
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    tr = from_run(plan.corpus, lam, plan.model.alpha_vector(), plan.estep)
    outputs = Schema([ColSpec("double", f"topic_{k}") for k in range(tr.n_topics)])
    if tr.vocab:  # an example text: the top words of the first two topics
        top = np.argsort(-tr.lam, axis=1, kind="stable")[:2, :3]
        example = pd.DataFrame({TEXT_COLUMN: [" ".join(tr.vocab[w] for w in row) for row in top]})
    else:  # no vocabulary: two one-word documents as counts [2, V]
        example = pd.DataFrame(np.eye(2, tr.n_words), columns=[f"w{j}" for j in range(tr.n_words)])
    # no input schema: a text column and count columns [D, V] are both documents (an input schema of
    # MLflow's would drop one of the two forms)
    arrays = tr.to_arrays()
    models.log_pyfunc(
        ctx, arrays, ARTIFACT_PATH, LDAPyfunc, ModelSignature(inputs=None, outputs=outputs), example, NPZ_NAME
    )
    artifacts.log_npz(ctx.tracker, NPZ_NAME, arrays, compressed=True)  # for pgmflow.load, beside the logged model


def log_corpus(ctx, source: Source, info) -> None:
    """Record the run's corpus ``info`` with ``pgmflow.core.datasets.log_input``: its shards'
    arrays (read one at a time) and vocabulary, under the name and origin (a path, or the generator and
    its parameters) of its ``source``."""
    from pgmflow.core import datasets
    from pgmflow.tasks.lda import corpus as C

    def arrays():
        for i in range(len(info.shard_docs)):
            sh = C.load_shard(info, i)
            yield from (("indptr", sh.indptr), ("indices", sh.indices), ("counts", sh.counts))
        if info.vocab:
            yield "vocab", np.array(info.vocab, dtype=str)

    name, where = source.dataset(info)
    datasets.log_input(
        ctx.tracker,
        name,
        arrays(),
        profile={
            "documents": info.n_docs,
            "words": info.n_words,
            "tokens": info.n_tokens,
            "shards": len(info.shard_docs),
            "converted_to": info.path,
        },
        **where,
    )
