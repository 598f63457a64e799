"""Composed kernels through the pipeline (issue 37), on real LocalClusters and a real MLflow store:

- one SGPR / FITC evaluation with the Rasmussen-Williams kernel, its chunk statistics summed in chunk order on
  the workers, gives the in-process chunked evaluation's value and gradient bit for bit on 1 and 3 workers;
- a whole run with a composed kernel gives the same model, bound trace and results on 1 and 3 workers;
- the logged pyfunc model carries the kernel: loaded back it is the same kernel object and predicts the
  held-out rows with the run's test RMSE; results.json names the fitted hyperparameters;
- every method (sgpr, dtc, fitc, svgp, exact) runs a composed kernel end to end.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pgmflow.core.graph import Executor
from pgmflow.sparse_gp import evaluations as sg
from pgmflow.sparse_gp.plan import FitSettings
from pgmflow.tasks.gp import bounds, chunks
from pgmflow.tasks.gp import kernel_algebra as ka
from pgmflow.tasks.gp import kernels as kern
from pgmflow.tasks.threads import pinned_blas
from tests.pipelines.helpers import run

RW = "long:rbf + seasonal:periodic * decay:rbf + medium:rq + short:rbf + white"
BASE = ["pipeline=sparse_gp", "progress=false", "sparse_gp.figures=false", f"sparse_gp.kernel='{RW}'"]
SMALL = BASE + ["gp_data=co2", "sparse_gp.m=12", "sparse_gp.max_iter=4", "sparse_gp.chunk_size=300"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('sparse_gp_kernels') / 'mlflow.db'}"


def _model(tr) -> dict:
    with np.load(tr.download("model.npz")) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("method", ["sgpr", "fitc"])
def test_composed_kernel_evaluation_gives_the_in_process_bits_on_1_and_3_workers(cluster_factory, method):
    from distributed import Client, wait

    rng = np.random.default_rng(8)
    n, d, m, cs = 900, 2, 8, 100  # 9 chunks
    X = rng.random((n, d)) * 4
    y = np.sin(3 * X[:, 0]) + 0.2 * X[:, 1] + 0.1 * rng.standard_normal(n)
    Z = rng.random((m, d)) * 4
    k = ka.parse(RW.replace("periodic", "periodic[0]") + " + lin:linear[1]", d)
    p = kern.GPParams(rng.uniform(-0.5, 0.3, k.n_params), 0.0, math.log(0.05))
    fit = FitSettings(max_iter=1, jitter=1e-6, max_tries=6, optimize_inducing=True, checkpoint_every=0, restarts=0)
    theta = kern.pack(p, Z)
    with pinned_blas():  # one BLAS thread, as on the workers
        value, dp, dZ = bounds.value_and_grad(method, k, p, Z, X, y, chunk_size=cs)
    for workers in (1, 3):
        with Client(cluster_factory(workers)) as client:
            ex = Executor(client)
            refs = [
                ex.scatter(chunks.Chunk(X[a : a + cs], y[a : a + cs], X[:0], y[:0]), place=c)
                for c, a in enumerate(range(0, n, cs))
            ]
            wait(refs)
            ev = sg.Evaluations(
                sg.Chunks(ex, refs, np.zeros(len(refs), np.int64), f"k-{method}-{workers}"), method, k, Z, fit
            )
            f, g = ev(theta)
            ex.release(refs)
        assert -f == value, workers
        assert np.array_equal(-g, kern.pack(dp, dZ)), workers


def test_composed_kernel_run_is_bit_identical_on_1_and_3_workers_and_its_model_carries_the_kernel(
    store, cluster_factory
):
    import pandas as pd

    from pgmflow.sparse_gp import data as gp_data
    from pgmflow.sparse_gp.model import GPPredictor, load_predictor

    ov = SMALL + ["sparse_gp.in_process=false", "+sparse_gp.kernel_params.seasonal.period=0.08"]
    outs = []
    for workers in (1, 3):
        res, tr = run(ov, store, cluster_factory(workers))
        hist = [(h.step, h.value) for h in tr.client.get_metric_history(tr.run_id, "bound")]
        outs.append((_model(tr), sorted(hist), {k: v for k, v in res.items() if "seconds" not in k and k != "run_id"}))
    (m1, h1, r1), (m3, h3, r3) = outs
    assert m1.keys() == m3.keys()
    for key in m1:
        np.testing.assert_array_equal(m1[key], m3[key], err_msg=key)
    assert h1 == h3 and r1 == r3
    assert str(m1["kernel"]) == "long:rbf + seasonal:periodic * decay:rbf + medium:rq + short:rbf + white"
    hp = r1["kernel_hyperparameters"]
    assert set(hp) == {
        "long.variance",
        "long.lengthscale[0]",
        "seasonal.variance",
        "seasonal.lengthscale",
        "seasonal.period",
        "decay.variance",
        "decay.lengthscale[0]",
        "medium.variance",
        "medium.lengthscale[0]",
        "medium.alpha",
        "short.variance",
        "short.lengthscale[0]",
        "white.variance",
    }
    # the model as pgmflow.load returns it: the same kernel object, the run's test RMSE on its held-out rows
    gp = load_predictor(Path(tr.download("model.npz")).parent)
    assert isinstance(gp, GPPredictor) and gp.kernel == ka.parse(RW, 1)
    import yaml

    cfg = yaml.safe_load(tr.read_text("config.yaml"))
    data = gp_data.resolve(cfg)
    test = gp_data.heldout_rows(gp_data.split_key(int(cfg["seed"])), 0, data.n, 0.2)
    mean, _ = gp.predict(pd.DataFrame(data.X[test], columns=list(data.input_names)))
    r = data.y[test] - mean
    assert math.sqrt(float(r @ r) / r.size) == pytest.approx(res["test_rmse"], rel=1e-9)


@pytest.mark.parametrize("method", ["sgpr", "dtc", "fitc", "svgp", "exact"])
def test_every_method_fits_a_composed_kernel(store, method):
    ov = BASE + [
        "debug=default",
        f"sparse_gp.method={method}",
        "sparse_gp.kernel='rbf + periodic * rbf2:rbf + linear[1] + white'",
        "+sparse_gp.kernel_params.periodic.period=0.5",
        "+sparse_gp.kernel_params.periodic.period_bounds=[0.1,2.0]",
    ]
    res, tr = run(ov, store)
    assert math.isfinite(res["bound"]) and math.isfinite(res["test_rmse"])
    assert res["kernel"] == "rbf + periodic * rbf2:rbf + linear[1] + white"
    hp = res["kernel_hyperparameters"]
    assert "periodic.period" in hp and "linear.variance" in hp
    model = _model(tr)
    assert float(np.exp(model["log_variance"])) == 1.0  # the global scale is held at 1


def test_co2_experiment_forecasts_the_last_ten_years_and_logs_the_forecast_figure(store):
    """experiment=gp_co2 (shrunk): the record before 1992 trains, 1992-2001 is scored, figures/forecast.png
    is logged; results.json names the R&W kernel's hyperparameters in years and ppm."""
    res, tr = run(["experiment=gp_co2", "debug=default", "progress=false"], store)
    assert (res["train_rows"], res["test_rows"]) == (1703, 522)
    assert math.isfinite(res["test_rmse"]) and res["test_rmse"] > 0
    assert Path(tr.download("figures/forecast.png")).stat().st_size > 10_000
    hp = res["kernel_hyperparameters"]
    assert hp["seasonal.period"] == pytest.approx(1.0, rel=1e-6)  # held at one year (standardised: 1 / 9.6253)
    assert hp["decay.variance"] == pytest.approx(12.311**2, rel=1e-3)  # held at 1 (standardised)
