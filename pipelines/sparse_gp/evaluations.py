"""The sparse-GP objective on the cluster: the chunks (:class:`Chunks`), the inducing inputs' starting
point, and :class:`Evaluations` (one statistics pass and one gradient pass over the chunks per L-BFGS-B
evaluation, summed in chunk order, so the bound and its gradient are the same bits on any number of
workers: one Dask graph per evaluation, through the public futures API, or the same functions in this
process)."""

from __future__ import annotations

import itertools
import math
import time
from typing import NamedTuple

import dask
import numpy as np

from pgmflow.core.errors import ConfigError
from pgmflow.core.graph import Dep, Executor, TaskSpec
from pgmflow.tasks import rng as trng
from pgmflow.tasks.gp import bounds as gbounds
from pgmflow.tasks.gp import kernels as kern
from pgmflow.tasks.gp import stats as gstats
from pgmflow.tasks.gp.chunks import (
    FileRows,
    chunk_grad_after_task,
    chunk_grad_task,
    chunk_stats_task,
    grad_group_task,
    in_chunk_order,
    objective_grad_group_task,
    objective_groups_task,
    objective_task,
    split_rows,
    stats_group_task,
    sum_task,
)
from pgmflow.tasks.gp.data import heldout_rows, open_npy, split_key
from pgmflow.tasks.gp.inducing import GP_STREAM_INDUCING, kmeans_pp

GATHER_BATCH = 16  # chunk results gathered (and added) at a time: bounds the driver's (or a link's) memory
# One graph per evaluation: the methods whose chunk gradients carry no m x m Kuu adjoint of their own (FITC's do,
# through Lambda: its objective runs on the driver between the passes)
ONE_GRAPH_METHODS = ("sgpr", "dtc")
# One task per worker and pass (the chunks it holds, in turn) while every chunk's statistics together take at
# most this much memory on the worker that adds them; past it, one task per chunk and a chain of sums.
GROUP_STATS_BYTES = 128 << 20
# Up to this many groups (workers), every gradient task computes the objective itself from all the groups'
# statistics (each fetches the others': (W - 1) x m^2 x 8 bytes), instead of one objective task whose adjoints
# every gradient task then fetches: one round trip through the scheduler less, and no worker idle while another
# computes the objective. Past it, one objective task (the statistics would travel W (W - 1) times).
REDUNDANT_OBJECTIVE_GROUPS = 4
GROUPS_TTL = 1.0  # seconds for which the groups (who holds which chunk) are reused between evaluations


class Chunks(NamedTuple):
    """The run's data on the cluster, and how tasks over it are run and named.

    ex: the Executor (``Executor(None)``: in this process). refs: one handle per chunk, in chunk order
    (:func:`chunk_refs`). train_counts: int64 [C], the training rows of each chunk. tok: the token in
    task keys. backend: ``numpy`` or ``cupy``, where the chunk tasks compute.
    """

    ex: Executor
    refs: list
    train_counts: np.ndarray
    tok: str
    backend: str = "numpy"


def chunk_ranges(data, chunk_size):
    return gstats.chunk_bounds(data.n, chunk_size)


def chunk_refs(ex, data, chunk_size: int, seed: int, fraction: float):
    """One handle per chunk, in chunk order: ``FileRows`` for memory-mapped data (tasks read the
    file), otherwise the future of the chunk scattered once. Also the training rows per chunk."""
    key = split_key(seed)
    std = data.standardizer
    refs, counts = [], []
    for c, (a, b) in enumerate(chunk_ranges(data, chunk_size)):
        test = heldout_rows(key, a, b, fraction)
        counts.append(int((~test).sum()))
        if data.memmap:
            refs.append(
                FileRows(
                    data.path,
                    int(a),
                    int(b),
                    int(data.target_col),
                    key,
                    float(fraction),
                    tuple(float(v) for v in std.x_mean),
                    tuple(float(v) for v in std.x_std),
                    float(std.y_mean),
                    float(std.y_std),
                )
            )
        else:
            A = np.column_stack([data.X[a:b], data.y[a:b]])
            refs.append(ex.scatter(split_rows(A, data.d, test, std), place=c))
    return refs, np.asarray(counts, dtype=np.int64)


