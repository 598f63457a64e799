"""Bad input to ``pgmflow pipeline=tesla``: exit code 2, one line that names the field (or file), the
value and the fix, no traceback, before any task runs, and no MLflow run left RUNNING or FINISHED.
And one good input that is unusual (a node that never changes value): it runs, with a warning."""

from __future__ import annotations

import numpy as np
import pytest

from tests.bad_input.helpers import assert_refused, pgmflow, run_statuses

# Data files are written into the run's folder (pgmflow's cwd) and passed by a relative path, so that
# the error line (whose value is cut at 80 characters) still shows the file name.


def _pm1(shape, seed=0):
    return np.random.default_rng(seed).choice(np.array([-1, 1], np.int8), size=shape)


def _npz(tmp_path, name="data.npz", **arrays):
    np.savez(tmp_path / name, **arrays)
    return ["network=npz", f"network.path={name}"]


def _csv(tmp_path, rows, name="data.csv"):
    (tmp_path / name).write_text("time,sample,node,value\n" + "".join(f"{t},{s},{n},{v}\n" for t, s, n, v in rows))
    return ["network=csv", f"network.path={name}"]


def _csv_rows(T=3, n=2, p=4):
    X = _pm1((T, n, p))
    return [[t, s, f"n{j}", int(X[t, s, j])] for t in range(T) for s in range(n) for j in range(p)]


def _npz_value_2(tmp_path):
    X = _pm1((4, 3, 5))
    X[1, 0, 3] = 2
    return _npz(tmp_path, X=X), ["network.path='data.npz'", "value 2 at X[1, 0, 3]", "node '3'"]


def _csv_value_half(tmp_path):
    rows = _csv_rows()
    rows[5][3] = 0.5  # line 7 of the file (header is line 1): time 0, sample 1, node n1
    return _csv(tmp_path, rows), ["network.path='data.csv'", "value 0.5 at line 7", "node 'n1'"]


def _single_time_point(tmp_path):
    return _npz(tmp_path, X=_pm1((1, 20, 5))), ["tesla.lambda2=[2.0, 1.0, 0.5, 0.25, 0.125]", "T=1"]


def _npz_p_mismatch(tmp_path):
    return (
        _npz(tmp_path, x_0=_pm1((3, 5)), x_1=_pm1((3, 4), seed=1)),
        ["network.path='data.npz'", "x_1 has 4 columns", "x_0 has 5"],
    )


def _csv_node_missing(tmp_path):
    rows = [r for r in _csv_rows() if not (r[0] == 1 and r[1] == 1 and r[2] == "n2")]
    return _csv(tmp_path, rows), ["network.path='data.csv'", "time '1', sample '1'", "no value for node 'n2'"]


def _npz_nan(tmp_path):
    X = _pm1((4, 3, 5)).astype(np.float64)
    X[2, 1, 4] = np.nan
    return _npz(tmp_path, X=X), ["network.path='data.npz'", "NaN at X[2, 1, 4]"]


def _corrupt_npz(tmp_path):
    (tmp_path / "data.npz").write_bytes(np.random.default_rng(0).bytes(4096))
    return ["network=npz", "network.path=data.npz"], ["network.path='data.npz'", "not an .npz file"]


def _empty_csv(tmp_path):
    (tmp_path / "data.csv").write_text("")
    return ["network=csv", "network.path=data.csv"], ["network.path='data.csv'", "empty"]


def _rollcall(tmp_path, hook=None, extra=()):
    from tests.tasks.tesla import rollcall_files

    rollcall_files.write(tmp_path, codes_hook=hook)
    return ["network=rollcall", "network.source=voteview", "network.path=.", *extra]


def _votes_members_differ(tmp_path):
    args = _rollcall(tmp_path)
    members = tmp_path / "S109_members.csv"
    members.write_text("\n".join(ln for ln in members.read_text().splitlines() if ",103," not in ln) + "\n")
    return args, ["S109_votes.csv", "legislator(s) 103 (icpsr) are not in S109_members.csv"]


