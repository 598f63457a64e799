"""MLflow dataset tracking (``pgmflow.core.datasets.log_input``): every pipeline's run records
its input data with a content digest, a source and a profile; the same data gives the same digest,
different data (another seed of a generator) a different one. Real runs on a real MLflow store
(the synchronous scheduler)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pgmflow.core import datasets
from tests.pipelines.helpers import run

BASE = ["debug=default", "progress=false"]
RUNS = {
    "tempering": ["pipeline=tempering", "model.L=4", "tempering.n_rounds=3", "tempering.figures=false"],
    "bayes": [
        "pipeline=tempering",
        "model=bayes",
        "tempering.n_replicas=4",
        "tempering.n_rounds=3",
        "tempering.figures=false",
    ],
    "svi": ["pipeline=svi", "svi.figures=false"],
    "tesla": ["pipeline=tesla", "tesla.figures=false"],
    "bounds": ["pipeline=bounds", "model=mrf", "variational.figures=false"],  # model.path: a file made by the test
    "sparse_gp": ["pipeline=sparse_gp", "sparse_gp.figures=false"],
}
CONTEXTS = {
    "tempering": {"training"},
    "bayes": {"training"},
    "svi": {None},
    "tesla": {"training"},
    "bounds": {None},
    "sparse_gp": {"training", "test"},
}


@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_template):
    import shutil

    d = tmp_path_factory.mktemp("datasets")
    shutil.copyfile(mlflow_template, d / "mlflow.db")
    return f"sqlite:///{d / 'mlflow.db'}"


def _inputs(tr) -> list[tuple[str | None, object]]:
    """(context, mlflow Dataset) of each recorded input of the run."""
    out = []
    for di in tr.client.get_run(tr.run_id).inputs.dataset_inputs:
        ctx = {t.key: t.value for t in di.tags}.get(datasets.CONTEXT_TAG)
        out.append((ctx, di.dataset))
    return out


def _digests(tr) -> dict:
    return {(c, d.name): d.digest for c, d in _inputs(tr)}


@pytest.mark.parametrize("pipeline", list(RUNS))
def test_every_pipeline_records_its_inputs(store, tmp_path, pipeline):
    extra = []
    if pipeline == "bounds":  # a small frustrated MRF from a file
        rng = np.random.default_rng(0)
        J = np.triu(rng.uniform(-1, 1, (6, 6)), 1)
        np.savez(tmp_path / "mrf.npz", J=J + J.T, h=rng.uniform(-0.5, 0.5, 6))
        extra = [f"model.path={tmp_path / 'mrf.npz'}"]
    res, tr = run(BASE + RUNS[pipeline] + extra, store)
    got = _inputs(tr)
    assert got and {c for c, _ in got} == CONTEXTS[pipeline], got
    for _, ds in got:
        assert len(ds.digest) == datasets.DIGEST_CHARS and int(ds.digest, 16) >= 0
        source = json.loads(ds.source)
        assert ("uri" in source) == (ds.source_type == "local") and ("generator" in source) == (
            ds.source_type == "code"
        )
        profile = json.loads(ds.profile)
        assert profile["arrays"] and all(v["shape"] for v in profile["arrays"].values()), profile
    if pipeline == "sparse_gp":
        rows = {c: json.loads(d.profile)["arrays"]["X"]["shape"][0] for c, d in got}
        assert rows == {"training": res["train_rows"], "test": res["test_rows"]}
        assert json.loads(got[0][1].source)["parameters"]["seed"] == 0
    if pipeline == "bounds":
        assert json.loads(got[0][1].source) == {"uri": str(tmp_path / "mrf.npz")}
    if pipeline == "svi":
        profile = json.loads(got[0][1].profile)
        assert profile["documents"] == 3082 and profile["arrays"]["counts"]["shape"] == [133062]


def test_same_data_same_digest_other_data_other_digest(store):
    """sparse_gp: another method on the same data keeps both digests; another seed of the generator
    changes them. tesla: another penalty grid keeps the digest, another seed changes it. svi: the
    corpus's digest does not depend on the run's seed."""
    gp = ["pipeline=sparse_gp", "sparse_gp.figures=false", "gp_data.n=120", "sparse_gp.max_iter=2"]
    a = _digests(run(BASE + gp, store)[1])
    b = _digests(run(BASE + gp + ["sparse_gp.method=dtc"], store)[1])
    c = _digests(run(BASE + gp + ["seed=1"], store)[1])
    assert a == b and a.keys() == c.keys() and all(a[k] != c[k] for k in a)
    tesla = ["pipeline=tesla", "tesla.figures=false", "network.T=20", "network.p=6"]
    t0 = _digests(run(BASE + tesla, store)[1])
    t1 = _digests(run(BASE + tesla + ["tesla.lambda1=[0.2]"], store)[1])
    t2 = _digests(run(BASE + tesla + ["seed=3"], store)[1])
    assert t0 == t1 and t0 != t2


def test_digest_is_of_the_content():
    x = np.arange(12.0).reshape(3, 4)
    d0, profile = datasets.digest([("X", x), ("y", np.ones(3))])
    assert profile == {"X": {"shape": [3, 4], "dtype": "<f8"}, "y": {"shape": [3], "dtype": "<f8"}}
    assert datasets.digest([("X", x.copy()), ("y", np.ones(3))])[0] == d0
    x2 = x.copy()
    x2[2, 3] += 1e-12
    assert datasets.digest([("X", x2), ("y", np.ones(3))])[0] != d0  # one value
    assert datasets.digest([("X", x.astype(np.float32)), ("y", np.ones(3))])[0] != d0  # the dtype
    assert datasets.digest([("X", x.reshape(4, 3)), ("y", np.ones(3))])[0] != d0  # the shape
    assert datasets.digest([("y", np.ones(3)), ("X", x)])[0] != d0  # the order
    # a stream of blocks: the profile adds their rows
    assert datasets.digest([("rows", x[:2]), ("rows", x[2:])])[1] == {"rows": {"shape": [3, 4], "dtype": "<f8"}}
    assert datasets.arrays_of({"a": {"b": np.zeros(2)}, "s": "text", "f": None}).keys() == {"a.b", "s"}
