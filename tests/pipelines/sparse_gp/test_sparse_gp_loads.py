"""Each data file of a sparse-GP run is read once per run: by the validation, which puts the data in the run's
plan (``pgmflow.sparse_gp.plan.Plan``); the run takes it from there, and no module-level cache
carries it from one call (or run) to the next.

Real runs (``runner.execute`` through ``tests.pipelines.helpers.run``) on a real LocalCluster with a real MLflow
store; the driver's reads are counted by wrappers around the functions that open files (``open``,
``pathlib.Path.open``, ``numpy.load``, ``numpy.loadtxt``), counting a call made inside another counted call
(``numpy.load`` opening its file) once. An ``.npy`` file is memory-mapped: its chunk tasks read their own rows
in the worker processes, which are not counted; the driver opens it once.
"""

from __future__ import annotations

import builtins
import collections
import io
import os
import pathlib
import threading

import numpy as np
import pytest

from pgmflow.sparse_gp import data as gp_data
from tests.pipelines.helpers import run

BASE = [
    "pipeline=sparse_gp",
    "progress=false",
    "sparse_gp.figures=false",
    "sparse_gp.m=8",
    "sparse_gp.max_iter=3",
    "sparse_gp.chunk_size=100",
]


class OpenCounter:
    """Counts the opens of each file (by its real path) in this process, the outermost call only."""

    def __init__(self, monkeypatch):
        self.counts: collections.Counter = collections.Counter()
        self._depth = threading.local()
        for owner, name in ((builtins, "open"), (io, "open"), (pathlib.Path, "open"), (np, "load"), (np, "loadtxt")):
            monkeypatch.setattr(owner, name, self._wrap(getattr(owner, name)))

    def _wrap(self, func):
        def counted(file, *args, **kwargs):
            depth = getattr(self._depth, "n", 0)
            if depth == 0 and isinstance(file, (str, os.PathLike)):
                self.counts[os.path.realpath(os.fspath(file))] += 1
            self._depth.n = depth + 1
            try:
                return func(file, *args, **kwargs)
            finally:
                self._depth.n = depth

        return counted

    def of(self, *paths) -> list[int]:
        return [self.counts[os.path.realpath(p)] for p in paths]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gp_loads")
    rng = np.random.default_rng(3)
    X = rng.uniform(size=(400, 3))
    y = np.sin(4 * X[:, 0]) + X[:, 1] + 0.1 * rng.standard_normal(400)
    np.save(root / "d.npy", np.column_stack([X, y]))
    np.savez(root / "d.npz", X=X, y=y)
    header = "a,b,c,t\n"
    (root / "d.csv").write_text(
        header + "\n".join(",".join(repr(float(v)) for v in r) for r in np.column_stack([X, y])) + "\n"
    )
    (root / "t.csv").write_text(
        header + "\n".join(",".join(repr(float(v)) for v in r) for r in np.column_stack([X[:50], y[:50]])) + "\n"
    )
    return root


def test_no_module_level_data_cache():
    assert not hasattr(gp_data, "_CACHE")


@pytest.mark.parametrize("kind", ["csv", "npz", "npy", "diabetes", "co2"])
def test_each_data_file_is_read_once_per_run(kind, files, cluster2, tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    if kind in gp_data.SHIPPED:
        data_file = gp_data.SHIPPED[kind][0]
        ov = BASE + [f"gp_data={kind}"]
    else:
        data_file = files / f"d.{kind}"
        ov = BASE + [f"gp_data={kind}", f"gp_data.path={data_file}"]
    paths = [data_file]
    if kind == "csv":  # and a file of rows to score, read once too
        ov.append(f"gp_data.test_path={files / 't.csv'}")
        paths.append(files / "t.csv")
    if kind == "npy":
        ov.append("sparse_gp.restarts=1")  # a second fit on the same chunks reads nothing either
    counter = OpenCounter(monkeypatch)
    for k in (1, 2):  # a second run of the same config reads the files again, once: nothing is cached
        res, tr = run(ov + ["sparse_gp.in_process=false"], uri, cluster2)
        assert tr.client.get_run(tr.run_id).info.status == "FINISHED" and np.isfinite(res["test_nlpd"])
        assert counter.of(*paths) == [k] * len(paths), dict(counter.counts)
    if kind == "npy":  # the chunk tasks did read the file, in the workers
        assert tr.client.get_run(tr.run_id).data.tags["pgmflow.gp.data_access"].startswith("memmap")