ROLLCALL_CASES = {
    "rollcall_votes_members_differ": _votes_members_differ,
    "rollcall_empty_window": lambda p: (
        _rollcall(p, extra=("network.time_axis=window", "network.window_days=7")),
        ["network.window_days=7", "the window 2005-01-18..2005-01-24 has no roll call", "network.window_days=41"],
    ),
    "rollcall_all_missing": lambda p: (
        _rollcall(p, hook=lambda c: c[1:, 5].__setitem__(slice(None), 9)),
        ["network.path='S109_votes.csv'", "roll call 6 (2005-01-05) has every vote missing"],
    ),
    "rollcall_unknown_code": lambda p: (
        _rollcall(p, hook=lambda c: c.__setitem__((2, 3), 11)),
        ["network.path='S109_votes.csv'", "unknown vote code 11 (BRAVO (R AA), roll call 4)"],
    ),
    "rollcall_pscl_absent": lambda p: (
        ["network=rollcall", "network.path=/nope/Rdata.rdb"],
        ["network.path='/nope/Rdata.rdb'", "r-cran-pscl) is not installed", "apt-get install -y r-cran-pscl"],
    ),
}

CASES = {
    **ROLLCALL_CASES,
    "npz_value_2": _npz_value_2,
    "csv_value_0.5": _csv_value_half,
    "single_time_point_with_lambda2": _single_time_point,
    "negative_lambda1": lambda p: (["tesla.lambda1=[0.1,-0.2]"], ["tesla.lambda1=[0.1, -0.2]", "-0.2 is negative"]),
    "negative_lambda2": lambda p: (["tesla.lambda2=[-1]"], ["tesla.lambda2=[-1]", "-1 is negative"]),
    "negative_keller_lambda1": lambda p: (
        ["tesla.keller_lambda1=[1,-0.5]"],
        ["tesla.keller_lambda1=[1, -0.5]", "-0.5 is negative"],
    ),
    "static_lambda1_not_a_list": lambda p: (
        ["tesla.static_lambda1=0.1"],
        ["tesla.static_lambda1=0.1", "must be a non-empty list"],
    ),
    "npz_nodes_differ_over_time": _npz_p_mismatch,
    "csv_sample_lacks_a_node": _csv_node_missing,
    "npz_nan": _npz_nan,
    "missing_file": lambda p: (["network=npz", "network.path=/nope.npz"], ["network.path='/nope.npz'", "no such file"]),
    "corrupt_npz": _corrupt_npz,
    "empty_csv": _empty_csv,
    "unknown_method": lambda p: (["tesla.methods=[tesla,lasso]"], ["tesla.methods=['tesla', 'lasso']", "'lasso'"]),
    "bandwidth_0": lambda p: (["tesla.bandwidth=[0]"], ["tesla.bandwidth=[0]"]),
    "q_3": lambda p: (["model.q=3"], ["model.q=3"]),
    "unknown_tesla_key": lambda p: (["+tesla.lamda1=[1]"], ["tesla.lamda1"]),
    "model_for_another_pipeline": lambda p: (["model=ising"], ["model='ising'"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tesla_bad_input(tmp_path, case):
    args, needles = CASES[case](tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # debug=default shrinks the synthetic network; with a file network its network.p/T are unknown keys
    small = [] if any(a.startswith("network=") for a in args) else ["debug=default"]
    r = pgmflow(
        ["pipeline=tesla", *small, *args, f"tracking.uri={uri}", "progress=false", "cluster.n_workers=1"],
        tmp_path,
        timeout=120,
    )
    assert_refused(r, needles, tmp_path, uri, "tesla")


def test_tesla_constant_node_is_isolated_with_a_warning(tmp_path):
    """Not bad input: a node that never changes value is reported as isolated, and the run finishes."""
    X = _pm1((6, 3, 5))
    X[:, :, 2] = 1
    args = _npz(tmp_path, X=X, node_names=np.array(["a", "b", "steady", "d", "e"]))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = pgmflow(
        [
            "pipeline=tesla",
            *args,
            f"tracking.uri={uri}",
            "progress=false",
            "cluster.n_workers=1",
            "tesla.lambda1=[0.2]",
            "tesla.lambda2=[0.5]",
            "tesla.bandwidth=[2.0]",
            "tesla.figures=false",
        ],
        tmp_path,
        timeout=180,
    )
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert "Traceback" not in r.stderr
    warn = [ln for ln in r.stdout.splitlines() if "never change value" in ln]
    assert len(warn) == 1, r.stdout
    assert "isolated" in warn[0] and "steady" in warn[0] and "1 node(s)" in warn[0], warn[0]
    assert "tesla run" in r.stdout and "tesla finished" in r.stdout
    assert [status for status, _ in run_statuses(tmp_path, uri)] == ["FINISHED"]
