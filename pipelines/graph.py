"""Run Dask graphs the same way on a distributed cluster and on the synchronous scheduler.

Graph builders make ``dask.delayed`` objects with deterministic keys; :class:`Executor` computes a
list of them and returns *handles*: ``distributed.Future`` objects that stay on the workers (with
a client) or plain values (synchronous scheduler). Handles can be fed into the next graph, so state
stays where it is between rounds, and only what is gathered travels to the driver.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import dask
import dask.callbacks


class Executor:
    def __init__(self, client=None):
        self.client = client

    @property
    def distributed(self) -> bool:
        return self.client is not None

    def scatter(self, obj):
        """Put a (large, constant) object on the cluster once; returns a handle.

        Not ``client.scatter``: scattered data has no lineage, so a worker lost at the wrong moment
        loses it for good and every task that needs it fails. Here the object is the result of a
        task whose spec holds it, so the scheduler recomputes it elsewhere after a worker dies.
        Each worker that needs it fetches it once.
        """
        if self.client is None:
            return obj
        from dask.base import tokenize

        key = f"const-{type(obj).__name__}-{tokenize(obj)}"
        return self.client.submit(_identity, obj, key=key, pure=False)

    def compute(self, outputs: Sequence, watch: Sequence[int] = (), on_done: Callable[[int], None] | None = None):
        """Compute ``outputs`` (delayed objects); call ``on_done(i)`` as each watched output finishes.

        Returns a list of handles in the order of ``outputs``.
        """
        if self.client is None:
            watch_keys = {outputs[i].key: i for i in watch}
            cb = _SyncCallback(watch_keys, on_done) if on_done and watch_keys else None
            with cb if cb is not None else contextlib.nullcontext():
                return list(dask.compute(*outputs, scheduler="synchronous", optimize_graph=False))
        from distributed import as_completed

        futures = self.client.compute(list(outputs), optimize_graph=False)
        if on_done is not None and watch:
            index = {futures[i].key: i for i in watch}
            for fut in as_completed([futures[i] for i in watch]):
                if fut.status == "error":
                    fut.result()  # raises the task's exception here
                on_done(index[fut.key])
        return futures

    def gather(self, handles):
        if self.client is None:
            return handles
        return self.client.gather(handles)

    def release(self, handles):
        if self.client is not None:
            for h in handles:
                if hasattr(h, "release"):
                    h.release()


def _identity(x):
    return x


class _SyncCallback(dask.callbacks.Callback):
    def __init__(self, watch_keys, on_done):
        super().__init__()
        self.watch_keys = watch_keys
        self.on_done = on_done

    def _posttask(self, key, result, dsk, state, id):
        i = self.watch_keys.get(key)
        if i is not None:
            self.on_done(i)
