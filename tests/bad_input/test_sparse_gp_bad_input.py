"""Bad input to ``pgmflow pipeline=sparse_gp``: exit code 2, one line that names the field (or file),
the value and the fix, no traceback, before any task runs (the data files are read and checked in
the preflight), and no MLflow run left RUNNING or FINISHED."""

from __future__ import annotations

import numpy as np
import pytest

from tests.bad_input.helpers import assert_refused, pgmflow

# Data files are written into the run's folder (pgmflow's cwd) and passed by a relative path, so that
# the error line (whose value is cut at 80 characters) still shows the file name.


def _xy(n=40, d=3, seed=0):
    g = np.random.default_rng(seed)
    return g.random((n, d)), g.standard_normal(n)


def _npz(tmp_path, **arrays):
    np.savez(tmp_path / "data.npz", **arrays)
    return ["gp_data=npz", "gp_data.path=data.npz"]


def _npz_nan(tmp_path):
    X, y = _xy()
    X[7, 1] = np.nan
    return _npz(tmp_path, X=X, y=y), ["gp_data.path='data.npz'", "NaN at X[7, 1]"]


def _npz_shapes_differ(tmp_path):
    X, y = _xy()
    return _npz(tmp_path, X=X, y=y[:-1]), ["gp_data.path='data.npz'", "X has 40 rows but y has 39"]


def _csv(tmp_path, text):
    (tmp_path / "data.csv").write_text(text)
    return ["gp_data=csv", "gp_data.path=data.csv"]


def _csv_rows(n=30):
    X, y = _xy(n)
    return "a,b,c,target\n" + "".join(f"{r[0]},{r[1]},{r[2]},{t}\n" for r, t in zip(X, y))


def _csv_inf(tmp_path):
    lines = _csv_rows().splitlines()
    lines[3] = "0.5,inf,0.2,1.0"  # line 4 of the file
    return _csv(tmp_path, "\n".join(lines) + "\n"), ["gp_data.path='data.csv'", "+inf at line 4, column 'b'"]


def _csv_no_target(tmp_path):
    return (
        _csv(tmp_path, _csv_rows()) + ["gp_data.target=y"],
        ["gp_data.target='y'", "no such column in data.csv", "columns: a, b, c, target"],
    )


def _csv_not_a_number(tmp_path):
    lines = _csv_rows().splitlines()
    lines[5] = "0.5,0.1,abc,1.0"
    return _csv(tmp_path, "\n".join(lines) + "\n"), ["gp_data.path='data.csv'", "'abc' at line 6, column 'c'"]


def _empty_csv(tmp_path):
    (tmp_path / "data.csv").write_text("")
    return ["gp_data=csv", "gp_data.path=data.csv"], ["gp_data.path='data.csv'", "empty"]


def _npy(tmp_path, A):
    np.save(tmp_path / "data.npy", A)
    return ["gp_data=npy", "gp_data.path=data.npy"]


def _npy_nan(tmp_path):
    X, y = _xy()
    A = np.column_stack([X, y])
    A[12, 3] = np.nan
    return _npy(tmp_path, A), ["gp_data.path='data.npy'", "NaN at row 12, column 3 (the target)"]


def _npy_target_out_of_range(tmp_path):
    X, y = _xy()
    return _npy(tmp_path, np.column_stack([X, y])) + ["gp_data.target=4"], ["gp_data.target=4", "0 .. 3"]


def _corrupt_npy(tmp_path):
    (tmp_path / "data.npy").write_bytes(np.random.default_rng(0).bytes(4096))
    return ["gp_data=npy", "gp_data.path=data.npy"], ["gp_data.path='data.npy'", "not an .npy file"]


