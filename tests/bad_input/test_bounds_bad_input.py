"""Bad input to the variational bounds (``pipeline=bounds`` and ``bounds=true``): exit code 2, one
line naming the field or file, the value and the fix, no traceback, before any task runs, and no
MLflow run left RUNNING or FINISHED."""

from __future__ import annotations

import numpy as np
import pytest

from tests.bad_input.helpers import assert_refused, pgmflow


def _ring(n=6):
    J = np.zeros((n, n))
    for i in range(n):
        J[i, (i + 1) % n] = J[(i + 1) % n, i] = 0.7
    return J


def _save(tmp_path, **arrays):
    np.savez(tmp_path / "model.npz", **arrays)
    return ["pipeline=bounds", "model=mrf", "model.path=model.npz"]


def _asymmetric(tmp_path):
    J = _ring()
    J[0, 1] = 0.9
    return _save(tmp_path, J=J), ["model.path='model.npz'", "not symmetric", "[0, 1] = 0.9"]


def _nan(tmp_path):
    J = _ring()
    J[2, 3] = J[3, 2] = np.nan
    return _save(tmp_path, J=J), ["model.path='model.npz'", "nan"]


def _nan_field(tmp_path):
    h = np.zeros(6)
    h[4] = np.inf
    return _save(tmp_path, J=_ring(), h=h), ["model.path='model.npz'", "inf"]


def _rho_sum(tmp_path):
    # a 6-cycle has 6 edges; spanning trees have 5, so rho must sum to 5 (here 6)
    return _save(tmp_path, J=_ring(), rho=np.ones(6)), ["model.path='model.npz'", "rho"]


def _rho_zero(tmp_path):
    rho = np.full(6, 5 / 6)
    rho[0], rho[1] = 0.0, 5 / 3
    return _save(tmp_path, J=_ring(), rho=rho), ["model.path='model.npz'", "rho"]


def _not_square(tmp_path):
    return _save(tmp_path, J=np.zeros((3, 4))), ["model.path='model.npz'", "(3, 4)"]


CASES = {
    "asymmetric_couplings": _asymmetric,
    "nan_coupling": _nan,
    "infinite_field": _nan_field,
    "rho_does_not_sum_to_n_minus_1": _rho_sum,
    "rho_zero_and_above_1": _rho_zero,
    "coupling_matrix_not_square": _not_square,
    "missing_file": lambda p: (
        ["pipeline=bounds", "model=mrf", "model.path=nope.npz"],
        ["model.path='nope.npz'", "no such file"],
    ),
    "damping_above_1": lambda p: (["pipeline=bounds", "variational.damping=1.5"], ["variational.damping=1.5"]),
    "bounds_with_continuous_target": lambda p: (["model=gaussian_mixture", "bounds=true"], ["bounds=True"]),
    "negative_temperature": lambda p: (
        ["pipeline=bounds", "variational.temperatures=[2.0,-1]"],
        ["variational.temperatures=-1"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bounds_bad_input(tmp_path, case):
    args, needles = CASES[case](tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = pgmflow([*args, f"tracking.uri={uri}", "progress=false", "cluster.n_workers=1"], tmp_path, timeout=120)
    pipeline = "bounds" if "pipeline=bounds" in args else "tempering"
    assert_refused(r, needles, tmp_path, uri, pipeline)