def inducing_pool(data, seed: int, fraction: float, max_points: int) -> np.ndarray:
    """Training inputs (original units) that k-means++ runs on: all of them, or a seeded subsample of
    ``max_points`` rows (read row by row from the file for memory-mapped data)."""
    key = split_key(seed)
    g = trng.generator(seed, trng.STAGE_GP, GP_STREAM_INDUCING, 1)
    if data.memmap:
        train = np.flatnonzero(~heldout_rows(key, 0, data.n, fraction))
        if train.size > max_points:
            train = train[np.sort(g.choice(train.size, size=max_points, replace=False))]
        rows = data.rows if data.rows is not None else open_npy(data.path)  # the memory map the validation opened
        A = np.asarray(rows[train], dtype=np.float64)
        return np.ascontiguousarray(np.delete(A, data.target_col, axis=1))
    X = data.X[~heldout_rows(key, 0, data.n, fraction)]
    if X.shape[0] > max_points:
        X = X[np.sort(g.choice(X.shape[0], size=max_points, replace=False))]
    return X


def initial_inducing(pool_std: np.ndarray, m: int, seed: int, n_iter: int, max_points: int) -> np.ndarray:
    try:
        return kmeans_pp(
            trng.generator(seed, trng.STAGE_GP, GP_STREAM_INDUCING), pool_std, m, n_iter=n_iter, max_points=max_points
        )
    except ValueError as exc:
        raise ConfigError(
            "sparse_gp.m", m, f"k-means++ cannot place the inducing inputs ({exc})", "use fewer inducing inputs"
        ) from None


class Record(NamedTuple):
    """One evaluated point of :class:`Evaluations`: the objective ``value`` (the bound, not negated), the
    summed statistics ``stats``, the absolute and relative (to ``s``) jitter the objective's Cholesky
    used, the packed gradient ``grad`` of the value, and the jitter the evaluation started from
    (``jitter_start``, what predictions start from)."""

    value: float
    stats: object
    jitter_abs: float
    jitter_rel: float
    grad: np.ndarray
    jitter_start: float