CASES = {
    "m_above_n": lambda p: (["gp_data=diabetes", "sparse_gp.m=400"], ["sparse_gp.m=400", "m > n", "347 training rows"]),
    "npz_nan": _npz_nan,
    "npz_x_and_y_rows_differ": _npz_shapes_differ,
    "csv_infinite_value": _csv_inf,
    "csv_target_column_missing": _csv_no_target,
    "csv_not_a_number": _csv_not_a_number,
    "empty_csv": _empty_csv,
    "npy_nan_in_the_target": _npy_nan,
    "npy_target_column_out_of_range": _npy_target_out_of_range,
    "corrupt_npy": _corrupt_npy,
    "missing_file": lambda p: (["gp_data=npy", "gp_data.path=nope.npy"], ["gp_data.path='nope.npy'", "no such file"]),
    "negative_lengthscale": lambda p: (["sparse_gp.lengthscale=-1.0"], ["sparse_gp.lengthscale=-1.0", "must be > 0"]),
    "zero_noise": lambda p: (["sparse_gp.noise=0"], ["sparse_gp.noise=0", "must be > 0"]),
    "unknown_kernel": lambda p: (["sparse_gp.kernel=rbff"], ["sparse_gp.kernel='rbff'", "matern52"]),
    # composed kernels (issue 37): a malformed tree, a bad bound, active dims out of range, an unknown term
    "unknown_kernel_in_a_tree": lambda p: (
        ["sparse_gp.kernel='rbf + periodic * laplace'"],
        ["sparse_gp.kernel='rbf + periodic * laplace'", "unknown kernel 'laplace'", "fix:"],
    ),
    "product_with_one_operand": lambda p: (
        ["sparse_gp.kernel='rbf + periodic *'"],
        ["sparse_gp.kernel='rbf + periodic *'", "'*' needs a kernel on both sides"],
    ),
    "kernel_bound_below_zero": lambda p: (
        ["sparse_gp.kernel='rbf + periodic'", "+sparse_gp.kernel_params.periodic.period_bounds=[-1.0,2.0]"],
        ["sparse_gp.kernel_params.periodic.period_bounds=[-1.0, 2.0]", "at or below zero"],
    ),
    "active_dims_out_of_range": lambda p: (
        ["sparse_gp.kernel='rbf[0,12] + white'"],
        ["sparse_gp.kernel='rbf[0,12] + white'", "out of range", "10 input column(s)"],
    ),
    "kernel_params_for_no_term": lambda p: (
        ["sparse_gp.kernel='rbf + white'", "+sparse_gp.kernel_params.seasonal.period=1.0"],
        ["sparse_gp.kernel_params.seasonal=", "names no kernel", "rbf, white"],
    ),
    "co2_forecast_from_outside_the_record": lambda p: (
        ["gp_data=co2", "gp_data.forecast_from=2010.0", "sparse_gp.test_fraction=0"],
        ["gp_data.forecast_from=2010.0", "inside the record"],
    ),
    "kernel_start_outside_its_bounds": lambda p: (
        [
            "sparse_gp.kernel='rbf * periodic'",
            "+sparse_gp.kernel_params.periodic.period=5.0",
            "+sparse_gp.kernel_params.periodic.period_bounds=[0.5,2.0]",
        ],
        ["sparse_gp.kernel_params.periodic.period=5.0", "outside its bounds"],
    ),
    "unknown_method": lambda p: (["sparse_gp.method=vfe"], ["sparse_gp.method='vfe'", "svgp"]),
    "unknown_evaluate": lambda p: (["sparse_gp.evaluate=tasks"], ["sparse_gp.evaluate='tasks'", "direct", "graph"]),
    "exact_on_too_many_rows": lambda p: (
        ["gp_data.n=30000", "sparse_gp.method=exact"],
        ["sparse_gp.method='exact'", "more than 20000"],
    ),
    "model_for_another_pipeline": lambda p: (["model=ising"], ["model=", "takes no model group"]),
}


# SVGP likelihoods (issue 37): a likelihood a method does not take, targets the likelihood cannot take
def _labels_csv(tmp_path, values, name="data.csv"):
    X, _ = _xy(len(values))
    (tmp_path / name).write_text("a,b,c,target\n" + "".join(f"{r[0]},{r[1]},{r[2]},{t}\n" for r, t in zip(X, values)))
    return ["gp_data=csv", f"gp_data.path={name}", "sparse_gp.method=svgp", "sparse_gp.m=4"]


def _bernoulli_label_2(tmp_path):
    labels = [0, 1] * 10 + [2] + [1] * 9
    return _labels_csv(tmp_path, labels) + ["sparse_gp.likelihood=bernoulli"], [
        "sparse_gp.likelihood='bernoulli'",
        "row 20 has the label 2",
        "0 or 1",
    ]


