"""From a typed corpus source to a checked, sharded corpus on disk, before any task runs.

Sources (``corpus.kind``), one class each, built from the ``corpus`` config section by the
validation (``pgmflow.svi.validate``): :class:`Shipped` (a corpus inside pgmflow),
:class:`Synthetic` (LDA's generative process with known topics; Blei, Ng, Jordan 2003),
:class:`UCI` (docword.txt + vocab.txt), :class:`TextFolder` (a folder of plain-text files),
:class:`MatrixMarket` (.mtx), :class:`Npz` (scipy.sparse.save_npz) and :class:`Sharded` (a pgmflow
corpus directory). Every source but ``shipped`` and ``sharded`` is converted once into the sharded
format (``pgmflow.tasks.lda.corpus``) under its cache directory, keyed by the source's path, size,
modification time and the conversion settings; later runs reuse it. Conversion streams, so the
driver's memory is bounded by one shard.

:func:`open_checked` opens a source and checks every shard; the validation calls it once per run and
the run's plan carries the result, so nothing here keeps data between calls.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pgmflow.core.errors import ConfigError

KINDS = ("shipped", "synthetic", "uci", "text", "matrix_market", "npz", "sharded")
DEFAULT_CACHE = ".pgmflow/corpora"
DEFAULT_DOCS_PER_SHARD = 10000


def _orig_cwd() -> Path:
    return Path(os.environ.get("PGMFLOW_ORIG_CWD", os.getcwd()))


def _path(value) -> Path:
    p = Path(os.path.expanduser(str(value)))
    return (p if p.is_absolute() else _orig_cwd() / p).resolve()


def _corpus_error(exc, field: str, value) -> ConfigError:
    problem = getattr(exc, "problem", None) or str(exc)
    fix = getattr(exc, "fix", None) or "check the file"
    where = getattr(exc, "path", None)
    if where and str(where) != str(value):
        problem = f"{where}: {problem}"
    return ConfigError(field, value, problem, fix)


def _require(value, field: str, kind: str, what: str) -> Path:
    if value in (None, "", "???"):
        raise ConfigError(f"corpus.{field}", value, f"corpus={kind} needs {what}", f"set corpus.{field}=PATH")
    p = _path(value)
    if not p.exists():
        raise ConfigError(
            f"corpus.{field}",
            value,
            f"{p} does not exist",
            "give an existing path (relative paths are taken from the directory pgmflow was started in)",
        )
    return p


@dataclass(frozen=True)
class Conversion:
    """How a source is converted once into shards and kept.

    docs_per_shard: documents per shard (the unit of work and of placement on workers);
    cache_dir: where converted corpora are kept (relative: to the launch directory; None: the default);
    settings: the section's settings as written (JSON, ``kind`` and ``cache_dir`` left out), part of
    the converted corpus's key in the cache and, for a generator, its recorded parameters."""

    docs_per_shard: int
    cache_dir: str | None
    settings: str

    def fingerprint(self, kind: str, sources: tuple) -> str:
        """The cache key: the kind, each source path with its size and modification time (every file
        of a folder), and the settings."""
        h = hashlib.sha256()
        h.update(kind.encode())
        for v in sources:
            if v is None:
                continue
            p = _path(v)
            h.update(str(p).encode())
            if p.is_file():
                st = p.stat()
                h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
            elif p.is_dir():
                for q in sorted(p.rglob("*")):
                    if q.is_file():
                        st = q.stat()
                        h.update(f"{q}:{st.st_size}:{st.st_mtime_ns}".encode())
        h.update(self.settings.encode())
        return h.hexdigest()[:16]

    def cached(self, kind: str, sources: tuple, build) -> str:
        """The converted corpus's directory: found in the cache, or built by ``build(out_dir)`` into a
        temporary directory and moved into place."""
        import time

        cache = _path(self.cache_dir or DEFAULT_CACHE)
        out = cache / f"{kind}-{self.fingerprint(kind, sources)}"
        if (out / "meta.json").exists():
            return str(out)
        tmp = cache / f".{out.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        # progress on stdout: stderr carries only the one-line error if the source is bad
        print(f"pgmflow: building the {kind} corpus once into {out} (later runs reuse it) ...", flush=True)
        t0 = time.monotonic()
        try:
            build(str(tmp))
            shutil.rmtree(out, ignore_errors=True)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"pgmflow: corpus built in {time.monotonic() - t0:.1f} s", flush=True)
        return str(out)


