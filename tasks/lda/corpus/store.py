"""The on-disk sharded format ("pgmflow-corpus/1"): write, open and load shards; the shipped corpora;
helpers shared by the loaders."""

from __future__ import annotations

import gzip
import json
import operator
import os
import struct
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

from pgmflow.tasks.lda.corpus.shards import (
    _DATA_DIR,
    _MAX_WORDS,
    _RESERVED_META,
    _SHARD_RE,
    FORMAT,
    SHIPPED_ALIASES,
    SHIPPED_CORPUS,
    CorpusError,
    DocTermShard,
    make_shard,
    n_docs,
    n_tokens,
)

# ------------------------------------------------------------------------------------------------
# The on-disk format
# ------------------------------------------------------------------------------------------------


class CorpusInfo(NamedTuple):
    """What :func:`open_corpus` learns from ``meta.json`` (and ``vocab.txt``)."""

    path: str  # the corpus directory (absolute)
    n_docs: int
    n_words: int
    nnz: int
    n_tokens: float
    shard_docs: tuple  # number of docs in each shard, in order
    shard_offsets: tuple  # global index of each shard's first doc
    vocab: tuple | None  # the words, if the corpus has a vocabulary (vocab.txt), else None
    true_topics: str | None  # path of true_topics.npy (synthetic corpora) or None
    meta: dict  # the whole meta.json


_FIX_REWRITE = "re-create the corpus directory with pgmflow.tasks.lda.corpus.write_corpus or one of the from_* loaders"


def _clean_name(s, what, path):
    if not isinstance(s, str) or "\n" in s or "\r" in s:
        raise CorpusError(
            path, f"{what} {s!r} is not a one-line string", f"make every {what} a string without line breaks"
        )
    return s


