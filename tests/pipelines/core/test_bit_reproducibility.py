"""Same config and seed, same bits: every pipeline, with the driver's BLAS at 1 and at 2 threads, on
the synchronous scheduler, on 1 worker (whose BLAS and numba would run 2 threads if pgmflow let
them) and on 3 workers; every artifact compared bit for bit (timings and the where-it-ran fields of
the recorded config excluded). docs/reproducibility.md states the rule; tasks/threads.py enforces it.

The sparse-GP case is sized so that its chunk computations cross OpenBLAS's threading thresholds
(about 12,000 training rows per chunk): ``test_the_blas_thread_count_changes_bits_without_the_pin``
shows that, with the pin off, 1 and 2 BLAS threads really give different bits there, so the
equality below is not vacuous.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from tests.conftest import REPO
from tests.pipelines.helpers import run

SPARSE_GP = [
    "pipeline=sparse_gp",
    "gp_data=synthetic",
    "gp_data.n=30000",
    "gp_data.d=5",
    "sparse_gp.m=24",
    "sparse_gp.max_iter=3",
    "sparse_gp.chunk_size=15000",
    "sparse_gp.kmeans_iter=2",
    "sparse_gp.in_process=false",
]
CASES = {
    "tempering": ["pipeline=tempering", "debug=default"],
    "svi": ["pipeline=svi", "debug=default"],
    "tesla": ["pipeline=tesla", "debug=default"],
    "bounds": ["pipeline=bounds", "model=ising", "model.L=12", "variational.temperatures=[2.0,2.269185314213022,2.6]"],
    "sparse_gp": SPARSE_GP,
}
COMMON = ["progress=false"]
# where and how a run ran, not what it computed: left out of the comparison of config.yaml
WHERE = ("cluster", "tracking", "progress", "verbose", "resume")
MEMORY_KEY = ("rss",)
# an MLflow model's identity, not its content: when and where it was written (``uri``: the temporary folder its
# arrays were saved from; ``model_code_path``: the temporary folder of its code file), its uuid and run
MODEL_IDENTITY = ("utc_time_created", "model_uuid", "run_id", "artifact_path", "model_id", "uri", "model_code_path")


def _less(obj, keys):
    """A YAML/JSON value less the entries named ``keys``, at any depth."""
    if isinstance(obj, dict):
        return {k: _less(v, keys) for k, v in obj.items() if k not in keys}
    if isinstance(obj, list):
        return [_less(v, keys) for v in obj]
    return obj  # the driver's memory: a measurement of the run, not a result


@pytest.fixture(scope="module")
def greedy_worker():
    """One worker process whose environment asks for 2 BLAS and 2 numba threads: pgmflow's worker
    plugin must bring its BLAS back to 1 thread (numba's kernels do not depend on the count)."""
    from distributed import LocalCluster

    env = {
        "NUMBA_NUM_THREADS": "2",
        "OMP_NUM_THREADS": "2",
        "OPENBLAS_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2",
        "PYTHONPATH": str(REPO),
    }
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=logging.ERROR, env=env
    ) as cl:
        yield cl


def _timing(key: str) -> bool:
    """Timings (as ``pgmflow reproduce`` defines them) and memory measurements."""
    from pgmflow.core.reproduce import TIMING

    return bool(TIMING.search(key)) or any(t in key for t in MEMORY_KEY)


