"""From the ``corpus`` config section to a sharded corpus on disk, checked before any task runs.

Sources (``corpus.kind``): ``shipped`` (a corpus inside pgmflow), ``synthetic`` (LDA's generative
process with known topics), ``uci`` (docword.txt + vocab.txt), ``text`` (a folder of plain-text
files), ``matrix_market`` (.mtx), ``npz`` (scipy.sparse.save_npz) and ``sharded`` (a pgmflow corpus
directory). Every source but ``shipped`` and ``sharded`` is converted once into the sharded format
(``pgmflow.tasks.lda.corpus``) under ``corpus.cache_dir``, keyed by the source's path, size, modification time
and the conversion settings; later runs reuse it. Conversion streams, so the driver's memory is
bounded by one shard.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from pgmflow.pipelines.core.errors import ConfigError

KINDS = ("shipped", "synthetic", "uci", "text", "matrix_market", "npz", "sharded")
_SOURCE_FIELDS = {"uci": ("docword", "vocab"), "text": ("folder",), "matrix_market": ("path",), "npz": ("path",),
                  "sharded": ("path",)}


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


def _fingerprint(c: dict, kind: str) -> str:
    h = hashlib.sha256()
    h.update(kind.encode())
    for f in _SOURCE_FIELDS.get(kind, ()):
        v = c.get(f)
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
    skip = {"cache_dir", "kind"}
    h.update(json.dumps({k: v for k, v in sorted(c.items()) if k not in skip}, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def _cached(c: dict, kind: str, build) -> str:
    cache = _path(c.get("cache_dir") or ".pgmflow/corpora")
    out = cache / f"{kind}-{_fingerprint(c, kind)}"
    if (out / "meta.json").exists():
        return str(out)
    tmp = cache / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    import time

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


def _require(c: dict, field: str, kind: str, what: str) -> Path:
    v = c.get(field)
    if v in (None, "", "???"):
        raise ConfigError(f"corpus.{field}", v, f"corpus={kind} needs {what}", f"set corpus.{field}=PATH")
    p = _path(v)
    if not p.exists():
        raise ConfigError(f"corpus.{field}", v, f"{p} does not exist", "give an existing path (relative paths are "
                          "taken from the directory pgmflow was started in)")
    return p


def corpus_dir(cfg: dict) -> str:
    """Convert (or find in the cache) the configured corpus; returns the sharded corpus directory."""
    from pgmflow.tasks.lda import corpus as C
    from pgmflow.tasks.lda import synthetic

    c = dict(cfg.get("corpus") or {})
    kind = c.get("kind")
    if kind not in KINDS:
        raise ConfigError("corpus.kind", kind, "unknown corpus source", f"use one of: {', '.join(KINDS)}")
    per = int(c.get("docs_per_shard") or 10000)
    field = {"uci": "docword", "text": "folder"}.get(kind, "path")
    try:
        if kind == "shipped":
            return C.shipped_corpus_path(c.get("name") or "docstrings")
        if kind == "sharded":
            return str(_require(c, "path", kind, "a pgmflow corpus directory (with meta.json)"))
        if kind == "synthetic":
            return _cached(c, kind, lambda out: synthetic.generate_corpus(
                out, int(c["n_docs"]), int(c["n_words"]), int(c["n_topics"]), seed=int(c.get("seed") or 0),
                alpha=float(c["alpha"]), eta=float(c["eta"]), mean_length=float(c["mean_length"]),
                docs_per_shard=per))
        if kind == "uci":
            dw = _require(c, "docword", kind, "the docword.txt(.gz) file")
            vp = _require(c, "vocab", kind, "the vocab.txt file")
            return _cached(c, kind, lambda out: C.from_uci(str(dw), str(vp), out, docs_per_shard=per))
        if kind == "text":
            folder = _require(c, "folder", kind, "a folder of .txt files (one document per file)")
            return _cached(c, kind, lambda out: C.from_text_folder(
                str(folder), out, min_df=c.get("min_df", 2), max_df=c.get("max_df", 0.5),
                max_vocab=c.get("max_vocab"), stop_words=c.get("stop_words", "english"), docs_per_shard=per,
                pattern=c.get("pattern", "*.txt")))
        if kind == "matrix_market":
            p = _require(c, "path", kind, "a Matrix Market (.mtx) file")
            vocab = str(_path(c["vocab"])) if c.get("vocab") else None
            return _cached(c, kind, lambda out: C.from_matrix_market(
                str(p), out, docs_per_shard=per, transpose=bool(c.get("transpose", False)), vocab_path=vocab))
        if kind == "npz":
            p = _require(c, "path", kind, "a scipy.sparse .npz file")
            return _cached(c, kind, lambda out: C.from_npz(str(p), out, docs_per_shard=per))
    except ConfigError:
        raise
    except C.CorpusError as exc:
        raise _corpus_error(exc, f"corpus.{field}", c.get(field) if kind != "shipped" else c.get("name")) from None
    raise AssertionError(kind)


def _validated_stamp(info) -> str:
    h = hashlib.sha256()
    for s in info.meta["shards"]:
        p = Path(info.path) / s["file"]
        st = p.stat()
        h.update(f"{s['file']}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def open_checked(cfg: dict):
    """The configured corpus, with every shard's contents checked once (cached by a stamp file)."""
    from pgmflow.tasks.lda import corpus as C

    path = corpus_dir(cfg)
    c = cfg.get("corpus") or {}
    field = {"uci": "docword", "text": "folder"}.get(c.get("kind"), "path")
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
        raise _corpus_error(exc, f"corpus.{field}", c.get(field, path)) from None
    if info.n_docs == 0 or info.n_tokens <= 0:
        raise ConfigError(f"corpus.{field}", c.get(field, path), "the corpus is empty (no words in any document)",
                          "point it at a corpus with documents")
    return info


