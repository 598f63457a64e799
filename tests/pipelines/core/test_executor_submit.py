"""``Executor.submit``: a few tasks as one low-level graph (what the sparse GP submits three times a second),
on a real LocalCluster and without one: dependencies by ``Dep``, in lists, and on handles of earlier
graphs; results of the outputs only, in the order asked; each task placed on the worker named."""

from __future__ import annotations

import operator

import pytest

from pgmflow.core.graph import Dep, Executor, TaskSpec


def _where(x):
    from distributed import get_worker

    return get_worker().address, x


def _specs(held, worker=None):
    return [
        TaskSpec("t-a", operator.add, (2, 3), worker),
        TaskSpec("t-b", operator.mul, (Dep("t-a"), 10), worker),
        TaskSpec("t-c", sum, ([Dep("t-a"), Dep("t-b"), held],)),
        TaskSpec("t-d", lambda xs, ys: [x * 2 for x in xs] + ys, ([1, 2], ["s"])),
    ]


def test_submit_without_a_cluster_runs_the_specs_in_order():
    ex = Executor(None)
    assert ex.submit(_specs(7), [2, 0, 3]) == [5 + 50 + 7, 5, [2, 4, "s"]]
    with pytest.raises(KeyError):  # a Dep on a task that is not in the graph
        ex.submit([TaskSpec("t-x", abs, (Dep("nowhere"),))], [0])


def test_submit_on_a_cluster_gives_the_same_results_and_places_each_task(cluster2):
    from distributed import Client

    with Client(cluster2) as client:
        ex = Executor(client)
        held = ex.scatter(7, place=0)  # a handle from an earlier graph, as the sparse GP's chunks
        workers = sorted(client.scheduler_info()["workers"])
        handles = ex.submit(_specs(held, workers[1]), [2, 0, 3])
        assert [h.key for h in handles] == ["t-c", "t-a", "t-d"]  # only the outputs come back as handles
        assert ex.gather(handles) == [5 + 50 + 7, 5, [2, 4, "s"]]
        ex.release(handles)
        for w in workers:
            placed = ex.submit([TaskSpec(f"t-where-{w}", _where, (held,), w)], [0])
            assert ex.gather(placed)[0] == (w, 7)
            ex.release(placed)


def _fail(x):
    raise ValueError(f"bad {x}")


def test_gather_direct_gives_the_results_in_order_and_a_tasks_own_error(cluster2):
    """``direct=True`` through the public ``client.gather``."""
    from distributed import Client

    with Client(cluster2) as client:
        ex = Executor(client)
        workers = sorted(client.scheduler_info()["workers"])
        specs = [TaskSpec(f"t-w{i}", _where, (i,), w) for i, w in enumerate(workers)]
        handles = ex.submit(specs, [0, 1])
        want = [(w, i) for i, w in enumerate(workers)]
        assert ex.gather(handles, direct=True) == want
        ex.release(handles)
        bad = ex.submit([TaskSpec("t-fail", _fail, (3,), workers[0])], [0])
        with pytest.raises(ValueError, match="bad 3"):  # the task's own error, as client.gather raises it
            ex.gather(bad, direct=True)
        ex.release(bad)


def test_synchronous_computes_in_two_threads_each_report_every_result():
    """Without a cluster, each compute's results reach its own ``on_result`` also while another thread computes
    (a study's stages run in threads of the driver). Through dask's global callbacks (``with Callback():``),
    the first compute to start took every registered callback and hid them from the other until it ended:
    a bounds stage then missed its results (KeyError 'T0' in a test of the studies, once under load). With
    threads switched every microsecond, that older code lost the callbacks of 33 of 2,000 computes here."""
    import sys
    import threading

    import dask

    ex = Executor(None)
    rounds, errors = 1000, []
    barrier = threading.Barrier(2)

    def worker(tag: int):
        try:
            for r in range(rounds):
                outputs = [dask.delayed(lambda x: x * x, pure=True)(tag * 1000 + r * 10 + i) for i in range(3)]
                got = {}
                barrier.wait(timeout=30)
                res = ex.compute(outputs, watch=range(3), on_result=lambda i, v: got.__setitem__(i, v))
                assert got == dict(enumerate(res)), (tag, r, got, res)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(t,)) for t in (1, 2)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads interleave at every step: the race, if any, shows
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]
