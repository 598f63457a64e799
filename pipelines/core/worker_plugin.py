"""The worker plugin that pins BLAS threads; apart from :mod:`pgmflow.core.graph` so that importing the graph
helpers does not import ``distributed`` (0.5 s), which a run in the driver never needs."""

from __future__ import annotations

from distributed.diagnostics.plugin import WorkerPlugin


class PinBlasThreads(WorkerPlugin):
    """Worker plugin: the worker's BLAS libraries at ``n`` thread(s) from its start (tasks/threads.py
    says why). The runner registers it under :attr:`name` on every cluster it uses, so it reaches
    workers pgmflow did not start and workers that join late; registering again replaces it."""

    name = "pgmflow-blas-threads"

    def __init__(self, n: int = 1):
        self.n = int(n)

    def setup(self, worker=None):
        from pgmflow.tasks.threads import set_blas_threads

        set_blas_threads(self.n)