def _strip(obj):
    """A JSON value less its timing entries."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if not _timing(k)}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _csv(text: str) -> list:
    lines = [ln.split(",") for ln in text.splitlines()]
    if not lines:
        return []
    keep = [i for i, k in enumerate(lines[0]) if not _timing(k)]
    return [[row[i] for i in keep if i < len(row)] for row in lines]


def _array(a: np.ndarray):
    """An array as (dtype, shape, bytes); a string holding JSON (a checkpoint's history) as JSON less
    its timings."""
    if a.dtype.kind == "U" and a.ndim == 0:
        try:
            return _strip(json.loads(str(a)))
        except ValueError:
            pass
    return a.dtype.str, a.shape, a.tobytes()


def artifacts(tr) -> dict:
    """Every artifact of the run, in a form compared exactly: arrays as (dtype, shape, bytes), JSON and
    CSV less their timings, config.yaml less where it ran, anything else (figures) as bytes."""
    import yaml

    out = {}
    pending = [None]
    while pending:
        path = pending.pop()
        for info in tr.client.list_artifacts(tr.run_id, path):
            if info.is_dir:
                pending.append(info.path)
                continue
            local = tr.download(info.path)
            name = info.path
            if name.endswith(".npz"):
                with np.load(local, allow_pickle=False) as z:
                    out[name] = {k: _array(z[k]) for k in z.files if not _timing(k)}
            elif name.endswith(".json"):
                out[name] = _strip(json.loads(local.read_text()))
            elif name.endswith(".csv"):
                out[name] = _csv(local.read_text())
            elif name.endswith("/MLmodel"):  # a logged MLflow model: less its identity (time made, uuid, run)
                out[name] = _less(yaml.safe_load(local.read_text()), MODEL_IDENTITY)
            elif name.endswith("config.yaml"):
                out[name] = {k: v for k, v in yaml.safe_load(local.read_text()).items() if k not in WHERE}
            elif name.endswith(".txt"):
                continue  # free-text logs (timings in prose)
            else:
                out[name] = local.read_bytes()
    return out


def _run(name, uri, cluster, driver_threads):
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=driver_threads, user_api="blas"):
        _, tr = run(CASES[name] + COMMON, uri, cluster)
    return artifacts(tr)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_same_bits_for_any_blas_threads_workers_and_scheduler(name, tmp_path, greedy_worker, cluster_factory):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    three = cluster_factory(3)
    ref = _run(name, uri, None, 1)
    assert "results.json" in ref and any(k.endswith((".npz", ".csv")) for k in ref), (
        f"{name}: no numbers to compare: {sorted(ref)}"
    )
    for label, cluster, threads in (
        ("synchronous, driver BLAS 2", None, 2),
        ("1 worker, driver BLAS 1", greedy_worker, 1),
        ("1 worker, driver BLAS 2", greedy_worker, 2),
        ("3 workers, driver BLAS 1", three, 1),
        ("3 workers, driver BLAS 2", three, 2),
    ):
        got = _run(name, uri, cluster, threads)
        assert sorted(got) == sorted(ref), f"{name} on {label}: other artifacts"
        for k in ref:
            assert got[k] == ref[k], f"{name} on {label}: {k} differs from the synchronous run at BLAS 1"


def test_the_plugin_pins_worker_blas(greedy_worker, mlflow_uri):
    from distributed import Client

    from pgmflow.tasks import threads

    run(
        [
            "pipeline=sparse_gp",
            "gp_data=diabetes",
            "sparse_gp.m=8",
            "sparse_gp.max_iter=2",
            "sparse_gp.figures=false",
            *COMMON,
        ],
        mlflow_uri,
        greedy_worker,
    )
    with Client(greedy_worker) as c:
        counts = list(c.run(threads.worker_blas_threads).values())
    assert counts and all(n and set(n) == {1} for n in counts), counts


def test_the_blas_thread_count_changes_bits_without_the_pin(tmp_path, monkeypatch):
    """The hazard the pin removes: the sparse-GP case on the synchronous scheduler with the pin off
    (``PGMFLOW_BLAS_THREADS=0``) gives other bits with the driver's BLAS at 1 and at 2 threads, so the
    equality in the matrix above is not vacuous (skipped where BLAS cannot run 2 threads)."""
    from pgmflow.tasks.threads import blas_libraries

    if (os.cpu_count() or 1) < 2 or not blas_libraries():
        pytest.skip("one CPU (or no BLAS found): BLAS cannot split a reduction between threads here")
    monkeypatch.setenv("PGMFLOW_BLAS_THREADS", "0")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    one, two = (_run("sparse_gp", uri, None, t)["model.npz"] for t in (1, 2))
    assert one != two, "1 and 2 BLAS threads gave the same bits: the sparse-GP case would prove nothing"
