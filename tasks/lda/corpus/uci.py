"""The UCI bag-of-words loader (``docword.txt[.gz]`` + ``vocab.txt``), streaming: memory bounded by one
shard plus the vocabulary."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pgmflow.tasks.lda.corpus.shards import _MAX_WORDS, CorpusError, DocTermShard, make_shard
from pgmflow.tasks.lda.corpus.store import CorpusInfo, _check_dps, _open_maybe_gzip, _read_vocab_file, write_corpus

_UCI_CHUNK = 1 << 24


def from_uci(docword_path, vocab_path, out_dir, docs_per_shard=10000) -> CorpusInfo:
    """Convert a UCI bag-of-words data set into a corpus directory (streaming).

    ``docword_path``: ``docword.*.txt`` or ``.txt.gz`` -- three header lines D, W, NNZ, then
    ``docID wordID count`` lines with 1-based ids sorted by docID (NYTimes, PubMed, KOS, NIPS,
    Enron). ``vocab_path``: its vocabulary (one word per line, W lines), or None for none. Documents
    with no lines are kept as empty documents. Word ids become 0-based. Memory: one shard.
    """
    src = Path(os.path.abspath(docword_path))
    dps = _check_dps(docs_per_shard, src)
    if not src.is_file():
        raise CorpusError(src, "docword file not found", "pass the path of docword.<name>.txt(.gz)")
    fix_fmt = (
        "the file must start with three lines D, W, NNZ followed by 'docID wordID count' lines "
        "(UCI bag-of-words format)"
    )
    with _open_maybe_gzip(src) as fh:
        header = []
        try:
            while len(header) < 3:
                line = fh.readline()
                if not line:
                    raise CorpusError(src, f"the header ends after {len(header)} lines", fix_fmt)
                if line.strip():
                    header.append(int(line.strip()))
        except CorpusError:  # (a ValueError too): already says what is wrong and how to fix it
            raise
        except (ValueError, UnicodeDecodeError, OSError, EOFError) as exc:
            raise CorpusError(src, f"unreadable header ({type(exc).__name__}: {exc})", fix_fmt) from None
    D, W, NNZ = header
    if D < 1:
        raise CorpusError(src, f"the header says D = {D} documents (empty corpus)", "use a data set with documents")
    if W < 1 or W > _MAX_WORDS or NNZ < 0:
        raise CorpusError(src, f"invalid header W = {W}, NNZ = {NNZ}", fix_fmt)
    vocab = None if vocab_path is None else _read_vocab_file(vocab_path, W, f"the header of {src}")
    return write_corpus(
        out_dir, _uci_shards(src, D, W, NNZ, dps, fix_fmt), W, vocab=vocab, source=f"UCI bag-of-words: {src}"
    )


def _uci_parse_slow(block: bytes, first_line: int, src, fix_fmt) -> np.ndarray:
    rows = []
    for k, line in enumerate(block.split(b"\n")):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 3:
                raise ValueError
            rows.append([int(p) for p in parts])
        except ValueError:
            raise CorpusError(
                src,
                f"line {first_line + k} is not three integers 'docID wordID count': "
                f"{line[:80].decode('utf-8', 'replace')!r}",
                fix_fmt,
            ) from None
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def _uci_blocks(src: Path, fix_fmt):
    """Yield ``(first_line_number, int64 [n, 3])`` blocks of the body."""
    with _open_maybe_gzip(src) as fh:
        seen, line_no = 0, 1
        while seen < 3:  # skip the header (already parsed)
            line = fh.readline()
            line_no += 1
            if line.strip():
                seen += 1
        buf = b""
        while True:
            data = fh.read(_UCI_CHUNK)
            if data:
                buf += data
                cut = buf.rfind(b"\n")
                if cut < 0:
                    continue
                block, buf = buf[: cut + 1], buf[cut + 1 :]
            else:
                block, buf = buf, b""
                if not block.strip():
                    return
            nl = block.count(b"\n")
            try:
                arr = np.fromstring(block.decode("ascii"), dtype=np.int64, sep=" ")
                ok = arr.size == 3 * (nl + (0 if block.endswith(b"\n") else 1))
            except (ValueError, UnicodeDecodeError):
                ok = False
            arr = arr.reshape(-1, 3) if ok else _uci_parse_slow(block, line_no, src, fix_fmt)
            yield line_no, arr
            line_no += nl
            if not data:
                return


def _uci_shards(src, D, W, NNZ, dps, fix_fmt) -> Iterator[DocTermShard]:
    n_shards = -(-D // dps)
    cur = 0  # shard being filled
    pending: list[np.ndarray] = []
    last_doc = 0
    total = 0

    def build(s):
        lo = s * dps
        hi = min(D, lo + dps)
        a = np.concatenate(pending) if pending else np.zeros((0, 3), np.int64)
        rows = a[:, 0] - 1 - lo
        indptr = np.zeros(hi - lo + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=hi - lo), out=indptr[1:])
        return make_shard(indptr, a[:, 1] - 1, a[:, 2], W, lo, src, fix=fix_fmt)

    for first_line, a in _uci_blocks(src, fix_fmt):
        if a.size == 0:
            continue
        doc, word, cnt = a[:, 0], a[:, 1], a[:, 2]
        total += a.shape[0]

        def where(mask, first_line=first_line):
            j = int(np.flatnonzero(mask)[0])
            return j, f"line {first_line + j}"

        if doc.min() < 1 or doc.max() > D:
            j, at = where((doc < 1) | (doc > D))
            raise CorpusError(src, f"{at}: docID {int(doc[j])} is outside 1..D = {D}", fix_fmt)
        if word.min() < 1 or word.max() > W:
            j, at = where((word < 1) | (word > W))
            raise CorpusError(
                src,
                f"{at}: wordID {int(word[j])} is outside 1..W = {W} (document {int(doc[j])})",
                "check that the vocabulary and the docword file belong together",
            )
        if cnt.min() < 0:
            j, at = where(cnt < 0)
            raise CorpusError(
                src,
                f"document {int(doc[j])} has a negative count ({int(cnt[j])} for wordID {int(word[j])}, {at})",
                "correct or remove that line: counts must be nonnegative integers",
            )
        if doc[0] < last_doc or (doc.size > 1 and np.any(np.diff(doc) < 0)):
            prev = np.concatenate([[last_doc], doc[:-1]])
            j, at = where(doc < prev)
            raise CorpusError(
                src,
                f"docIDs are not sorted ({at}: document {int(doc[j])} after {int(prev[j])})",
                "sort the lines by docID (e.g. sort -n -k1,1 on the body)",
            )
        last_doc = int(doc[-1])
        shard_of = (doc - 1) // dps
        while doc.size:
            s = int(shard_of[0])
            while s > cur:
                yield build(cur)
                pending = []
                cur += 1
            end = int(np.searchsorted(shard_of, s, side="right"))
            pending.append(a[:end])
            a, doc, shard_of = a[end:], doc[end:], shard_of[end:]
    if total != NNZ:
        raise CorpusError(
            src,
            f"NNZ mismatch: the header says {NNZ} lines but the file has {total}",
            "fix the header's third line, or re-download the file (it may be truncated)",
        )
    while cur < n_shards:
        yield build(cur)
        pending = []
        cur += 1
