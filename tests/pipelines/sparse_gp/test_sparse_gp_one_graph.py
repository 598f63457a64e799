"""One Dask graph per SGPR evaluation on a real LocalCluster: chunks spread evenly by
``Executor.scatter(place=)``, one statistics and one gradient task per worker placed with its chunks
(every Kuf found in the worker's store), the same bits as the in-process chunked evaluation and as the
one-task-per-chunk graph with its chain of sums; and the malloc thresholds of pgmflow's workers."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pgmflow.core.graph import Executor
from pgmflow.sparse_gp import evaluations as sg
from pgmflow.sparse_gp.plan import FitSettings
from pgmflow.tasks.gp import bounds, chunks
from pgmflow.tasks.gp import kernels as kern
from pgmflow.tasks.threads import pinned_blas


def _kuf_counts():
    from pgmflow.tasks.gp import kuf_cache

    return kuf_cache.counts()


@pytest.mark.parametrize("method", ["sgpr", "dtc"])
def test_one_graph_per_evaluation_is_placed_with_its_chunks_and_gives_the_in_process_bits(
    cluster2, method, monkeypatch
):
    from distributed import Client, wait

    rng = np.random.default_rng(4)
    n, d, m, cs = 1500, 3, 9, 150  # 10 chunks
    X = rng.standard_normal((n, d))
    y = np.cos(X[:, 0]) + 0.1 * rng.standard_normal(n)
    Z = rng.standard_normal((m, d))
    p = kern.make_params([0.8, 1.1, 1.6], 1.2, 0.1)
    with Client(cluster2) as client:
        ex = Executor(client)
        refs = [
            ex.scatter(chunks.Chunk(X[a : a + cs], y[a : a + cs], X[:0], y[:0]), place=c)
            for c, a in enumerate(range(0, n, cs))
        ]
        wait(refs)
        held = client.has_what()
        assert sorted(len(v) for v in held.values()) == [5, 5], held  # evenly, not as the scheduler likes
        fit = FitSettings(max_iter=1, jitter=1e-6, max_tries=6, optimize_inducing=True, checkpoint_every=0, restarts=0)
        ev = sg.Evaluations(sg.Chunks(ex, refs, np.zeros(len(refs), np.int64), f"t-{method}"), method, "rbf", Z, fit)
        monkeypatch.setattr(sg, "GROUPS_TTL", 3600.0)  # (a slow machine must not make the check below flaky)
        groups = ev.groups()
        assert [len(idx) for _, idx in groups] == [5, 5]
        assert all(set(idx) == {i for i, r in enumerate(refs) if r.key in held[w]} for w, idx in groups)
        client.replicate(refs[:4], n=2)  # copies on both workers (as a task that ran elsewhere leaves them)
        asked = []
        who_has = client.who_has
        monkeypatch.setattr(client, "who_has", lambda *a, **k: asked.append(1) or who_has(*a, **k))
        assert ev.groups() == groups and not asked  # within GROUPS_TTL: the groups of the last time
        monkeypatch.setattr(sg, "GROUPS_TTL", 0.0)
        assert ev.groups() == groups and asked  # asked again: each chunk stays with the worker it was put on
        theta = kern.pack(p, Z)
        before = client.run(_kuf_counts)
        f, g = ev(theta)  # one graph per evaluation
        after = client.run(_kuf_counts)
        # every gradient task found its chunk's Kuf where the statistics task left it
        assert sum(after[w]["hits"] - before[w]["hits"] for w in after) == 10
        assert sum(after[w]["misses"] - before[w]["misses"] for w in after) == 0
        # groups placed against where the chunks are (each worker asked for the other's): the tasks run where
        # the placement says (loosely), the chunks travel, the same bits
        monkeypatch.setattr(sg, "GROUPS_TTL", 3600.0)
        ev._groups = (ev._groups[0], [(w, idx) for (w, _), (_, idx) in zip(groups, groups[::-1])])
        ev.records.clear()
        f3, g3 = ev(theta)
        assert f3 == f and np.array_equal(g3, g)
        # one objective task whose adjoints every gradient task fetches (what more than
        # REDUNDANT_OBJECTIVE_GROUPS workers get): the same bits
        monkeypatch.setattr(sg, "REDUNDANT_OBJECTIVE_GROUPS", 1)
        ev.records.clear()
        f1, g1 = ev(theta)
        # one task per chunk and a chain of sums (what many chunks get): the same bits
        monkeypatch.setattr(sg, "GROUP_STATS_BYTES", 0)
        monkeypatch.setattr(sg, "GATHER_BATCH", 3)
        ev.records.clear()
        f2, g2 = ev(theta)
    with pinned_blas():  # one BLAS thread, as on the workers (pgmflow.tasks.threads says why)
        value, dp, dZ = bounds.value_and_grad(method, "rbf", p, Z, X, y, chunk_size=cs)
    assert -f == value and f1 == f and f2 == f
    assert np.array_equal(-g, kern.pack(dp, dZ)) and np.array_equal(g1, g) and np.array_equal(g2, g)


def test_pgmflow_local_workers_start_with_the_malloc_thresholds():
    import logging

    from distributed import Client, LocalCluster

    from pgmflow.core.cluster import WORKER_MALLOC_ENV, worker_malloc

    with worker_malloc({"MALLOC_TRIM_THRESHOLD_": "123456", "OTHER": "x"}):
        cluster = LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=logging.ERROR
        )
    with cluster, Client(cluster) as client:
        env = next(
            iter(
                client.run(
                    lambda: {
                        k: os.environ.get(k) for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "OTHER")
                    }
                ).values()
            )
        )
    assert env == {
        "MALLOC_MMAP_THRESHOLD_": WORKER_MALLOC_ENV["MALLOC_MMAP_THRESHOLD_"],
        "MALLOC_TRIM_THRESHOLD_": "123456",
        "OTHER": None,
    }


def _housekeeping():
    import dask

    from pgmflow.core.cluster import LOCAL_DASK_CONFIG

    return {k: dask.config.get(k) for k in [*LOCAL_DASK_CONFIG, "distributed.admin.tick.limit"]}


def test_local_clusters_start_with_fewer_housekeeping_wakeups(tmp_path):
    """The pipeline's local cluster (open_cluster, as `pgmflow` starts it): its workers and its scheduler run
    with LOCAL_DASK_CONFIG; a value from the user's Dask configuration is kept; a profile's dask_config: wins."""
    import dask
    from distributed import Client

    from pgmflow.core.cluster import LOCAL_DASK_CONFIG, open_cluster

    path = tmp_path / "cluster.yaml"
    path.write_text(
        "profiles:\n  local:\n    type: local\n    n_workers: 1\n    dashboard_address: null\n"
        "    dask_config: {distributed.admin.tick.limit: 7s}\n"
    )
    with dask.config.set({"distributed.admin.system-monitor.interval": "750ms"}):  # the user's own setting
        with open_cluster({"profile": "local", "file": str(path)}) as handle:
            client: Client = handle.client
            seen = next(iter(client.run(_housekeeping).values()))
            tick = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler._tick_interval)
            nanny_interval = next(iter(client.cluster.workers.values())).memory_manager.memory_monitor_interval
    assert seen == {
        "distributed.worker.profile.interval": LOCAL_DASK_CONFIG["distributed.worker.profile.interval"],
        "distributed.admin.tick.interval": LOCAL_DASK_CONFIG["distributed.admin.tick.interval"],
        "distributed.admin.system-monitor.interval": "750ms",
        "distributed.admin.tick.limit": "7s",
        "distributed.worker.memory.monitor-interval": LOCAL_DASK_CONFIG["distributed.worker.memory.monitor-interval"],
    }
    assert nanny_interval == 0.5  # the nannies' own memory monitor, made in this process
    assert tick == 0.5  # the scheduler, made in this process while the cluster started
    assert dask.config.get("distributed.admin.tick.interval") == "20ms"  # this process's own config is back


def test_a_local_profile_refuses_a_dask_config_that_is_not_a_mapping_of_dotted_keys(tmp_path):
    from pgmflow.core.cluster import check_cluster_config
    from pgmflow.core.errors import ConfigError

    path = tmp_path / "cluster.yaml"
    for bad in ("[1, 2]", "{profile: 10ms}"):
        path.write_text(f"profiles:\n  local:\n    type: local\n    dask_config: {bad}\n")
        with pytest.raises(ConfigError, match="dask_config"):
            check_cluster_config({"profile": "local", "file": str(path)})
