"""Bad input to the tempering target ``model=mrf``: exit code 2, one line naming the file or field, the
problem and the fix, before any task runs, and no MLflow run left RUNNING or FINISHED."""

from __future__ import annotations

import numpy as np
import pytest

from tests.bad_input.helpers import assert_refused, pgmflow


def _ring(n=6):
    J = np.zeros((n, n))
    for i in range(n):
        J[i, (i + 1) % n] = J[(i + 1) % n, i] = 0.7
    return J


def _save(tmp_path, *extra, **arrays):
    np.savez(tmp_path / "model.npz", **arrays)
    return ["pipeline=tempering", "model=mrf", "model.path=model.npz", *extra]


def _asymmetric(tmp_path):
    J = _ring()
    J[0, 1] = 0.9
    return _save(tmp_path, J=J), ["model.path='model.npz'", "not symmetric", "[0, 1] = 0.9"]


def _diagonal(tmp_path):
    J = _ring()
    J[3, 3] = 0.5
    return _save(tmp_path, J=J), ["model.path='model.npz'", "diagonal entry [3, 3] is 0.5", "zero"]


def _nan(tmp_path):
    J = _ring()
    J[2, 3] = J[3, 2] = np.nan
    return _save(tmp_path, J=J), ["model.path='model.npz'", "nan"]


def _inf_field(tmp_path):
    h = np.zeros(6)
    h[4] = np.inf
    return _save(tmp_path, J=_ring(), h=h), ["model.path='model.npz'", "inf"]


def _h_length(tmp_path):
    return _save(tmp_path, J=_ring(), h=np.zeros(5)), ["model.path='model.npz'", "h has shape (5,)", "(6,)"]


def _no_nodes(tmp_path):
    return _save(tmp_path, J=np.zeros((0, 0))), ["model.path='model.npz'", "no nodes"]


def _edge_list_self_loop(tmp_path):
    args = _save(tmp_path, edges=np.array([[0, 1], [2, 2]]), J=np.array([0.5, 0.3]))
    return args, ["model.path='model.npz'", "self-loop on node 2"]


def _edge_list_nan(tmp_path):
    args = _save(tmp_path, edges=np.array([[0, 1], [1, 2]]), J=np.array([0.5, np.nan]))
    return args, ["model.path='model.npz'", "nan"]


def _edge_list_lengths(tmp_path):
    args = _save(tmp_path, edges=np.array([[0, 1], [1, 2]]), J=np.array([0.5, 0.1, 0.2]))
    return args, ["model.path='model.npz'", "J has shape (3,) for 2 edges"]


def _stabilized_too_few_replicas(tmp_path):
    """reference=stabilized runs on an MRF (tests/pipelines/tempering/test_mrf.py); its two legs need 4 levels."""
    args = _save(tmp_path, "tempering.reference=stabilized", "tempering.n_replicas=3", J=_ring())
    return args, ["tempering.n_replicas=3", "two legs", "tempering.n_replicas>=4"]


def _stabilized_explicit_ladder(tmp_path):
    args = _save(
        tmp_path,
        "tempering.reference=stabilized",
        "tempering.n_replicas=4",
        "tempering.ladder=[0,0.3,0.6,1]",
        J=_ring(),
    )
    return args, ["tempering.ladder=", "two legs", "tempering.ladder=null"]


def _unknown_reference(tmp_path):
    args = _save(tmp_path, "tempering.reference=gaussian", J=_ring())
    return args, ["tempering.reference='gaussian'", "stabilized"]


def _continuous_explorer(tmp_path):
    args = _save(tmp_path, "tempering.explorer=hmc", J=_ring())
    return args, ["tempering.explorer='hmc'", "heatbath or metropolis"]


CASES = {
    "asymmetric_couplings": _asymmetric,
    "non_zero_diagonal": _diagonal,
    "nan_coupling": _nan,
    "infinite_field": _inf_field,
    "h_of_the_wrong_length": _h_length,
    "empty_graph_no_nodes": _no_nodes,
    "edge_list_self_loop": _edge_list_self_loop,
    "edge_list_nan": _edge_list_nan,
    "edge_list_length_mismatch": _edge_list_lengths,
    "stabilized_too_few_replicas": _stabilized_too_few_replicas,
    "stabilized_explicit_ladder": _stabilized_explicit_ladder,
    "unknown_reference": _unknown_reference,
    "continuous_explorer": _continuous_explorer,
    "missing_file": lambda p: (
        ["pipeline=tempering", "model=mrf", "model.path=nope.npz"],
        ["model.path='nope.npz'", "no such file"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tempering_mrf_bad_input(tmp_path, case):
    args, needles = CASES[case](tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = pgmflow([*args, f"tracking.uri={uri}", "progress=false", "cluster.n_workers=1"], tmp_path, timeout=120)
    assert_refused(r, needles, tmp_path, uri, "tempering")