def _write_lines(path: Path, lines: Iterable[str], what: str) -> int:
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for s in lines:
            f.write(_clean_name(s, what, path) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def _read_lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        text = f.read()
    lines = text.split("\n")
    while lines and lines[-1].strip() == "":  # trailing newline / blank lines
        lines.pop()
    return [s.removesuffix("\r") for s in lines]


def _counts_for_disk(counts: np.ndarray, counts_dtype) -> np.ndarray:
    if counts_dtype == "auto":
        c32 = counts.astype(np.float32)
        return c32 if np.array_equal(c32, counts) else counts
    return counts.astype(counts_dtype)


def write_corpus(
    out_dir,
    shards: Iterable[DocTermShard],
    n_words,
    vocab=None,
    source="",
    extra_meta=None,
    *,
    doc_names: Iterable[str] | None = None,
    compress=False,
    counts_dtype="auto",
) -> CorpusInfo:
    """Write shards (consumed one at a time) to the corpus directory ``out_dir``; return its info.

    Shards are written in order and numbered contiguously: shard ``i`` gets ``doc_offset`` = the
    number of documents before it (a shard's own ``doc_offset`` is ignored) and shards with no
    documents are skipped. ``vocab``: ``n_words`` strings (written to vocab.txt) or None.
    ``extra_meta``: more keys for meta.json (not the reserved ones). ``doc_names``: one name per
    document (doc_names.txt). ``compress``: zlib-compress the shard files (smaller; then
    ``load_shard(mmap=True)`` reads them into memory). ``counts_dtype``: "auto" stores float32 when
    that is exact (integer counts below 2**24), else float64; or a dtype.

    ``out_dir`` is created if needed; an existing corpus there is replaced (its meta.json is
    removed first and its shard files are deleted, other files are left alone). meta.json is
    written last, so a failed write leaves no valid corpus.
    """
    out = Path(os.path.abspath(out_dir))
    try:
        n_words = operator.index(n_words)
    except TypeError:
        raise CorpusError(out, f"n_words = {n_words!r} is not an integer", "pass the vocabulary size") from None
    if not 1 <= n_words <= _MAX_WORDS:
        raise CorpusError(out, f"n_words = {n_words} is not in [1, 2**31 - 1]", "pass the vocabulary size")
    extra_meta = dict(extra_meta or {})
    clash = sorted(set(extra_meta) & set(_RESERVED_META))
    if clash:
        raise CorpusError(out, f"extra_meta sets reserved keys {clash}", "rename those keys")
    if counts_dtype != "auto" and np.dtype(counts_dtype) not in (np.float32, np.float64):
        raise CorpusError(
            out, f"counts_dtype {counts_dtype!r} is not float32 or float64", "use 'auto', 'float32' or 'float64'"
        )
    if out.exists() and not out.is_dir():
        raise CorpusError(out, "exists and is not a directory", "choose another out_dir or remove the file")
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "meta.json"
    if meta_path.exists():
        meta_path.unlink()
    for f in out.iterdir():
        if _SHARD_RE.match(f.name) and f.is_file():
            f.unlink()

    meta_vocab = None
    if vocab is not None:
        vocab = list(vocab)
        if len(vocab) != n_words:
            raise CorpusError(
                out, f"vocab has {len(vocab)} words but n_words = {n_words}", "pass exactly one word per word id"
            )
        _write_lines(out / "vocab.txt", vocab, "vocabulary word")
        meta_vocab = "vocab.txt"

    entries = []
    total_docs, total_nnz, total_tokens = 0, 0, 0.0
    for shard in shards:
        if not isinstance(shard, DocTermShard):
            raise CorpusError(
                out,
                f"shard {len(entries)} is a {type(shard).__name__}, not a DocTermShard",
                "build shards with make_shard / shard_from_scipy / shard_from_dense",
            )
        if shard.n_words != n_words:
            raise CorpusError(
                out,
                f"a shard has n_words = {shard.n_words} but the corpus has n_words = {n_words}",
                "give every shard the vocabulary size of the whole corpus",
            )
        nd = n_docs(shard)
        if nd == 0:
            continue
        name = f"shard_{len(entries):05d}.npz"
        tmp = out / (name + ".tmp")
        arrays = {
            "indptr": np.asarray(shard.indptr, dtype=np.int64),
            "indices": np.asarray(shard.indices, dtype=np.int32),
            "counts": _counts_for_disk(np.asarray(shard.counts, dtype=np.float64), counts_dtype),
        }
        with open(tmp, "wb") as f:
            (np.savez_compressed if compress else np.savez)(f, **arrays)
        os.replace(tmp, out / name)
        nnz, tok = int(shard.indices.size), n_tokens(shard)
        entries.append({"file": name, "n_docs": nd, "doc_offset": total_docs, "nnz": nnz, "n_tokens": tok})
        total_docs += nd
        total_nnz += nnz
        total_tokens += tok
    if total_docs == 0:
        raise CorpusError(out, "no documents were written (empty corpus)", "pass at least one non-empty shard")

    meta = {
        "format": FORMAT,
        "n_docs": total_docs,
        "n_words": n_words,
        "nnz": total_nnz,
        "n_tokens": total_tokens,
        "shards": entries,
        "vocab": meta_vocab,
        "source": str(source),
    }
    if doc_names is not None:
        n = _write_lines(out / "doc_names.txt", doc_names, "document name")
        if n != total_docs:
            raise CorpusError(out, f"{n} document names for {total_docs} documents", "pass one name per document")
        meta["doc_names"] = "doc_names.txt"
    meta.update(extra_meta)
    tmp = out / "meta.json.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, meta_path)
    return open_corpus(out)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def open_corpus(path) -> CorpusInfo:
    """Open a corpus directory: read and validate meta.json (and vocab.txt). Cheap.

    Raises :class:`CorpusError` for a missing directory or meta.json, malformed JSON, a wrong format
    tag, missing or ill-typed fields, missing shard files, shard document counts or offsets that do
    not add up, an empty corpus, and a vocab.txt whose line count is not n_words.
    """
    d = Path(os.path.abspath(path))
    if not d.is_dir():
        raise CorpusError(
            d,
            "no such corpus directory",
            "check the path, or build the corpus with one of the pgmflow.tasks.lda.corpus.from_* loaders",
        )
    mp = d / "meta.json"
    if not mp.is_file():
        raise CorpusError(mp, "missing meta.json (not a pgmflow corpus, or its write did not finish)", _FIX_REWRITE)
    try:
        with open(mp, encoding="utf-8") as f:
            meta = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorpusError(mp, f"malformed JSON ({exc})", _FIX_REWRITE) from None
    if not isinstance(meta, dict):
        raise CorpusError(mp, "malformed meta.json (the top level is not an object)", _FIX_REWRITE)
    if meta.get("format") != FORMAT:
        raise CorpusError(
            mp,
            f"format tag is {meta.get('format')!r}, expected {FORMAT!r}",
            "convert the corpus with one of the pgmflow.tasks.lda.corpus.from_* loaders",
        )
    for key in ("n_docs", "n_words", "nnz"):
        if not _is_int(meta.get(key)) or meta[key] < 0:
            raise CorpusError(mp, f"field {key!r} is missing or not a nonnegative integer", _FIX_REWRITE)
    if not isinstance(meta.get("n_tokens"), (int, float)) or isinstance(meta.get("n_tokens"), bool):
        raise CorpusError(mp, "field 'n_tokens' is missing or not a number", _FIX_REWRITE)
    if meta["n_docs"] == 0:
        raise CorpusError(
            mp,
            "the corpus has no documents (n_docs = 0: empty corpus)",
            "build it from a source with at least one document",
        )
    if not 1 <= meta["n_words"] <= _MAX_WORDS:
        raise CorpusError(mp, f"n_words = {meta['n_words']} is not in [1, 2**31 - 1]", _FIX_REWRITE)
    shards = meta.get("shards")
    if not isinstance(shards, list) or not shards:
        raise CorpusError(mp, "field 'shards' is missing, empty or not a list", _FIX_REWRITE)
    docs, offs, total_nnz = [], [], 0
    expect = 0
    for i, s in enumerate(shards):
        if (
            not isinstance(s, dict)
            or not isinstance(s.get("file"), str)
            or not all(_is_int(s.get(k)) and s[k] >= 0 for k in ("n_docs", "doc_offset", "nnz"))
        ):
            raise CorpusError(mp, f"shard entry {i} is malformed (needs file, n_docs, doc_offset, nnz)", _FIX_REWRITE)
        if os.path.basename(s["file"]) != s["file"] or s["file"] in ("", ".", ".."):
            raise CorpusError(
                mp, f"shard entry {i} names {s['file']!r}, not a file inside the corpus directory", _FIX_REWRITE
            )
        if s["doc_offset"] != expect:
            raise CorpusError(
                mp,
                f"shard {i} ({s['file']}) has doc_offset {s['doc_offset']} but the shards "
                f"before it hold {expect} documents (inconsistent shard offsets)",
                _FIX_REWRITE,
            )
        if not (d / s["file"]).is_file():
            raise CorpusError(
                d / s["file"],
                f"shard file {i} listed in meta.json is missing",
                "restore the file (copy the whole corpus directory) or " + _FIX_REWRITE,
            )
        docs.append(s["n_docs"])
        offs.append(s["doc_offset"])
        expect += s["n_docs"]
        total_nnz += s["nnz"]
    if expect != meta["n_docs"]:
        raise CorpusError(
            mp,
            f"the shards hold {expect} documents but n_docs = {meta['n_docs']} (inconsistent shard doc counts)",
            _FIX_REWRITE,
        )
    if total_nnz != meta["nnz"]:
        raise CorpusError(mp, f"the shards hold {total_nnz} nonzeros but nnz = {meta['nnz']}", _FIX_REWRITE)
    vocab = None
    if meta.get("vocab") is not None:
        vname = meta["vocab"]
        vp = d / str(vname)
        if not isinstance(vname, str) or os.path.basename(vname) != vname or not vp.is_file():
            raise CorpusError(
                vp,
                "the vocabulary file named in meta.json is missing",
                'restore vocab.txt, or set "vocab": null in meta.json',
            )
        vocab = tuple(_read_lines(vp))
        if len(vocab) != meta["n_words"]:
            raise CorpusError(
                vp,
                f"vocab.txt has {len(vocab)} lines but n_words = {meta['n_words']}",
                "write exactly one word per line, one line per word id",
            )
    true_topics = None
    for key in ("true_topics", "true_alpha", "doc_names"):
        name = meta.get(key)
        if name is None:
            continue
        p = d / str(name)
        if not isinstance(name, str) or os.path.basename(name) != name or not p.is_file():
            raise CorpusError(
                p, f"the file named by {key!r} in meta.json is missing", f"restore it, or remove {key!r} from meta.json"
            )
        if key == "true_topics":
            true_topics = str(p)
    return CorpusInfo(
        str(d),
        int(meta["n_docs"]),
        int(meta["n_words"]),
        int(meta["nnz"]),
        float(meta["n_tokens"]),
        tuple(docs),
        tuple(offs),
        vocab,
        true_topics,
        meta,
    )


def _as_info(info_or_path) -> CorpusInfo:
    return info_or_path if isinstance(info_or_path, CorpusInfo) else open_corpus(info_or_path)


def shard_file(info_or_path, i) -> str:
    """Path of shard ``i``'s file."""
    info = _as_info(info_or_path)
    i = operator.index(i)
    n = len(info.shard_docs)
    if not 0 <= i < n:
        raise IndexError(f"shard index {i} out of range: {info.path} has {n} shards")
    return os.path.join(info.path, info.meta["shards"][i]["file"])


def _npz_memmaps(path, names):
    """Memory-map the members of an uncompressed .npz; None if one is compressed."""
    out = {}
    with zipfile.ZipFile(path) as zf, open(path, "rb") as fh:
        for name in names:
            zi = zf.getinfo(name + ".npy")
            if zi.compress_type != zipfile.ZIP_STORED:
                return None
            fh.seek(zi.header_offset)
            hdr = fh.read(30)
            if hdr[:4] != b"PK\x03\x04":
                return None
            nlen, elen = struct.unpack("<HH", hdr[26:30])
            fh.seek(zi.header_offset + 30 + nlen + elen)
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, _fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            else:
                shape, _fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            if dtype.hasobject or len(shape) != 1:
                return None
            if shape[0] == 0:
                out[name] = np.zeros(0, dtype=dtype)
            else:
                out[name] = np.memmap(path, dtype=dtype, mode="r", offset=fh.tell(), shape=shape)
    return out


def load_shard(info_or_path, i, mmap=False) -> DocTermShard:
    """Load and validate shard ``i`` of a corpus (a :class:`CorpusInfo` or a corpus directory).

    Counts come back as float64. ``mmap=True`` memory-maps the arrays of an uncompressed shard file
    (indices and float64 counts are then read-only views of the file; float32 counts are copied).
    Raises :class:`CorpusError` naming the shard file for an unreadable file, missing arrays,
    sizes that disagree with meta.json, negative or NaN counts, and word ids >= n_words.
    """
    info = _as_info(info_or_path)
    f = shard_file(info, i)
    entry = info.meta["shards"][operator.index(i)]
    names = ("indptr", "indices", "counts")
    fix = "the shard file is corrupt or was not written by write_corpus: " + _FIX_REWRITE
    try:
        arrays = _npz_memmaps(f, names) if mmap else None
        if arrays is None:
            with np.load(f, allow_pickle=False) as z:
                missing = [n for n in names if n not in z.files]
                if missing:
                    raise CorpusError(f, f"the shard file lacks the arrays {missing}", fix)
                arrays = {n: z[n] for n in names}
    except CorpusError:
        raise
    except FileNotFoundError:
        raise CorpusError(f, "the shard file is missing", "restore the file or " + _FIX_REWRITE) from None
    except KeyError as exc:
        raise CorpusError(f, f"the shard file lacks an array ({exc})", fix) from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise CorpusError(f, f"not a readable .npz file ({type(exc).__name__}: {exc})", fix) from None
    indptr, indices, counts = (arrays[n] for n in names)
    if indptr.ndim != 1 or indptr.size != entry["n_docs"] + 1:
        raise CorpusError(f, f"the shard has {indptr.size - 1} documents but meta.json says {entry['n_docs']}", fix)
    if indices.ndim != 1 or indices.size != entry["nnz"]:
        raise CorpusError(f, f"the shard has {indices.size} nonzeros but meta.json says {entry['nnz']}", fix)
    return make_shard(indptr, indices, counts, info.n_words, info.shard_offsets[operator.index(i)], f, fix=fix)


def iter_shards(info_or_path) -> Iterator[DocTermShard]:
    """Load the shards of a corpus one after the other."""
    info = _as_info(info_or_path)
    for i in range(len(info.shard_docs)):
        yield load_shard(info, i)


def load_doc_names(info_or_path) -> list[str] | None:
    """The document names (doc_names.txt) if the corpus has them, else None."""
    info = _as_info(info_or_path)
    name = info.meta.get("doc_names")
    if name is None:
        return None
    p = Path(info.path) / name
    names = _read_lines(p)
    if len(names) != info.n_docs:
        raise CorpusError(
            p,
            f"{len(names)} document names for {info.n_docs} documents",
            "write one name per line, one line per document",
        )
    return names


def load_true_model(info_or_path):
    """``(topics [K, V], alpha [K])`` of a synthetic corpus, or None for a corpus without them."""
    info = _as_info(info_or_path)
    if info.true_topics is None:
        return None
    topics = np.load(info.true_topics, allow_pickle=False)
    alpha_name = info.meta.get("true_alpha")
    alpha = np.load(os.path.join(info.path, alpha_name), allow_pickle=False) if alpha_name else None
    if topics.ndim != 2 or topics.shape[1] != info.n_words:
        raise CorpusError(
            info.true_topics,
            f"true topics have shape {topics.shape}, expected [K, {info.n_words}]",
            "regenerate the synthetic corpus",
        )
    return topics, alpha


# ------------------------------------------------------------------------------------------------
# Loaders
# ------------------------------------------------------------------------------------------------


def _check_dps(docs_per_shard, path):
    try:
        dps = operator.index(docs_per_shard)
    except TypeError:
        dps = 0
    if dps < 1:
        raise CorpusError(
            path, f"docs_per_shard = {docs_per_shard!r} is not a positive integer", "pass docs_per_shard >= 1"
        )
    return dps


def _read_vocab_file(vocab_path, n_words=None, source=None) -> list[str]:
    vp = Path(vocab_path)
    if not vp.is_file():
        raise CorpusError(vp, "vocabulary file not found", "pass the path of the vocabulary file (one word per line)")
    words = _read_lines(vp)
    if n_words is not None and len(words) != n_words:
        raise CorpusError(
            vp,
            f"vocabulary-size mismatch: {len(words)} lines but {source} has {n_words} words",
            "pass the vocabulary file that belongs to this data set (one word per line)",
        )
    return words


def _open_maybe_gzip(path: Path):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


# --- shipped data ---------------------------------------------------------------------------------


def shipped_corpus_path(name=SHIPPED_CORPUS) -> str:
    """Directory of a corpus shipped with pgmflow (``tasks/lda/data/<name>``).

    ``numpy_scipy_docstrings`` (alias ``docstrings``): the docstrings of the public functions and
    classes of NumPy and SciPy (BSD-3-Clause), see its README.md.
    """
    p = _DATA_DIR / SHIPPED_ALIASES.get(name, name)
    if not (p / "meta.json").is_file():
        have = sorted(q.name for q in _DATA_DIR.iterdir() if (q / "meta.json").is_file()) if _DATA_DIR.is_dir() else []
        raise CorpusError(
            p,
            f"no shipped corpus named {name!r} (shipped: {have})",
            "use one of the shipped names, or reinstall pgmflow (its package data is missing)",
        )
    return str(p)
