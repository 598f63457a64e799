"""Bad input to ``pgmflow pipeline=tempering model=bayes``: exit code 2, one line naming the field, the
value and the fix, before any task runs, and no MLflow run left RUNNING or FINISHED."""

from __future__ import annotations

import numpy as np
import pytest

from tests.bad_input.helpers import assert_refused, pgmflow


def _wrong_shape(tmp_path):
    g = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", X=g.random((30, 3)), y=g.random(29))
    return ["model.data.path=d.npz"], ["model.data.path='d.npz'", "X of shape (30, 3) and y of shape (29,)"]


def _columns_differ_from_prior(tmp_path):
    g = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", X=g.random((30, 3)), y=g.random(30))
    return ["model.data.path=d.npz"], ["model.data.path='d.npz'", "gives 3 parameters", "prior has 10"]


CASES = {
    "unknown_prior": lambda p: (["model.prior=[{name:gamma,size:10}]"], ["model.prior[0].name='gamma'", "half_normal"]),
    "negative_scale": lambda p: (
        ["model.prior=[{name:normal,size:10,loc:0,scale:-1}]"],
        ["model.prior[0].scale=-1", "must be > 0"],
    ),
    "nan_likelihood": lambda p: (
        [
            "model.log_likelihood=pgmflow.tasks.tempering.likelihoods:returns_nan",
            "model.grad_log_likelihood=''",
            "tempering.explorer=rwm",
        ],
        ["model.log_likelihood=", "NaN"],
    ),
    "data_wrong_shape": _wrong_shape,
    "data_columns_differ_from_prior": _columns_differ_from_prior,
    "module_off_the_allow_list": lambda p: (
        ["model.log_likelihood=os:system"],
        ["model.log_likelihood='os:system'", "allow-list"],
    ),
    "uniform_interval_empty": lambda p: (
        ["model.prior=[{name:uniform,size:10,low:2,high:1}]"],
        ["model.prior[0].high=1", "above low"],
    ),
    "missing_data_file": lambda p: (["model.data.path=nope.npz"], ["model.data.path='nope.npz'", "no such file"]),
    "variational_on_ising": lambda p: (
        ["model=ising", "tempering.reference=variational"],
        ["tempering.reference='variational'", "continuous target"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bayes_bad_input(tmp_path, case):
    args, needles = CASES[case](tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    model = [] if any(a.startswith("model=") for a in args) else ["model=bayes"]
    r = pgmflow(
        ["pipeline=tempering", *model, *args, f"tracking.uri={uri}", "progress=false", "cluster.n_workers=1"],
        tmp_path,
        timeout=120,
    )
    assert_refused(r, needles, tmp_path, uri, "tempering")
