"""Work on the shards of a corpus: what the Dask workers run for SVI (pure functions of plain data).

A corpus is a fixed list of shards (``pgmflow.tasks.lda.corpus``). Every shard ``j`` is split once into
training and held-out documents (``evaluate.heldout_mask``, keyed by (seed, j)), and its training
documents enter the minibatches of epoch ``e`` in the order ``shard_order(seed, j, e, n_train)``:
step ``t`` of ``T`` steps per epoch takes the slice ``[floor(t n / T), floor((t + 1) n / T))`` of that
order from every shard (a stratified minibatch of about ``D_train / T`` documents). All of it depends on
(seed, shard, epoch, step) only, so the driver can plan steps without reading data and the statistics
do not depend on how shards are spread over workers.
"""

from __future__ import annotations

import functools
import time
from typing import NamedTuple

import numpy as np

from pgmflow.tasks import rng as _rng
from pgmflow.tasks.lda import corpus as _corpus
from pgmflow.tasks.lda import estep as _estep
from pgmflow.tasks.lda import evaluate as _evaluate


class ShardState(NamedTuple):
    """A shard as a worker holds it."""

    index: int  # j, the shard's position in the corpus
    path: str  # the corpus directory
    shard: object  # DocTermShard, or None when shards are re-read from disk each step
    train_ids: np.ndarray  # int64 [n_train] local ids of the training documents
    heldout_obs: _evaluate.CSR  # observed halves of the held-out documents
    heldout_test: _evaluate.CSR  # test halves of the held-out documents
    heldout_words: np.ndarray  # sorted word ids used by the held-out documents


class ShardStats(NamedTuple):
    """The E-step of one shard's part of a minibatch: sum-able in shard order."""

    index: int  # shard j
    cols: np.ndarray  # sorted word ids the shard's documents used in this step
    sstats: np.ndarray  # [len(cols), K] sum of c_n phi_nk over the shard's documents
    doc_bound: float  # sum of per-document bounds
    n_tokens: float
    n_docs: int
    iterations: int
    seconds: float  # wall time of this shard's E-step (a timing: recorded, never compared)


def train_split(n_docs: int, seed: int, shard_index: int, heldout_fraction: float) -> np.ndarray:
    """Local ids of the training documents of shard ``shard_index`` (the rest are held out)."""
    return np.flatnonzero(~_evaluate.heldout_mask(n_docs, seed, shard_index, heldout_fraction)).astype(np.int64)


def shard_order(seed: int, shard_index: int, epoch: int, n_train: int) -> np.ndarray:
    """Positions 0..n_train-1 in the order they enter the minibatches of one epoch."""
    return _rng.generator(seed, _rng.STAGE_LDA_ORDER, shard_index, epoch).permutation(n_train)


def step_positions(order: np.ndarray, step: int, steps_per_epoch: int) -> np.ndarray:
    n = order.size
    lo, hi = (step * n) // steps_per_epoch, ((step + 1) * n) // steps_per_epoch
    return order[lo:hi]


def step_docs(state: ShardState, seed: int, epoch: int, step: int, steps_per_epoch: int) -> np.ndarray:
    """Local ids of this shard's documents in minibatch ``step`` of ``epoch`` (sorted)."""
    order = shard_order(seed, state.index, epoch, state.train_ids.size)
    return np.sort(state.train_ids[step_positions(order, step, steps_per_epoch)])


def prepare_shard(
    path: str,
    index: int,
    seed: int,
    heldout_fraction: float,
    keep_in_memory: bool = True,
    observed_fraction: float = 0.5,
) -> ShardState:
    """Load shard ``index`` of the corpus at ``path`` and split off its held-out documents."""
    _estep.warm_up()  # compile the kernels while loading, not in the first minibatch
    shard = _corpus.load_shard(path, index)
    n = shard.indptr.size - 1
    mask = _evaluate.heldout_mask(n, seed, index, heldout_fraction)
    held = np.flatnonzero(mask)
    sub = _corpus.slice_docs(shard, held)
    obs, test = _evaluate.completion_split(sub.indptr, sub.indices, sub.counts, seed, (index,), observed_fraction)
    words = np.unique(np.concatenate([obs.indices, test.indices])).astype(np.int64)
    return ShardState(
        index, str(path), shard if keep_in_memory else None, np.flatnonzero(~mask).astype(np.int64), obs, test, words
    )


def _data(state: ShardState):
    if state.shard is not None:
        return state.shard
    return streamed_shard(state.path, state.index)


@functools.lru_cache(maxsize=4)
def _info(path: str):
    return _corpus.open_corpus(path)


def streamed_shard(path: str, index: int):
    """A shard read from disk on demand: its arrays memory-mapped (only the pages of the documents a
    step uses are read), without re-validation (preflight checked every shard before the run).
    Compressed shard files cannot be mapped and are loaded whole."""
    info = _info(path)
    f = _corpus.shard_file(info, index)
    arrays = _corpus._npz_memmaps(f, ("indptr", "indices", "counts"))
    if arrays is None:
        return _corpus.load_shard(info, index)
    return _corpus.DocTermShard(
        np.asarray(arrays["indptr"], dtype=np.int64),
        arrays["indices"],
        arrays["counts"],
        info.n_words,
        info.shard_offsets[index],
    )


