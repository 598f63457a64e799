"""What a run with ``sparse_gp.restarts`` reports: ``results.json``'s ``iterations``, ``evaluations``,
``failed_evaluations``, ``converged`` and ``fit_seconds`` are the kept fit's, and the ``all_fits_*`` fields are
the sums over every fit (the configured start and each restart); the terminal says which is which. Checked
against the same fits run one by one: each restart's starting point given as the configured start of a run
without restarts reproduces that restart's bound and counts, bit for bit. Also the restarts' starting points:
seeded, stratified, from the inputs' spacing to twice their range."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from pgmflow.core.runner import execute
from pgmflow.sparse_gp.evaluations import inducing_pool
from pgmflow.sparse_gp.fit import RESTART_NOISE, restart_lengthscale_range, restart_params
from pgmflow.sparse_gp.validate import check_sparse_gp
from tests.conftest import compose
from tests.pipelines.helpers import run

ARGS = [
    "pipeline=sparse_gp",
    "gp_data=diabetes",
    "sparse_gp.m=8",
    "sparse_gp.max_iter=15",
    "sparse_gp.figures=false",
    "progress=false",
]
RESTARTS = 3


def _starts(args, n):
    """The restarts' starting points of a run of ``args`` (what fit_restarts draws)."""
    plan = check_sparse_gp(compose(args))
    pool = plan.data.standardizer.apply_X(inducing_pool(plan.data, plan.seed, plan.test_fraction, plan.kmeans_points))
    return restart_params(plan.start, restart_lengthscale_range(pool, plan.seed), plan.seed, n)


def _as_start(p) -> list[str]:
    ls = ",".join(repr(float(v)) for v in np.asarray(p.lengthscale))
    return [
        f"sparse_gp.lengthscale=[{ls}]",
        f"sparse_gp.variance={float(p.variance)!r}",
        f"sparse_gp.noise={p.noise!r}",
    ]


def test_results_and_terminal_name_the_kept_fit_and_the_totals_apart(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = io.StringIO()
    cfg = compose(ARGS + [f"sparse_gp.restarts={RESTARTS}", f"tracking.uri={uri}", "cluster.profile=synchronous"])
    res = execute(cfg, stream=out)
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    tr.run_id = res["run_id"]
    saved = json.loads(tr.read_text("results.json"))
    singles = [run(ARGS, uri)[0]] + [run(ARGS + _as_start(p), uri)[0] for p in _starts(ARGS, RESTARTS)]
    assert [s["bound"] for s in singles] == saved["restart_bounds"]  # the same fits, bit for bit
    kept = singles[saved["best_restart"]]
    for key in ("iterations", "evaluations", "failed_evaluations", "converged", "bound", "test_rmse"):
        assert saved[key] == kept[key], key
    assert saved["all_fits_count"] == RESTARTS + 1
    for key in ("iterations", "evaluations", "failed_evaluations"):
        assert saved[f"all_fits_{key}"] == sum(s[key] for s in singles), key
    assert saved["all_fits_evaluations"] > saved["evaluations"]
    assert saved["all_fits_seconds"] >= saved["fit_seconds"] > 0 and saved["seconds"] >= saved["all_fits_seconds"]
    assert not any(k.startswith("all_fits_") for k in singles[0])  # a run without restarts has no totals
    text = out.getvalue()
    assert (
        f"bound {saved['bound']:.6g} after {saved['iterations']} iterations ({saved['evaluations']} evaluations, "
        in text
    )
    assert f"of the kept fit (restart {saved['best_restart']})" in text
    assert (
        f"all {RESTARTS + 1} fits (the configured start and the restarts): {saved['all_fits_iterations']} "
        f"iterations, {saved['all_fits_evaluations']} evaluations" in text
    )
    metrics = tr.client.get_run(res["run_id"]).data.metrics
    assert metrics["final_all_fits_evaluations"] == saved["all_fits_evaluations"]


def test_restart_starts_cover_the_inputs_spacing_to_twice_their_range():
    """One input on a regular grid of step 0.01 over [0, 10] with a few duplicates: the shortest lengthscale is
    the spacing (not 5 % of the range); each restart takes its own slice of the log range; the restart with the
    shortest lengthscale starts with the least noise; the same seed gives the same points."""
    x = np.concatenate([np.arange(1001) * 0.01, [5.0, 5.0]])[:, None]
    lo, hi = restart_lengthscale_range(x, seed=3)
    assert lo[0] == pytest.approx(0.01) and hi[0] == pytest.approx(20.0)
    from pgmflow.sparse_gp.plan import Start

    n = 8
    starts = restart_params(Start(1.0, 1.0, 0.1), (lo, hi), 3, n)
    ls = np.array([float(p.lengthscale[0]) for p in starts])
    u = np.log(ls / lo[0]) / np.log(hi[0] / lo[0])
    assert sorted(np.floor(u * n).astype(int)) == list(range(n))  # one restart per slice
    noise = np.array([p.noise for p in starts])
    assert np.all((noise >= RESTART_NOISE[0]) & (noise <= RESTART_NOISE[1]))
    assert np.argsort(noise).tolist() == np.argsort(ls).tolist()  # shorter lengthscale, less noise
    again = restart_params(Start(1.0, 1.0, 0.1), (lo, hi), 3, n)
    assert [p.lengthscale.tobytes() for p in again] == [np.asarray(p.lengthscale).tobytes() for p in starts]
    # many inputs: the nearest neighbours are far apart, and 5 % of each range stays the floor
    g = np.random.default_rng(0).uniform(size=(300, 10))
    lo10, hi10 = restart_lengthscale_range(g, seed=3)
    np.testing.assert_allclose(lo10, 0.05 * np.ptp(g, axis=0))
    np.testing.assert_allclose(hi10, 2.0 * np.ptp(g, axis=0))
