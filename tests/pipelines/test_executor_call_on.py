"""``Executor.call_on``: functions run on the workers named, straight from the driver (what the sparse GP's
evaluations use), on a real LocalCluster and without one: handles are the values the worker holds; a worker
that does not hold one, or cannot be reached, raises ``NotOnWorker``; a function's error is raised as from a
task; nothing goes through the scheduler and nothing is stored on the workers."""

from __future__ import annotations

import logging
import os
import time

import pytest

from pgmflow.pipelines.core import graph
from pgmflow.pipelines.core.graph import Executor, NotOnWorker, TaskSpec, WorkerMemoryError


def _pid_and(x, ys):
    return os.getpid(), x, ys


def _boom(x):
    raise ValueError(f"bad {x}")


def _oom():
    raise MemoryError("unable to allocate 10 TiB")


def test_call_on_without_a_cluster_runs_the_calls_here_in_order():
    ex = Executor(None)
    assert ex.call_on([TaskSpec("a", _pid_and, (1, [2])), TaskSpec("b", _pid_and, (3, []))]) == [
        (os.getpid(), 1, [2]), (os.getpid(), 3, [])]


def test_call_on_runs_on_the_worker_named_with_the_values_it_holds(cluster2):
    from distributed import Client, wait

    with Client(cluster2) as client:
        ex = Executor(client)
        workers = sorted(client.scheduler_info()["workers"])
        pids = client.run(os.getpid)
        held = [ex.scatter(10 * i, place=i) for i in range(2)]  # value 0 on workers[0], 10 on workers[1]
        wait(held)
        where = client.who_has(held)
        assert [where[h.key] for h in held] == [(w,) for w in workers]
        tasks_before = set(cluster2.scheduler.tasks)
        stored_before = client.has_what()
        t0 = time.perf_counter()
        out = ex.call_on([TaskSpec("x", _pid_and, (held[1], [held[1], "s"]), workers[1]),
                          TaskSpec("y", _pid_and, (held[0], []), workers[0])])
        assert out == [(pids[workers[1]], 10, [10, "s"]), (pids[workers[0]], 0, [])]
        assert time.perf_counter() - t0 < 30
        # no task was made and nothing was left on the workers
        assert set(cluster2.scheduler.tasks) == tasks_before and client.has_what() == stored_before
        assert getattr(ex, "_reached") == set(workers)  # each asked once whether it answers, and it did

        with pytest.raises(NotOnWorker, match=held[0].key) as err:  # workers[1] does not hold value 0
            ex.call_on([TaskSpec("z", _pid_and, (held[0], []), workers[1])])
        assert err.value.reachable
        with pytest.raises(ValueError, match="bad 3"):  # the function's own error
            ex.call_on([TaskSpec("f", _boom, (3,), workers[0])])
        with pytest.raises(WorkerMemoryError, match="10 TiB"):  # as a task's MemoryError
            ex.call_on([TaskSpec("m", _oom, (), workers[0])])
        with pytest.raises(NotOnWorker, match="without a worker"):
            ex.call_on([TaskSpec("n", _pid_and, (1, []))])
        ex.release(held)


def test_call_on_a_worker_that_does_not_answer_raises_not_on_worker(cluster2, monkeypatch):
    import socket

    from distributed import Client

    with socket.socket() as s:  # a port nothing listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(graph, "REACH_TIMEOUT", 2.0)
    with Client(cluster2) as client:
        ex = Executor(client)
        t0 = time.monotonic()
        with pytest.raises(NotOnWorker, match="cannot be reached") as err:
            ex.call_on([TaskSpec("x", _pid_and, (1, []), f"tcp://127.0.0.1:{port}")])
        assert not err.value.reachable
        assert time.monotonic() - t0 < 60  # refused at once or after the connect timeout, never hanging


def test_the_workers_run_line_of_direct_calls_is_dropped_and_nothing_else():
    f = graph._QuietRunLines()

    def rec(msg, args, level=logging.INFO):
        return logging.LogRecord("distributed.worker", level, __file__, 1, msg, args, None)

    assert not f.filter(rec("Run out-of-band function %r", ("_run_on_worker",)))
    assert f.filter(rec("Run out-of-band function %r", ("getpid",)))  # client.run's lines stay
    assert f.filter(rec("Run Failed\nFunction: %s\nargs:     %s\nkwargs:   %s\n", ("_run_on_worker", "", ""),
                        logging.WARNING))
