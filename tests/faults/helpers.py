"""Fault injection on a real LocalCluster with worker processes: kill a worker (SIGKILL) mid-run.

``killing_cluster(when)`` starts a 2-worker LocalCluster and a thread that kills one worker
process the first time ``when(cluster)`` is true; the caller runs a pipeline on the cluster inside
the ``with`` block and then checks ``kill.pid`` (the kill happened) and ``kill.too_late`` (the run
had already finished, so the test would prove nothing).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Kill:
    pid: int | None = None
    too_late: bool | None = None
    notes: dict = field(default_factory=dict)


def tasks_done(cluster, prefix: str) -> int:
    """How many tasks whose key starts with ``prefix`` have been seen holding a result so far (results
    are released once consumed, so the scheduler's current state alone undercounts; polled often)."""
    seen = cluster.__dict__.setdefault("_pgmflow_done", {}).setdefault(prefix, set())
    for k, ts in list(cluster.scheduler.tasks.items()):
        if ts.state == "memory" and str(k).startswith(prefix):
            seen.add(k)
    return len(seen)


def artifact_exists(root, name: str) -> bool:
    return root.exists() and any(root.rglob(name))


@contextlib.contextmanager
def killing_cluster(when, finished, timeout: float = 180.0, n_workers: int = 2):
    """Yield ``(cluster, kill)``: one worker is SIGKILLed the first time ``when(cluster)`` holds.
    ``finished(cluster)`` says whether the run's end had already been reached at that moment."""
    from distributed import LocalCluster

    env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    kill = Kill()
    with LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        silence_logs=logging.ERROR,
        dashboard_address=":0",
        env=env,
    ) as cl:
        stop = threading.Event()

        def killer():
            t0 = time.monotonic()
            while time.monotonic() - t0 < timeout and not stop.is_set():
                if when(cl):
                    pid = next(iter(cl.workers.values())).process.pid
                    kill.too_late = bool(finished(cl))
                    os.kill(pid, signal.SIGKILL)
                    kill.pid = pid
                    return
                time.sleep(0.005)

        th = threading.Thread(target=killer, daemon=True)
        th.start()
        try:
            yield cl, kill
        finally:
            stop.set()
            th.join(5)


def assert_killed_mid_run(kill: Kill):
    assert kill.pid is not None, "the worker was never killed"
    assert kill.too_late is False, "killed after the run ended: the test proves nothing"


def assert_same_npz(tr_a, tr_b, artifact: str):
    """The .npz artifact ``artifact`` of two runs holds the same arrays, bit for bit."""
    import numpy as np

    with np.load(tr_a.download(artifact)) as a, np.load(tr_b.download(artifact)) as b:
        assert set(a.files) == set(b.files)
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