def _words_of_docs(sh, docs: np.ndarray) -> np.ndarray:
    """Unique word ids of some documents of a shard (vectorised gather of their CSR rows)."""
    starts, ends = sh.indptr[docs], sh.indptr[docs + 1]
    lens = ends - starts
    if lens.sum() == 0:
        return np.zeros(0, np.int64)
    off = np.zeros(lens.size, np.int64)
    np.cumsum(lens[:-1], out=off[1:])
    take = np.repeat(starts - off, lens) + np.arange(lens.sum())
    return np.unique(sh.indices[take]).astype(np.int64)


def step_words(states, seed: int, epoch: int, step: int, steps_per_epoch: int) -> np.ndarray:
    """Sorted word ids used by the documents of ``states`` in one minibatch (what must be sent)."""
    out = [np.zeros(0, np.int64)]
    for st in states:
        sh = _data(st)
        docs = step_docs(st, seed, epoch, step, steps_per_epoch)
        out.append(_words_of_docs(sh, docs))
    return np.unique(np.concatenate(out))


def estep_group(
    states,
    seed: int,
    epoch: int,
    step: int,
    steps_per_epoch: int,
    cols: np.ndarray,
    exp_elog_beta: np.ndarray,
    alpha: np.ndarray,
    max_iter: int,
    tol: float,
    pr=None,
    next_step: tuple | None = None,
    backend: str = "numpy",
) -> tuple[list[ShardStats], np.ndarray | None]:
    """The E-step of one minibatch on a group of shards held by one worker.

    ``cols`` [C] are the word ids the group needs (from :func:`step_words`) and ``exp_elog_beta``
    [C, K] their ``exp(E[log beta])``. Returns one :class:`ShardStats` per shard (in the order of
    ``states``) and, when ``next_step = (epoch, step)`` is given, the word ids the group will need then.
    ``backend="cupy"`` runs the E-step on the worker's GPU (``estep.estep_xp``).
    """
    out = []
    for st in states:
        t0 = time.perf_counter()
        sh = _data(st)
        docs = step_docs(st, seed, epoch, step, steps_per_epoch)
        res = _estep.estep(
            sh.indptr,
            sh.indices,
            sh.counts,
            docs,
            cols,
            exp_elog_beta,
            alpha,
            max_iter,
            tol,
            pr=pr,
            return_gamma=False,
            array_backend=backend,
        )
        used = np.flatnonzero(res.sstats.any(axis=1))
        out.append(
            ShardStats(
                st.index,
                cols[used],
                np.ascontiguousarray(res.sstats[used]),
                res.doc_bound,
                res.n_tokens,
                int(docs.size),
                res.iterations,
                time.perf_counter() - t0,
            )
        )
    nxt = None if next_step is None else step_words(states, seed, next_step[0], next_step[1], steps_per_epoch)
    return out, nxt


def heldout_words(states) -> np.ndarray:
    return np.unique(np.concatenate([np.zeros(0, np.int64)] + [st.heldout_words for st in states]))


def heldout_group(
    states, cols: np.ndarray, lam_cols: np.ndarray, lam_rowsum: np.ndarray, alpha: np.ndarray, max_iter: int, tol: float
) -> list[tuple[int, float, float]]:
    """Document-completion log likelihood of each shard's held-out documents: [(j, sum log p, tokens)]."""
    out = []
    for st in states:
        ll, nt = _evaluate.completion_log_likelihood(
            st.heldout_obs,
            st.heldout_test,
            alpha,
            lam=lam_cols,
            cols=cols,
            lam_rowsum=lam_rowsum,
            max_iter=max_iter,
            tol=tol,
        )
        out.append((st.index, ll, nt))
    return out


def cooccurrence_group(states, word_ids: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Document and co-document frequencies of ``word_ids`` over each shard's training documents."""
    out = []
    for st in states:
        sh = _corpus.slice_docs(_data(st), st.train_ids)
        df, co = _evaluate.cooccurrence(sh.indptr, sh.indices, word_ids)
        out.append((st.index, df, co))
    return out


def gamma_group(
    states,
    cols: np.ndarray,
    exp_elog_beta: np.ndarray,
    alpha: np.ndarray,
    max_iter: int,
    tol: float,
    pr=None,
    max_docs: int = 2000,
) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Topic proportions of (up to ``max_docs`` of) each shard's training documents: [(j, doc ids, gamma)]."""
    out = []
    for st in states:
        sh = _data(st)
        docs = st.train_ids[:max_docs]
        res = _estep.estep(sh.indptr, sh.indices, sh.counts, docs, cols, exp_elog_beta, alpha, max_iter, tol, pr=pr)
        out.append((st.index, docs, res.gamma))
    return out


def words_of_group(states, max_docs: int = 2000) -> np.ndarray:
    """Sorted word ids used by the training documents of the group (for gamma_group)."""
    out = [np.zeros(0, np.int64)]
    for st in states:
        sh = _data(st)
        out.append(_words_of_docs(sh, st.train_ids[:max_docs]))
    return np.unique(np.concatenate(out)).astype(np.int64)


def true_heldout_group(
    states, topics: np.ndarray, alpha: np.ndarray, max_iter: int, tol: float
) -> list[tuple[int, float, float]]:
    """Document-completion log likelihood of each shard's held-out documents under known topics
    (a synthetic corpus's true model): [(j, sum log p, tokens)]."""
    return [
        (
            st.index,
            *_evaluate.completion_log_likelihood(
                st.heldout_obs, st.heldout_test, alpha, topics=topics, max_iter=max_iter, tol=tol
            ),
        )
        for st in states
    ]
