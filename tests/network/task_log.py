"""A scheduler preload for the test cluster (``dask scheduler --preload tests/network/task_log.py``): every
task that reaches memory is appended to the file ``$PGMFLOW_NET_TASK_LOG`` as ``<unix time> <worker> <key>``,
so a test can count the tasks a fault made Dask compute again (a key that reached memory twice) and when
each worker was removed (``<unix time> REMOVE <worker>``)."""

from __future__ import annotations

import os
import time

from distributed.diagnostics.plugin import SchedulerPlugin


class TaskLog(SchedulerPlugin):
    name = "pgmflow-net-task-log"

    def __init__(self, path: str):
        self.fh = open(path, "a", buffering=1)

    def transition(self, key, start, finish, *args, **kwargs):
        if finish == "memory":
            self.fh.write(f"{time.time():.3f} {kwargs.get('worker', '-')} {key}\n")

    def remove_worker(self, scheduler=None, worker=None, **kwargs):
        self.fh.write(f"{time.time():.3f} REMOVE {worker}\n")

    def add_worker(self, scheduler=None, worker=None, **kwargs):
        self.fh.write(f"{time.time():.3f} ADD {worker}\n")


def dask_setup(scheduler):
    path = os.environ.get("PGMFLOW_NET_TASK_LOG")
    if path:
        scheduler.add_plugin(TaskLog(path))