class Evaluations:
    """The objective of L-BFGS-B over ``theta = pack(params, Z)`` (``Z`` only with
    ``optimize_inducing``): ``f(theta) -> (-bound, -gradient)``, one stats pass and one gradient pass
    over the chunks per call (:meth:`passes`). A point evaluated recently is answered from ``records``
    (:class:`Record`) without new passes; a Cholesky that fails at every jitter gives ``(inf, 0)`` (the
    line search backs off). ``count`` and ``seconds`` count the evaluations and their wall time.

    chunks: :class:`Chunks`. method: sgpr | dtc | fitc; kernel: rbf | matern32 | matern52. Z0 [m, d]: the
    inducing inputs (the starting point, or fixed without ``fit.optimize_inducing``). fit:
    :class:`~pgmflow.sparse_gp.plan.FitSettings` (jitter, max_tries, optimize_inducing).
    """

    def __init__(self, chunks: Chunks, method: str, kernel: str, Z0: np.ndarray, fit):
        self.ex, self.refs, self.tok, self.backend = chunks.ex, chunks.refs, chunks.tok, chunks.backend
        self.method, self.kernel = method, kernel
        self.m, self.d = (int(v) for v in Z0.shape)
        self.p = kernel.n_params if kern.is_object(kernel) else None  # a kernel object's hyperparameters
        self.Z0, self.opt = Z0, bool(fit.optimize_inducing)
        self.jitter, self.max_tries = float(fit.jitter), int(fit.max_tries)
        self.count = 0
        self.failed = 0
        self.records: dict[bytes, Record] = {}  # theta.tobytes() -> its Record, the last few
        self.jitters: list[float] = []  # relative jitter of every successful evaluation
        self.first_growth = None  # (evaluation, relative jitter) of the first that needed more than asked
        self.growth_noted = False  # the user has been told about first_growth
        self.seconds = 0.0
        self._serial = itertools.count()  # task keys: unique for the life of the object, whatever count says
        self._held: list = []  # the last one_graph's futures, released after the next graph is submitted
        self._groups = None  # (time, groups()) of the last time the scheduler was asked

    def unpack(self, theta):
        p, Z = kern.unpack(theta, self.d, self.m if self.opt else 0, self.p)
        return p, (self.Z0 if Z is None else Z)

    def factor(self, params, Z):
        """``(L, jitter_abs)``: the Cholesky factor of ``Kuu = K(Z, Z) + jitter s I`` that every chunk's
        statistics of this evaluation are whitened by (``kernels.inducing_cholesky``: the jitter raised tenfold,
        up to ``max_tries`` times, until it factors; CholeskyError after the last), made once on the driver and
        shipped with the chunk tasks."""
        return kern.inducing_cholesky(self.kernel, params, Z, self.jitter, self.max_tries)

    def stats(self, params, Z, L):
        k = next(self._serial)
        outs = [
            dask.delayed(chunk_stats_task, pure=True)(
                self.method,
                self.kernel,
                params,
                Z,
                ref,
                L,
                self.backend,
                dask_key_name=f"gp-stats-{self.tok}-p{k}-c{c}",
            )
            for c, ref in enumerate(self.refs)
        ]
        return self.ex.sum_ordered(outs, batch=GATHER_BATCH)

    def objective(self, params, Z):
        """``(value, adjoints, stats, starting jitter)``: ``Kuu`` factored on the driver (:meth:`factor`), the
        statistics pass whitened by that factor, and ``bounds.objective`` of the sum. ``B = I + A A'`` is
        ``>= I``: only ``Kuu``'s own Cholesky can fail (CholeskyError)."""
        chol = self.factor(params, Z)
        st = self.stats(params, Z, chol[0])
        value, adj = gbounds.objective(self.method, self.kernel, params, Z, st, self.jitter, self.max_tries, chol=chol)
        return value, adj, st, self.jitter

    def _holders(self, workers: list) -> list:
        """The worker that holds each chunk (None for chunks read from a file, or without a cluster):
        both tasks of a chunk are placed there (loosely: another worker may still take them), so the
        gradient task finds the statistics task's ``Kuf`` in its process and nothing travels but
        the adjoints. A chunk held by several workers (copied by a task that ran elsewhere) stays with
        worker ``c mod W`` of ``workers`` when that is one of them, where ``Executor.scatter(place=c)`` put
        it, so the groups stay even. Asked of the scheduler by :meth:`groups` (at most once per
        :data:`GROUPS_TTL`) and by :meth:`chunk_graph` at every evaluation."""
        client = self.ex.client
        futures = [r for r in self.refs if hasattr(r, "key")]
        if client is None or not futures:
            return [None] * len(self.refs)
        who = client.who_has(futures)
        out = []
        for c, r in enumerate(self.refs):
            have = sorted(who.get(r.key, ())) if hasattr(r, "key") else []
            home = workers[c % len(workers)] if workers else None
            out.append(home if home in have else (have[0] if have else None))
        return out

    @staticmethod
    def _placed(worker, make):
        if worker is None:
            return make()
        with dask.annotate(workers=[worker], allow_other_workers=True):
            return make()

    def groups(self) -> list[tuple[str | None, list[int]]]:
        """``[(worker, chunk numbers)]``: the chunks one group task of :meth:`one_graph` takes, with the
        worker it is placed on (loosely), or None without a cluster. A group is every chunk a worker
        holds (scattered chunks; ``Executor.scatter(place=c)`` spreads them evenly) or, for chunks read
        from a file, chunk ``c`` of worker ``c mod W``; groups are ordered by their first chunk. Only
        placement: the results are added in chunk order whatever the groups are. Asked of the scheduler at most
        once per :data:`GROUPS_TTL` seconds (two round trips, ~1.2 ms: 0.4 % of an evaluation at n = 100,000);
        a worker lost in between only means a task runs where its placement did not say (it is loose)."""
        n = len(self.refs)
        if self.ex.client is None:
            return [(None, list(range(n)))]
        now = time.monotonic()
        if self._groups is not None and now - self._groups[0] < GROUPS_TTL:
            return self._groups[1]
        workers = sorted(self.ex.client.scheduler_info(n_workers=-1)["workers"]) or [None]
        holders = self._holders(workers)
        by = {}
        for c, w in enumerate(holders):
            by.setdefault(w if w is not None else workers[c % len(workers)], []).append(c)
        out = sorted(by.items(), key=lambda item: item[1][0])
        self._groups = (now, out)
        return out

    def one_graph(self, params, Z):
        """SGPR and DTC: ``(value, adjoints, summed statistics, starting jitter, summed Grad, Kuu path)`` from one
        graph per evaluation, submitted at once (no round trip to the driver between the passes): one
        statistics task per worker for the chunks it holds (:meth:`groups`), then one task per worker that
        computes the objective from every group's statistics (added in chunk order) and the gradients of its
        chunks (``objective_grad_group_task``: the last group's task also computes what the driver needs, the
        others skip it -- its statistics task goes out last and tends to finish last, and the worker whose
        statistics finish last starts its gradients first: the others are still fetching them; measured on the
        2-core VM of the benchmarks, 0.7 ms. With more than :data:`REDUNDANT_OBJECTIVE_GROUPS` groups, one
        objective task, ``objective_groups_task``, and gradient tasks that take its adjoints). The driver gets
        the adjoints without their m x m parts and ``bounds.kuu_path`` computed on the worker
        (``finish_grad``'s part that needs ``dKuu``), fetched straight from a local cluster's workers. With
        many chunks (their statistics together over :data:`GROUP_STATS_BYTES`), one task per chunk and a
        chain of ordered sums instead
        (:meth:`chunk_graph`). The same sums in the same order on every path: the same bits."""
        if len(self.refs) * self.m * self.m * 8 > GROUP_STATS_BYTES:
            return self.chunk_graph(params, Z)
        chol = self.factor(params, Z)
        k = next(self._serial)
        groups = self.groups()
        order = [idx for _, idx in groups]
        specs = self._stats_specs(k, groups, params, Z, chol[0])
        stats = [Dep(s.key) for s in specs]
        if len(groups) <= REDUNDANT_OBJECTIVE_GROUPS:
            specs += self._objgrad_specs(k, groups, params, Z, order, stats, chol)
        else:
            red = TaskSpec(
                f"gp-objective-{self.tok}-p{k}",
                objective_groups_task,
                (self.method, self.kernel, params, Z, order, stats, self.jitter, self.max_tries, True, chol),
            )
            specs += [red] + [
                TaskSpec(
                    f"gp-grad-{self.tok}-p{k}-g{idx[0]}",
                    grad_group_task,
                    (self.method, self.kernel, params, Z, [self.refs[c] for c in idx], Dep(red.key), self.backend),
                    w,
                )
                for w, idx in groups
            ]
        handles = self.ex.submit(specs, range(len(groups), len(specs)))
        # The previous evaluation's results are let go only now, after this graph went out: the client
        # batches its messages to the scheduler 10 ms apart, so releasing them first would hold this graph
        # back by up to 10 ms. They are a few MB on the workers, and go in the next batch.
        self.ex.release(self._held)
        self._held = handles
        # all at the end: fetching the objective's result while the gradients start would hold up the
        # scheduler (in this process for a local cluster) and the worker that has to send it twice
        out = self.ex.gather(handles, direct=self.ex.local)
        if len(groups) <= REDUNDANT_OBJECTIVE_GROUPS:
            return self._objgrad_results(order, out)
        (value, adj, st, jit0), grads = out[0], out[1:]
        return value, adj, st, jit0, gstats.sum_in_order(in_chunk_order(order, grads)), None

    def _stats_specs(self, k, groups, params, Z, L) -> list[TaskSpec]:
        """Evaluation ``k``'s statistics pass: one ``stats_group_task`` per group, on its worker, whitened by
        the driver's factor ``L``."""
        return [
            TaskSpec(
                f"gp-stats-{self.tok}-p{k}-g{idx[0]}",
                stats_group_task,
                (self.method, self.kernel, params, Z, [self.refs[c] for c in idx], L, self.backend),
                w,
            )
            for w, idx in groups
        ]

    def _objgrad_specs(self, k, groups, params, Z, order, stats, chol) -> list[TaskSpec]:
        """Evaluation ``k``'s objective-and-gradient pass: one ``objective_grad_group_task`` per group, on its
        worker, from the statistics ``stats`` of the groups ``order`` (the last group keeps the driver's part)."""
        return [
            TaskSpec(
                f"gp-objgrad-{self.tok}-p{k}-g{idx[0]}",
                objective_grad_group_task,
                (
                    self.method,
                    self.kernel,
                    params,
                    Z,
                    [self.refs[c] for c in idx],
                    order,
                    stats,
                    self.jitter,
                    self.max_tries,
                    self.backend,
                    i == len(groups) - 1,
                    chol,
                ),
                w,
            )
            for i, (w, idx) in enumerate(groups)
        ]

    @staticmethod
    def _objgrad_results(order, out):
        """:meth:`passes`'s tuple from the results of :meth:`_objgrad_specs` (the last one holds the driver's part):
        the gradients added in chunk order."""
        value, adj, st, jit0, kuu = out[-1][0]
        return value, adj, st, jit0, gstats.sum_in_order(in_chunk_order(order, [g for _, g in out])), kuu

    def chunk_graph(self, params, Z):
        """:meth:`one_graph` with one task per chunk: the statistics tasks, a chain of ordered sums
        (:data:`GATHER_BATCH` chunks a link) whose last link computes the objective on a worker
        (``objective_task``), and the gradient tasks that take its adjoints, each placed (loosely) on
        the worker that holds its chunk. The driver holds at most GATHER_BATCH gradients at a time."""
        chol = self.factor(params, Z)
        k = next(self._serial)
        workers = sorted(self.ex.client.scheduler_info(n_workers=-1)["workers"]) if self.ex.client else []
        holders = self._holders(workers)
        stats = [
            self._placed(
                w,
                lambda c=c, ref=ref: dask.delayed(chunk_stats_task, pure=True)(
                    self.method,
                    self.kernel,
                    params,
                    Z,
                    ref,
                    chol[0],
                    self.backend,
                    dask_key_name=f"gp-stats-{self.tok}-p{k}-c{c}",
                ),
            )
            for c, (ref, w) in enumerate(zip(self.refs, holders))
        ]
        prev = None
        links = range(0, len(stats), GATHER_BATCH)
        for i in links[:-1]:
            prev = dask.delayed(sum_task, pure=True)(
                prev, stats[i : i + GATHER_BATCH], dask_key_name=f"gp-sum-{self.tok}-p{k}-l{i // GATHER_BATCH}"
            )
        last = links[-1]
        red = dask.delayed(objective_task, pure=True)(
            self.method,
            self.kernel,
            params,
            Z,
            prev,
            stats[last:],
            self.jitter,
            self.max_tries,
            True,
            chol,
            dask_key_name=f"gp-objective-{self.tok}-p{k}",
        )
        grads = [
            self._placed(
                w,
                lambda c=c, ref=ref: dask.delayed(chunk_grad_after_task, pure=True)(
                    self.method,
                    self.kernel,
                    params,
                    Z,
                    ref,
                    red,
                    self.backend,
                    dask_key_name=f"gp-grad-{self.tok}-p{k}-c{c}",
                ),
            )
            for c, (ref, w) in enumerate(zip(self.refs, holders))
        ]
        handles = self.ex.compute([red] + grads)
        try:
            value, adj, st, jit0 = self.ex.gather(handles[:1])[0]
            g = self.ex.sum_handles(handles[1:], batch=GATHER_BATCH)
        finally:
            self.ex.release(handles)
        return value, adj, st, jit0, g, None

    def passes(self, params, Z):
        """``(value, adjoints, summed statistics, starting jitter, summed Grad, Kuu path or None)``: the passes over the
        chunks of one evaluation -- for SGPR and DTC, one graph (:meth:`one_graph`; a lost worker's chunks are
        recomputed by the scheduler, the same bits); for FITC, whose statistics depend on the jitter, the
        statistics pass, the objective on the driver (:meth:`objective`, which may redo the statistics at a
        larger jitter) and the gradient pass."""
        if self.method in ONE_GRAPH_METHODS:
            return self.one_graph(params, Z)
        value, adj, st, jit0 = self.objective(params, Z)
        # the adjoints (m x m) are one node of the graph: sent once, fetched once by each worker
        k = next(self._serial)
        d_adj = dask.delayed(adj, name=f"gp-adjoints-{self.tok}-p{k}", traverse=False)
        outs = [
            dask.delayed(chunk_grad_task, pure=True)(
                self.method,
                self.kernel,
                params,
                Z,
                ref,
                d_adj,
                self.backend,
                dask_key_name=f"gp-grad-{self.tok}-p{k}-c{c}",
            )
            for c, ref in enumerate(self.refs)
        ]
        return value, adj, st, jit0, self.ex.sum_ordered(outs, batch=GATHER_BATCH), None

    def __call__(self, theta):
        theta = np.asarray(theta, dtype=np.float64)
        rec = self.records.get(theta.tobytes())
        if rec is not None:  # the same point again (the optimiser's first call): no new passes
            return -rec.value, -rec.grad
        t0 = time.monotonic()
        params, Z = self.unpack(theta)
        try:
            value, adj, st, jit0, g, kuu = self.passes(params, Z)
            dparams, dZ = gbounds.finish_grad(self.method, self.kernel, params, Z, adj, g, kuu)
        except kern.CholeskyError:
            self.count += 1
            self.failed += 1
            self.seconds += time.monotonic() - t0
            return np.inf, np.zeros_like(theta)
        self.count += 1
        self.seconds += time.monotonic() - t0
        grad = kern.pack(dparams, dZ if self.opt else None)
        if not (math.isfinite(value) and np.all(np.isfinite(grad))):
            self.failed += 1
            return np.inf, np.zeros_like(theta)
        rel = adj.jitter / params.variance
        self.jitters.append(rel)
        if self.first_growth is None and rel > self.jitter * 1.5:
            self.first_growth = (self.count, rel)
        self.records[theta.tobytes()] = Record(value, st, adj.jitter, rel, grad, jit0)
        while len(self.records) > 8:
            self.records.pop(next(iter(self.records)))
        return -value, -grad
