"""Run Dask graphs the same way on a distributed cluster and on the synchronous scheduler.

Graph builders make ``dask.delayed`` objects with deterministic keys; :class:`Executor` computes a
list of them and returns *handles*: ``distributed.Future`` objects that stay on the workers (with
a client) or plain values (synchronous scheduler). Handles can be fed into the next graph, so state
stays where it is between rounds, and only what is gathered travels to the driver.

A task too big for its worker: the nanny restarts a worker that passes 95% of its ``memory_limit``
and the scheduler retries the task elsewhere; when every try killed its worker the client sees
``KilledWorker``. :class:`Executor` turns that (and a ``MemoryError`` raised by a task) into a
:class:`WorkerMemoryError`: one line naming the task, the memory it reached, and the settings to
change. The CLI prints it with exit code 1 (the config is valid; this cluster is too small for its
chunks) and the MLflow run ends FAILED with the same line.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import dask
import dask.callbacks
import dask.local


class Executor:
    def __init__(self, client=None):
        self.client = client

    @property
    def distributed(self) -> bool:
        return self.client is not None

    @property
    def local(self) -> bool:
        """The workers are a LocalCluster's, on this machine: the driver can fetch results from them
        directly rather than through the scheduler (one copy less through this process's event loop;
        a remote cluster's workers may not be reachable from the driver)."""
        if self.client is None:
            return False  # no workers: nothing to fetch from (and no import of distributed)
        from distributed import LocalCluster

        return isinstance(getattr(self.client, "cluster", None), LocalCluster)

    def scatter(self, obj, place: int | None = None):
        """Put a (large, constant) object on the cluster once; returns a handle.

        Not ``client.scatter``: scattered data has no lineage, so a worker lost at the wrong moment
        loses it for good and every task that needs it fails. Here the object is the result of a
        task whose spec holds it, so the scheduler recomputes it elsewhere after a worker dies.
        Each worker that needs it fetches it once.

        ``place``: the index of the object in a partition of the data (a chunk number): object ``i``
        goes to worker ``i mod W`` of the ``W`` workers in address order (loosely: elsewhere when that
        one is gone), so the parts are spread evenly. Without it the scheduler may put 6 of 10 chunks on
        one of two workers, and every pass over them then waits for that worker. Only placement: the
        results of tasks never depend on it.
        """
        if self.client is None:
            return obj
        from dask.base import tokenize

        key = f"const-{type(obj).__name__}-{tokenize(obj)}"
        where = {}
        if place is not None:
            workers = self._workers()
            if workers:
                where = {"workers": [workers[int(place) % len(workers)]], "allow_other_workers": True}
        return self.client.submit(_identity, obj, key=key, pure=False, **where)

    def _workers(self) -> list:
        """The workers' addresses in order, asked of the scheduler at most once a second (scattering the
        chunks of a big data set one by one would otherwise ask once per chunk)."""
        now = time.monotonic()
        cached = getattr(self, "_worker_list", None)
        if cached is None or now - cached[0] > 1.0:
            cached = (now, sorted(self.client.scheduler_info(n_workers=-1)["workers"]))
            self._worker_list = cached
        return cached[1]

    def compute(
        self,
        outputs: Sequence,
        watch: Sequence[int] = (),
        on_done: Callable[[int], None] | None = None,
        on_result: Callable[[int, object], None] | None = None,
    ):
        """Compute ``outputs`` (delayed objects); as each watched output finishes, call ``on_result(i,
        value)`` (the value fetched to the driver: a workload saving finished units) and ``on_done(i)``.

        Returns a list of handles in the order of ``outputs``.
        """
        if self.client is None:
            watch_keys = {outputs[i].key: i for i in watch}
            watched = (on_done or on_result) and watch_keys
            # dask.local.get_sync is what scheduler="synchronous" names; passed as the function, dask does not
            # import distributed to look for a client (0.5 s a run in the driver never needs). The callbacks are
            # this compute's own, passed to it: dask's global ones (``with Callback():``) are taken whole by the
            # first compute that starts and hidden from every other until it ends, so two computes in two
            # threads (a study's stages in the driver) lost one's callbacks and its watched results.
            callbacks = [_sync_callback(watch_keys, on_done, on_result)] if watched else []
            return list(
                dask.compute(*outputs, scheduler=dask.local.get_sync, optimize_graph=False, callbacks=callbacks)
            )
        from distributed import as_completed

        futures = self.client.compute(list(outputs), optimize_graph=False)
        if (on_done is not None or on_result is not None) and watch:
            index = {futures[i].key: i for i in watch}
            with self._memory_errors():
                # this client's loop, not the default client's (after a reconnect the default may be a closed one)
                for fut in as_completed([futures[i] for i in watch], loop=self.client.loop):
                    if fut.status == "error":
                        fut.result()  # raises the task's exception here
                    if on_result is not None:
                        on_result(index[fut.key], fut.result())
                    if on_done is not None:
                        on_done(index[fut.key])
        return futures

    def submit(self, specs: Sequence[TaskSpec], outputs: Sequence[int]) -> list:
        """Submit the tasks ``specs`` as one graph and return handles for ``specs[i]``, ``i`` in ``outputs``.

        :meth:`compute` with ``dask.delayed`` objects costs the driver ~2 ms per graph in building and
        tokenising them, and the scheduler a pass over the expression; a loop that submits a few-task graph
        three times a second (the sparse GP's evaluations) feels both. Here each task becomes one node of a
        low-level graph directly. A :class:`TaskSpec`'s argument that is a :class:`Dep` (the result of an
        earlier spec), a handle, or a list holding them is a dependency; anything else is passed as it is.
        ``worker`` places the task there loosely (another worker may take it). Without a client the specs
        run in order in this process."""
        if self.client is None:
            done: dict = {}
            for s in specs:
                done[s.key] = s.func(*[_with_deps(a, lambda d: done[d.key]) for a in s.args])
            return [done[specs[i].key] for i in outputs]
        from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
        from dask.task_spec import List, Task, TaskRef

        layers, deps = {}, {}
        for s in specs:
            used: set = set()
            # a Dep becomes a reference to its task; a list holding references (handles are references too)
            # becomes a List node, so that the scheduler sees them as dependencies
            args = [
                _with_deps(a, lambda d: used.add(d.key) or TaskRef(d.key), (Dep, TaskRef), lambda xs: List(*xs))
                for a in s.args
            ]
            where = {"workers": [s.worker], "allow_other_workers": True} if s.worker is not None else None
            layers[s.key] = MaterializedLayer({s.key: Task(s.key, s.func, *args)}, annotations=where)
            deps[s.key] = used
        keys = [specs[i].key for i in outputs]
        return list(self.client.get(HighLevelGraph(layers, deps), keys, sync=False))

    def gather(self, handles, direct: bool | None = None):
        """The results of ``handles``; ``direct``: fetched from the workers straight (see :attr:`local`)."""
        if self.client is None:
            return handles
        with self._memory_errors():
            return self.client.gather(handles, direct=direct)

    @contextlib.contextmanager
    def _memory_errors(self):
        """Raise a WorkerMemoryError in place of a KilledWorker caused by memory, or a task's MemoryError."""
        from distributed.scheduler import KilledWorker

        try:
            yield
        except KilledWorker as exc:
            err = self._killed_by_memory(exc)
            if err is None:
                raise
            raise err from exc
        except MemoryError as exc:
            raise WorkerMemoryError(None, None, None, None, detail=str(exc)) from exc

    def _killed_by_memory(self, exc) -> WorkerMemoryError | None:
        """The nanny logs a ``worker-restart-memory`` event before it restarts a worker for memory."""
        worker = getattr(exc.last_worker, "address", None)
        limit = getattr(exc.last_worker, "memory_limit", None)
        deadline = time.monotonic() + 2.0  # the event and the task's failure travel separately
        while True:
            try:
                events = [e for _, e in self.client.get_events("worker-restart-memory")]
            except Exception:  # pragma: no cover - an old scheduler without events
                return None
            mine = [e for e in events if isinstance(e, dict) and e.get("worker") == worker]
            if mine or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if not mine:
            return None
        return WorkerMemoryError(exc.task, mine[-1].get("rss"), limit, exc.allowed_failures + 1)

    def gather_ordered(self, outputs, key=None, flatten: bool = False, release: bool = False) -> list:
        """Compute delayed ``outputs`` and return their results in task-id order, never in completion
        order: the order of ``outputs``, or, with ``flatten``, the items of every output's list in turn,
        sorted (stably) by ``key`` when given (e.g. the shard index each item carries)."""
        handles = self.compute(outputs)
        results = self.gather(handles)
        if release:
            self.release(handles)
        if flatten:
            results = [item for part in results for item in part]
        return sorted(results, key=key) if key is not None else list(results)

    def sum_ordered(self, outputs, batch: int = 16):
        """Compute delayed ``outputs`` and add their results left to right (``((r0 + r1) + r2) + ...``,
        the same bits for any placement), gathering ``batch`` at a time to bound the driver's memory."""
        return self.sum_handles(self.compute(outputs), batch)

    def sum_handles(self, handles, batch: int = 16):
        """The results of ``handles`` added left to right, gathered (and released) ``batch`` at a time."""
        total = None
        for i in range(0, len(handles), batch):
            for part in self.gather(handles[i : i + batch]):
                total = part if total is None else total + part
            self.release(handles[i : i + batch])
        return total

    def release(self, handles):
        if self.client is not None:
            for h in handles:
                if hasattr(h, "release"):
                    h.release()


def _identity(x):
    return x


class SchedulerLost(RuntimeError):
    """The driver lost the Dask scheduler and it did not come back within ``cluster.reconnect_limit``."""


def connection_lost(exc: BaseException, client) -> bool:
    """Whether ``exc`` means that the driver lost its connection to the scheduler (not a task's failure):
    a result cancelled for ``scheduler-connection-lost`` (the client cancels every pending future when its
    connection drops), or for ``lost dependencies`` (a graph submitted after a quick reconnection names results
    of the earlier connection, which the scheduler forgot with it: pgmflow never releases a result it still
    uses), a closed comm, or any error raised while the client is not connected."""
    import asyncio
    import concurrent.futures

    cancelled = (asyncio.CancelledError, concurrent.futures.CancelledError)  # distributed raises the latter

    seen = set()
    e = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = f"{getattr(e, 'reason', '')} {e}"
        if isinstance(e, cancelled) and ("scheduler-connection-lost" in text or "lost dependencies" in text):
            return True
        if isinstance(e, OSError) and type(e).__name__ == "CommClosedError":  # distributed's, by name: its module
            return True  # (distributed.comm.core) is internal (tests/test_internals.py)
        e = e.__cause__ or e.__context__
    return client is not None and getattr(client, "status", "running") != "running"


def await_scheduler(client, address: str | None, limit: float):
    """Wait up to ``limit`` seconds for the scheduler at ``address``: ``client`` itself once it has
    reconnected (it tries for its own ``timeout``), or else a new client of the same address and security.
    Returns the connected client; raises :class:`SchedulerLost` after ``limit``."""
    from distributed import Client

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if client.status == "running":
            return client
        if client.status in ("closed", "closing") and address:
            try:
                wait = max(1.0, min(10.0, deadline - time.monotonic()))
                return Client(address, security=client.security, timeout=wait)
            except (OSError, TimeoutError):
                pass
        time.sleep(0.5)
    raise SchedulerLost(address or "the scheduler")


class Dep(NamedTuple):
    """An argument of a :class:`TaskSpec`: the result of the spec ``key`` submitted in the same graph."""

    key: str


class TaskSpec(NamedTuple):
    """One task of :meth:`Executor.submit`: ``func(*args)`` under ``key``, placed loosely on ``worker``."""

    key: str
    func: Callable
    args: tuple
    worker: str | None = None


def _with_deps(a, dep, refs=(Dep,), seq=list, match=(Dep,)):
    """An argument of a :class:`TaskSpec` with ``dep(d)`` in place of each ``d`` of a type in ``match`` (a
    :class:`Dep`), itself or in a list (a list holding any of ``refs`` is rebuilt with ``seq``; other list items
    stay as they are)."""
    if isinstance(a, match):
        return dep(a)
    if isinstance(a, list) and any(isinstance(x, refs) for x in a):
        return seq([dep(x) if isinstance(x, match) else x for x in a])
    return a


def __getattr__(name):  # PinBlasThreads lives beside distributed (pgmflow.core.worker_plugin): imported on use,
    # so a run in the driver (pgmflow.core.smallwork) never imports distributed
    if name == "PinBlasThreads":
        from pgmflow.core.worker_plugin import PinBlasThreads

        return PinBlasThreads
    raise AttributeError(name)


def chunk_settings() -> list[tuple[str, str]]:
    """What cuts each workload's work into tasks, by the prefix of its task keys: the first setting to
    change when one task does not fit in a worker (each workload's ``memory_hint``)."""
    from pgmflow.core import registry

    return [w.memory_hint for w in registry.workloads() if w.memory_hint]


def _bytes(n) -> str:
    if not n:
        return "?"
    from dask.utils import format_bytes

    return format_bytes(int(n))


class WorkerMemoryError(RuntimeError):
    """A task needs more memory than a worker may use. ``str()`` is one line ending in the fix."""

    def __init__(self, task, rss, memory_limit, tries, detail: str | None = None):
        self.task, self.rss, self.memory_limit, self.tries = task, rss, memory_limit, tries
        key = str(task) if task is not None else ""
        chunk = next((hint for prefix, hint in chunk_settings() if key.startswith(prefix)), None)
        fixes = ([chunk] if chunk else []) + [
            "a larger memory_limit for the cluster profile in dask_cluster.yaml",
            "fewer workers per machine (cluster.n_workers=N) with memory_limit: auto, so each gets more",
        ]
        if task is not None:
            what = (
                f"task {key!r} ran its worker out of memory: the worker reached {_bytes(rss)} of its "
                f"memory_limit {_bytes(memory_limit)} and was restarted; all {tries} workers that tried the "
                "task died"
            )
        else:
            what = f"a task ran out of memory on its worker ({detail or 'MemoryError'})"
        super().__init__(f"{what}; fix: {', or '.join(fixes)}")


def _sync_callback(watch_keys, on_done, on_result=None) -> tuple:
    """A callback of the synchronous scheduler that reports each watched key as its task finishes: the
    ``(start, start_state, pretask, posttask, finish)`` tuple that ``dask.local.get_async`` takes in its
    ``callbacks`` list."""

    def posttask(key, result, dsk, state, worker_id):
        i = watch_keys.get(key)
        if i is not None:
            if on_result is not None:
                on_result(i, result)
            if on_done is not None:
                on_done(i)

    return (None, None, None, posttask, None)