class _Source:
    """What every source offers: ``kind``; ``FIELD``, the ``corpus.*`` field that errors name, and
    :meth:`field_value` its value as written; :meth:`directory` (the sharded corpus, converted if
    needed); :meth:`dataset` (the name and origin under which the run records it)."""

    kind: ClassVar[str]
    FIELD: ClassVar[str] = "path"

    def field_value(self, default=None):
        return getattr(self, self.FIELD)

    def directory(self) -> str:
        raise NotImplementedError

    def dataset(self, info) -> tuple[str, dict]:
        v = self.field_value()
        return f"corpus {self.kind}", {"path": str(v) if v else info.path}


@dataclass(frozen=True)
class Shipped(_Source):
    """A corpus shipped inside pgmflow (``pgmflow.tasks.lda.data``). name: which one (None: the default)."""

    name: str | None
    kind: ClassVar[str] = "shipped"

    def field_value(self, default=None):
        return default

    def directory(self) -> str:
        from pgmflow.tasks.lda import corpus as C

        return C.shipped_corpus_path(self.name or "docstrings")

    def dataset(self, info) -> tuple[str, dict]:
        return f"corpus {self.name}", {"path": info.path}


@dataclass(frozen=True)
class Sharded(_Source):
    """A corpus already in pgmflow's sharded format, used in place. path: its directory (with meta.json)."""

    path: str | None
    kind: ClassVar[str] = "sharded"

    def directory(self) -> str:
        return str(_require(self.path, "path", self.kind, "a pgmflow corpus directory (with meta.json)"))


@dataclass(frozen=True)
class Synthetic(_Source):
    """Documents drawn from LDA's generative process (Blei, Ng, Jordan 2003) with known topics.

    n_docs, n_words, n_topics: documents, vocabulary size and true topics; alpha, eta: the true
    symmetric Dirichlet priors of the proportions and of the topics; mean_length: the mean (Poisson)
    document length; seed: the corpus's own seed; conversion: shards and cache."""

    n_docs: int
    n_words: int
    n_topics: int
    alpha: float
    eta: float
    mean_length: float
    seed: int
    conversion: Conversion
    kind: ClassVar[str] = "synthetic"

    def field_value(self, default=None):
        return default

    def directory(self) -> str:
        from pgmflow.tasks.lda import synthetic

        return self.conversion.cached(
            self.kind,
            (),
            lambda out: synthetic.generate_corpus(
                out,
                self.n_docs,
                self.n_words,
                self.n_topics,
                seed=self.seed,
                alpha=self.alpha,
                eta=self.eta,
                mean_length=self.mean_length,
                docs_per_shard=self.conversion.docs_per_shard,
            ),
        )

    def dataset(self, info) -> tuple[str, dict]:
        return f"corpus {self.kind}", {
            "generator": "pgmflow.tasks.lda.synthetic.generate_corpus",
            "parameters": json.loads(self.conversion.settings),
        }


@dataclass(frozen=True)
class UCI(_Source):
    """UCI bag-of-words (Dua and Graff, the UCI repository). docword: docword.txt(.gz); vocab: vocab.txt."""

    docword: str | None
    vocab: str | None
    conversion: Conversion
    kind: ClassVar[str] = "uci"
    FIELD: ClassVar[str] = "docword"

    def directory(self) -> str:
        from pgmflow.tasks.lda import corpus as C

        dw = _require(self.docword, "docword", self.kind, "the docword.txt(.gz) file")
        vp = _require(self.vocab, "vocab", self.kind, "the vocab.txt file")
        per = self.conversion.docs_per_shard
        return self.conversion.cached(
            self.kind, (self.docword, self.vocab), lambda out: C.from_uci(str(dw), str(vp), out, docs_per_shard=per)
        )