def _bernoulli_test_file_labels(tmp_path):
    args = _labels_csv(tmp_path, [0, 1] * 15)
    _labels_csv(tmp_path, [0, 1, -1, 1], name="test.csv")
    return args + ["sparse_gp.likelihood=bernoulli", "gp_data.test_path=test.csv"], [
        "sparse_gp.likelihood='bernoulli'",
        "gp_data.test_path",
        "row 2 has the label -1",
    ]


def _bernoulli_npy_labels(tmp_path):
    X, _ = _xy(30)
    y = np.r_[np.zeros(15), np.ones(14), 0.5]
    return _npy(tmp_path, np.column_stack([X, y])) + ["sparse_gp.method=svgp", "sparse_gp.likelihood=bernoulli"], [
        "sparse_gp.likelihood='bernoulli'",
        "row 29 has the label 0.5",
    ]


def _poisson_negative(tmp_path):
    return _labels_csv(tmp_path, [3, 0, 1, 7, -2] + [1] * 25) + ["sparse_gp.likelihood=poisson"], [
        "sparse_gp.likelihood='poisson'",
        "row 4 has the count -2",
        "integers >= 0",
    ]


def _poisson_fraction(tmp_path):
    return _labels_csv(tmp_path, [3, 0, 1.5] + [1] * 27) + ["sparse_gp.likelihood=poisson"], [
        "sparse_gp.likelihood='poisson'",
        "row 2 has the count 1.5",
    ]


CASES |= {
    "bernoulli_with_sgpr": lambda p: (
        ["gp_data=breast_cancer", "sparse_gp.likelihood=bernoulli"],
        ["sparse_gp.likelihood='bernoulli'", "sparse_gp.method=sgpr", "only svgp", "fix: use sparse_gp.method=svgp"],
    ),
    "bernoulli_with_exact": lambda p: (
        ["gp_data=breast_cancer", "sparse_gp.likelihood=bernoulli", "sparse_gp.method=exact"],
        ["sparse_gp.likelihood='bernoulli'", "sparse_gp.method=exact", "only svgp"],
    ),
    "poisson_with_fitc": lambda p: (
        ["sparse_gp.likelihood=poisson", "sparse_gp.method=fitc"],
        ["sparse_gp.likelihood='poisson'", "sparse_gp.method=fitc", "only svgp"],
    ),
    "student_t_with_dtc": lambda p: (
        ["sparse_gp.likelihood=student_t", "sparse_gp.method=dtc"],
        ["sparse_gp.likelihood='student_t'", "sparse_gp.method=dtc", "only svgp"],
    ),
    "bernoulli_on_regression_targets": lambda p: (
        ["sparse_gp.method=svgp", "sparse_gp.likelihood=bernoulli"],
        ["sparse_gp.likelihood='bernoulli'", "row 0 has the label", "Bernoulli labels must be 0 or 1"],
    ),
    "bernoulli_label_outside_0_1": _bernoulli_label_2,
    "bernoulli_label_in_the_test_file": _bernoulli_test_file_labels,
    "bernoulli_label_in_an_npy_file": _bernoulli_npy_labels,
    "poisson_negative_count": _poisson_negative,
    "poisson_non_integer_count": _poisson_fraction,
    "unknown_likelihood": lambda p: (
        ["sparse_gp.method=svgp", "sparse_gp.likelihood=gamma"],
        ["sparse_gp.likelihood='gamma'", "bernoulli", "student_t"],
    ),
    "unknown_link": lambda p: (
        ["gp_data=breast_cancer", "sparse_gp.method=svgp", "sparse_gp.likelihood=bernoulli", "sparse_gp.link=cloglog"],
        ["sparse_gp.link='cloglog'", "probit", "logit"],
    ),
    "student_t_dof_zero": lambda p: (
        ["sparse_gp.method=svgp", "sparse_gp.likelihood=student_t", "sparse_gp.student_t_dof=0"],
        ["sparse_gp.student_t_dof=0", "must be > 0"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sparse_gp_bad_input(tmp_path, case):
    args, needles = CASES[case](tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = pgmflow(
        ["pipeline=sparse_gp", *args, f"tracking.uri={uri}", "progress=false", "cluster.n_workers=1"],
        tmp_path,
        timeout=120,
    )
    assert_refused(r, needles, tmp_path, uri, "sparse_gp")