_RESOLVED: dict = {}


def resolve(cfg: dict):
    """CorpusInfo of the configured corpus (checked by preflight; cached for the run)."""
    key = json.dumps(cfg.get("corpus"), sort_keys=True, default=str)
    if key not in _RESOLVED:
        _RESOLVED[key] = open_checked(cfg)
    return _RESOLVED[key]


def heldout_fraction(scfg: dict, n_docs: int) -> float:
    f = float(scfg["heldout_fraction"])
    cap = scfg.get("max_heldout_docs")
    if cap:
        f = min(f, int(cap) / max(n_docs, 1))
    return f


def pr_config(cfg: dict, info):
    """The posterior-regularization constraints of ``cfg['pr']`` with words mapped to ids (None: none)."""
    p = cfg.get("pr") or {}
    K = int(cfg["model"]["K"])
    seeds = p.get("seed_words")
    cap = p.get("topic_cap")
    if not seeds and cap is None:
        return None
    from pgmflow.tasks.lda import regularization

    seed_ids = None
    if seeds:
        if not isinstance(seeds, dict):
            raise ConfigError("pr.seed_words", seeds, "must map a topic index to a list of words",
                              "e.g. pr.seed_words='{0: [matrix, eigenvalues], 3: [fourier]}'")
        vocab = {w: i for i, w in enumerate(info.vocab)} if info.vocab else None
        seed_ids = {}
        for k, words in seeds.items():
            try:
                kk = int(k)
            except (TypeError, ValueError):
                raise ConfigError("pr.seed_words", k, "topic keys must be integers", f"use 0..{K - 1}") from None
            if not 0 <= kk < K:
                raise ConfigError("pr.seed_words", k, f"topic index outside 0..{K - 1}",
                                  f"use a topic index below model.K={K}")
            ids = []
            for w in (words if isinstance(words, (list, tuple)) else [words]):
                if isinstance(w, int) or (isinstance(w, str) and w.isdigit() and vocab is None):
                    wid = int(w)
                    if not 0 <= wid < info.n_words:
                        raise ConfigError("pr.seed_words", w, f"word id outside 0..{info.n_words - 1}",
                                          "use ids of the corpus vocabulary")
                elif vocab is None:
                    raise ConfigError("pr.seed_words", w, "this corpus has no vocabulary, so words must be ids",
                                      "give integer word ids")
                elif str(w) not in vocab:
                    import difflib

                    near = difflib.get_close_matches(str(w), list(vocab), n=3)
                    raise ConfigError("pr.seed_words", w, "not in the corpus vocabulary",
                                      f"did you mean {', '.join(near)}?" if near else "pick words of the vocabulary "
                                      "(vocab.txt of the corpus)")
                else:
                    wid = vocab[str(w)]
                ids.append(wid)
            seed_ids[kk] = ids
    try:
        return regularization.make_pr_config(seed_ids, p.get("seed_mass", 0.7), cap, K, info.n_words,
                                             max_iter=int(p.get("max_iter", 200)), tol=float(p.get("tol", 1e-6)))
    except ValueError as exc:
        field = "pr.topic_cap" if "cap" in str(exc) else "pr.seed_mass" if "mass" in str(exc) else "pr.seed_words"
        raise ConfigError(field, p.get(field.split(".")[1]), f"{exc}", "relax the constraint so that some "
                          "distribution over topics satisfies it") from None
