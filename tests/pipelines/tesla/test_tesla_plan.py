"""TESLA's plan: the config is read once, in validation, and the data is loaded once per run.

- every data source (the synthetic generator, an npz file with a truth file, a long-format CSV)
  is loaded exactly once by a whole run (real Hydra composition, the runner, a real LocalCluster or
  the synchronous scheduler, a real MLflow store), and again once by a second run in the same process
  (no cache between runs);
- ``check_tesla`` returns a frozen plan with typed settings and the resolved data;
- the run's modules read no config dict.
"""

from __future__ import annotations

import ast
import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import compose
from tests.pipelines.helpers import run

TESLA_DIR = Path(__file__).resolve().parents[3] / "pipelines" / "tesla"
COMMON = [
    "pipeline=tesla",
    "tesla.lambda1=[0.2,0.1]",
    "tesla.lambda2=[0.5]",
    "tesla.bandwidth=[2.0]",
    "tesla.figures=false",
    "progress=false",
]


@pytest.fixture
def loads(monkeypatch):
    """Counts the calls of every data loader of a TESLA run, by what each call loaded."""
    from pgmflow.tasks.tesla import data as tdata
    from pgmflow.tasks.tesla import synthetic
    from pgmflow.tesla import networks

    seen = Counter()

    def counting(module, name, key):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            seen[(name, key(*args, **kwargs))] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counting(tdata, "load_npz", lambda path: Path(path).name)
    counting(tdata, "load_csv", lambda path: Path(path).name)
    counting(networks, "_load_truth", lambda path, series: Path(path).name)
    counting(synthetic, "time_varying_ising", lambda seed, **kw: (seed, kw["p"], kw["T"]))
    return seen


def _files(tmp_path):
    from pgmflow.tasks.tesla import data as tdata
    from pgmflow.tasks.tesla import synthetic

    net = synthetic.time_varying_ising(5, p=6, T=12, samples_per_time=4, n_edges=6)
    series = tdata.from_array(net.X)
    tdata.save_npz(series, str(tmp_path / "net.npz"))
    tdata.save_csv(series, str(tmp_path / "net.csv"))
    np.savez(tmp_path / "truth.npz", edges=net.edges)


def test_each_data_file_is_loaded_once_per_run(tmp_path, mlflow_uri, cluster2, loads):
    _files(tmp_path)  # before the counting starts
    loads.clear()
    npz = COMMON + [
        "network=npz",
        f"network.path={tmp_path / 'net.npz'}",
        f"network.truth={tmp_path / 'truth.npz'}",
        "tesla.criterion=heldout",
    ]
    res, tr = run(npz, mlflow_uri, cluster2)
    assert tr.client.get_run(tr.run_id).info.status == "FINISHED" and "tesla_f1" in res
    assert loads == {("load_npz", "net.npz"): 1, ("_load_truth", "truth.npz"): 1}, loads

    loads.clear()
    run(COMMON + ["network=csv", f"network.path={tmp_path / 'net.csv'}"], mlflow_uri)  # synchronous scheduler
    assert loads == {("load_csv", "net.csv"): 1}, loads

    loads.clear()
    synth = COMMON + ["network.p=6", "network.T=10", "network.n_edges=5", "seed=11"]
    for _ in range(2):  # a second run in the same process loads again: nothing is cached between runs
        run(synth, mlflow_uri, cluster2)
    assert loads == {("time_varying_ising", (11, 6, 10)): 2}, loads


def test_check_tesla_returns_a_frozen_typed_plan():
    from pgmflow.core.preflight import preflight_checks
    from pgmflow.tesla.networks import NetworkData, SyntheticNetwork
    from pgmflow.tesla.plan import TeslaPlan

    cfg = compose(
        [
            "pipeline=tesla",
            "debug=default",
            "tesla.criterion=heldout",
            "tesla.methods=[keller,tesla]",
            "tesla.lambda1=[1,0.5]",
            "model.q=2",
            "tesla.snapshot_times=[0,3]",
        ]
    )
    plan = preflight_checks(cfg)
    assert isinstance(plan, TeslaPlan) and isinstance(plan.data, NetworkData)
    assert isinstance(plan.network, SyntheticNetwork) and plan.network.p == cfg["network"]["p"]
    est = plan.estimation
    assert est.methods == ("keller", "tesla")
    assert est.grid.lambda1 == (1.0, 0.5) and all(type(v) is float for v in est.grid.lambda1)
    assert est.grid.second_axis("keller") == est.grid.bandwidths and est.grid.second_axis("static") == (0.0,)
    assert est.solver.q == 2 and type(est.solver.max_iter) is int and type(est.solver.tol) is float
    sel = est.selection
    T, N = len(plan.data.series.n_per_time), plan.data.series.X.shape[0]
    assert sel.criterion == "heldout" and sel.heldout.dtype == bool and sel.heldout.shape == (N,)
    assert 0 < sel.heldout.sum() < N
    assert plan.report.snapshot_times == (0, 3) and plan.seed == cfg["seed"]
    assert est.n_path_tasks(5) == 5 * (len(est.grid.bandwidths) + len(est.grid.lambda2))
    for piece, field in (
        (plan, "seed"),
        (est, "methods"),
        (est.grid, "lambda1"),
        (est.solver, "tol"),
        (sel, "criterion"),
        (plan.report, "rule"),
        (plan.network, "p"),
    ):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(piece, field, None)
    # without criterion=heldout nothing is held out; default snapshots are four evenly spaced time points
    plan = preflight_checks(compose(["pipeline=tesla", "debug=default"]))
    assert not plan.estimation.selection.heldout.any()
    assert plan.report.snapshot_times == tuple(sorted({round(x) for x in np.linspace(0, T - 1, 4)}))


def test_the_run_reads_no_config_dict():
    """Below validation, TESLA's modules work from the plan: no name ``cfg`` and no ``ctx.cfg``."""
    for path in sorted(TESLA_DIR.glob("*.py")):
        if path.name == "validate.py":
            continue
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
            a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs
        }
        attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not {"cfg", "tcfg", "ncfg"} & names and "cfg" not in attrs, path.name