@dataclass(frozen=True)
class TextFolder(_Source):
    """A folder of plain-text files, one document per file, tokenised and pruned.

    folder: searched recursively; pattern: which files are documents; min_df, max_df: drop words in
    fewer documents than min_df or in more than the fraction max_df of them; max_vocab: keep at most
    this many most frequent words (None: all); stop_words: ``"english"``, None or a list of words."""

    folder: str | None
    pattern: str
    min_df: int | float
    max_df: int | float
    max_vocab: int | None
    stop_words: str | tuple | None
    conversion: Conversion
    kind: ClassVar[str] = "text"
    FIELD: ClassVar[str] = "folder"

    def directory(self) -> str:
        from pgmflow.tasks.lda import corpus as C

        folder = _require(self.folder, "folder", self.kind, "a folder of .txt files (one document per file)")
        stop = list(self.stop_words) if isinstance(self.stop_words, tuple) else self.stop_words
        return self.conversion.cached(
            self.kind,
            (self.folder,),
            lambda out: C.from_text_folder(
                str(folder),
                out,
                min_df=self.min_df,
                max_df=self.max_df,
                max_vocab=self.max_vocab,
                stop_words=stop,
                docs_per_shard=self.conversion.docs_per_shard,
                pattern=self.pattern,
            ),
        )


@dataclass(frozen=True)
class MatrixMarket(_Source):
    """A document-term matrix in Matrix Market format. path: the .mtx file; vocab: an optional
    vocab.txt; transpose: documents are columns."""

    path: str | None
    vocab: str | None
    transpose: bool
    conversion: Conversion
    kind: ClassVar[str] = "matrix_market"

    def directory(self) -> str:
        from pgmflow.tasks.lda import corpus as C

        p = _require(self.path, "path", self.kind, "a Matrix Market (.mtx) file")
        vocab = str(_path(self.vocab)) if self.vocab else None
        return self.conversion.cached(
            self.kind,
            (self.path,),
            lambda out: C.from_matrix_market(
                str(p), out, docs_per_shard=self.conversion.docs_per_shard, transpose=self.transpose, vocab_path=vocab
            ),
        )


@dataclass(frozen=True)
class Npz(_Source):
    """A document-term matrix saved with scipy.sparse.save_npz, documents as rows. path: the .npz file."""

    path: str | None
    conversion: Conversion
    kind: ClassVar[str] = "npz"

    def directory(self) -> str:
        from pgmflow.tasks.lda import corpus as C

        p = _require(self.path, "path", self.kind, "a scipy.sparse .npz file")
        return self.conversion.cached(
            self.kind, (self.path,), lambda out: C.from_npz(str(p), out, docs_per_shard=self.conversion.docs_per_shard)
        )


Source = Shipped | Sharded | Synthetic | UCI | TextFolder | MatrixMarket | Npz


def corpus_dir(source: Source) -> str:
    """Convert (or find in the cache) the source; returns the sharded corpus directory."""
    from pgmflow.tasks.lda import corpus as C

    try:
        return source.directory()
    except C.CorpusError as exc:
        name = source.name if isinstance(source, Shipped) else source.field_value()
        raise _corpus_error(exc, f"corpus.{source.FIELD}", name) from None


def _validated_stamp(info) -> str:
    h = hashlib.sha256()
    for s in info.meta["shards"]:
        p = Path(info.path) / s["file"]
        st = p.stat()
        h.update(f"{s['file']}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def open_checked(source: Source):
    """The source's corpus (a ``CorpusInfo``), with every shard's contents checked once (remembered
    by a stamp file in the launch directory, so later runs of an unchanged corpus skip the check)."""
    from pgmflow.tasks.lda import corpus as C

    path = corpus_dir(source)
    field, value = f"corpus.{source.FIELD}", source.field_value(path)
    try:
        info = C.open_corpus(path)
        # the stamp of a checked corpus lives in the launch directory, never inside the corpus
        stamp_file = _path(".pgmflow/validated") / hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:24]
        stamp = _validated_stamp(info)
        if not (stamp_file.exists() and stamp_file.read_text() == stamp):
            for j in range(len(info.shard_docs)):
                C.load_shard(info, j)  # raises CorpusError on negative counts, NaN, out-of-range word ids
            try:
                stamp_file.parent.mkdir(parents=True, exist_ok=True)
                stamp_file.write_text(stamp)
            except OSError:
                pass  # nowhere to write: check again next time
    except C.CorpusError as exc:
        raise _corpus_error(exc, field, value) from None
    if info.n_docs == 0 or info.n_tokens <= 0:
        raise ConfigError(
            field, value, "the corpus is empty (no words in any document)", "point it at a corpus with documents"
        )
    return info
