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
