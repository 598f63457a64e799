"""Per-method lambda1 grids (``tesla.keller_lambda1``, ``tesla.static_lambda1``; issue 36) and the count of
nodes whose choice sits on a grid edge, with the edges past which the fit cannot change counted apart.

- validation: null (the default) is the shared ``tesla.lambda1``; bad values are refused in one line;
- the fit tasks solve each method over its own grid, and the same list given explicitly changes no bit;
- the grid-edge count uses each method's own grid and tells flat edges (empty neighbourhood at the largest
  lambda1, a path constant in time at TESLA's largest lambda2, a KELLER kernel that reaches no other time
  point) from edges where the grid may be too narrow.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pgmflow.core.errors import ConfigError
from pgmflow.tasks.tesla.path_tasks import NodeChoice
from tests.conftest import compose
from tests.pipelines.helpers import run

SMALL = [
    "pipeline=tesla",
    "network.p=6",
    "network.T=12",
    "network.samples_per_time=5",
    "network.n_edges=5",
    "network.rewire_every=6",
    "tesla.lambda1=[0.16,0.08]",
    "tesla.lambda2=[1.0]",
    "tesla.bandwidth=[3.0]",
    "tesla.figures=false",
    "progress=false",
]


def _plan(overrides):
    from pgmflow.core.preflight import preflight_checks

    return preflight_checks(compose(["pipeline=tesla", "debug=default", *overrides]))


def test_per_method_grids_default_to_the_shared_one():
    g = _plan([]).estimation.grid
    assert g.keller_lambda1 is None and g.static_lambda1 is None
    assert g.lambda1_of("tesla") == g.lambda1_of("keller") == g.lambda1_of("static") == g.lambda1
    g = _plan(["tesla.keller_lambda1=[2.56,1]", "tesla.static_lambda1=[0.5]"]).estimation.grid
    assert g.lambda1_of("keller") == (2.56, 1.0) and all(type(v) is float for v in g.keller_lambda1)
    assert g.lambda1_of("static") == (0.5,) and g.lambda1_of("tesla") == g.lambda1


@pytest.mark.parametrize(
    "override, needles",
    [
        ("tesla.keller_lambda1=[1,-0.5]", ["tesla.keller_lambda1=[1, -0.5]", "-0.5 is negative"]),
        ("tesla.static_lambda1=0.1", ["tesla.static_lambda1=0.1", "must be a non-empty list"]),
        ("tesla.static_lambda1=[]", ["tesla.static_lambda1=[]", "must be a non-empty list"]),
        ("tesla.keller_lambda1=[0.5,0.5]", ["tesla.keller_lambda1=[0.5, 0.5]", "repeated"]),
        ("tesla.keller_lambda1=[1,x]", ["tesla.keller_lambda1=[1, 'x']", "not a finite number"]),
    ],
)
def test_bad_per_method_grids_are_refused_in_one_line(override, needles):
    with pytest.raises(ConfigError) as err:
        _plan([override])
    line = str(err.value)
    assert "\n" not in line and "fix:" in line, line
    for n in needles:
        assert n in line, line


def _estimates(tr) -> dict:
    with np.load(tr.download("estimates.npz")) as z:
        return {k: z[k] for k in z.files}


def test_each_method_is_solved_over_its_own_grid(mlflow_uri):
    """Synchronous scheduler: a run with the shared grid, the same with that grid named per method (no bit
    changes), and one with KELLER and static on their own grids (their choices come from those)."""
    _, tr = run(SMALL, mlflow_uri, None)
    base = _estimates(tr)
    _, tr = run(SMALL + ["tesla.keller_lambda1=[0.16,0.08]", "tesla.static_lambda1=[0.16,0.08]"], mlflow_uri, None)
    same = _estimates(tr)
    assert set(same) == set(base)
    for k in base:
        assert np.array_equal(same[k], base[k]), k
    keller, static = [4.0, 2.0, 1.0], [0.04, 0.02, 0.01, 0.005]
    res, tr = run(
        SMALL + [f"tesla.keller_lambda1={keller}".replace(" ", ""), f"tesla.static_lambda1={static}".replace(" ", "")],
        mlflow_uri,
        None,
    )
    est = _estimates(tr)
    assert set(est["lambda1_keller"]) <= set(keller) and set(est["lambda1_static"]) <= set(static)
    assert est["scores_keller"].shape == (6, 1, 3) and est["scores_static"].shape == (6, 1, 4)
    assert np.array_equal(est["theta_tesla"], base["theta_tesla"])  # TESLA keeps the shared grid
    # lambda1 = 4 is above every node's lambda_max (an edge weight's loss gradient is at most 2)
    assert (est["scores_keller"][:, 0, 0] == est["scores_keller"][:, 0, 1]).all()
    for m in ("tesla", "keller", "static"):
        assert 0 <= res[f"{m}_grid_edge_nodes_flat"] <= res[f"{m}_grid_edge_nodes"] <= 6
    rows = Path(tr.download("tables/selection.csv")).read_text().splitlines()[1:]
    assert {float(r.split(",")[3]) for r in rows if r.startswith("keller,")} <= set(keller)


def _choice(method, node, lam1, second, theta):
    i_lam1 = 0
    return NodeChoice(
        node, method, "bic", 0, i_lam1, lam1, second if method == "tesla" else 0.0,
        second if method == "keller" else 0.0, theta, np.zeros((1, 1)), 0, True, False, 0,
    )  # fmt: skip


def _path(T=4, p=3, node=0, edge=0.0, varying=False):
    theta = np.zeros((T, p))
    theta[:, node] = 0.3 + (np.arange(T) * 0.1 if varying else 0.0)  # the field
    theta[:, (node + 1) % p] = edge
    return theta


def test_grid_edge_count_tells_flat_edges_from_narrow_grids():
    from pgmflow.tesla.edges import grid_edge_nodes, grid_edges

    lam1, lam2 = (0.16, 0.08, 0.04), (32.0, 8.0, 2.0)
    cases = [  # (choice, on an edge, flat beyond it)
        (_choice("tesla", 0, 0.08, 8.0, _path(edge=0.5)), False, False),  # inside
        (_choice("tesla", 0, 0.08, 32.0, _path(edge=0.5)), True, True),  # largest lambda2, constant path
        (_choice("tesla", 0, 0.08, 32.0, _path(edge=0.5, varying=True)), True, False),  # ... not constant
        (_choice("tesla", 0, 0.16, 8.0, _path(varying=True)), True, True),  # largest lambda1, no edge
        (_choice("tesla", 0, 0.16, 8.0, _path(edge=0.5)), True, False),  # ... with an edge
        (_choice("tesla", 0, 0.04, 8.0, _path()), True, False),  # smallest lambda1: never flat
        (_choice("tesla", 0, 0.08, 2.0, _path(edge=0.5)), True, False),  # smallest lambda2
        (_choice("tesla", 0, 0.16, 32.0, _path(varying=True)), True, False),  # flat in lambda1 only
        (_choice("tesla", 0, 0.16, 32.0, _path()), True, True),  # flat in both
    ]
    for c, edge, flat in cases:
        assert grid_edges(lam1, lam2, [c]) == (int(edge), int(flat)), (c.lam1, c.lam2, c.theta)
        assert grid_edge_nodes(lam1, lam2, [c]) == int(edge)
    bws = (0.25, 1.0, 4.0)
    assert grid_edges(lam1, bws, [_choice("keller", 1, 0.08, 0.25, _path(node=1, edge=0.5))]) == (1, 1)
    assert grid_edges(lam1, (0.5, 1.0), [_choice("keller", 1, 0.08, 0.5, _path(node=1, edge=0.5))]) == (1, 0)
    assert grid_edges(lam1, bws, [_choice("keller", 1, 0.08, 4.0, _path(node=1))]) == (1, 0)
    # static: one point on the second axis, never an edge there
    assert grid_edges(lam1, (0.0,), [_choice("static", 2, 0.08, 0.0, _path(node=2, edge=0.1))]) == (0, 0)
    # isolated nodes are not counted
    iso = _choice("tesla", 0, 0.04, 2.0, _path())._replace(isolated=True)
    assert grid_edges(lam1, lam2, [iso]) == (0, 0)


def test_edge_sets_count_edges_on_each_methods_own_grid():
    """The same lambda1 is inside TESLA's grid and the largest of KELLER's and static's own grids."""
    from pgmflow.tesla.edges import edge_sets
    from pgmflow.tesla.plan import Grid

    grid = Grid(
        lambda1=(0.32, 0.16, 0.08), lambda2=(4.0, 2.0, 1.0), bandwidths=(1.0, 2.0, 4.0),
        keller_lambda1=(0.16, 0.08, 0.04), static_lambda1=(0.16, 0.04),
    )  # fmt: skip
    plan = SimpleNamespace(
        data=SimpleNamespace(truth=None, groups=None),
        report=SimpleNamespace(rule="and"),
        estimation=SimpleNamespace(methods=("tesla", "keller", "static"), grid=grid),
    )
    choices = {
        "tesla": [_choice("tesla", i, 0.16, 2.0, _path(p=2, node=i, edge=0.5)) for i in range(2)],
        "keller": [_choice("keller", i, 0.16, 2.0, _path(p=2, node=i, edge=0.5)) for i in range(2)],
        "static": [_choice("static", i, 0.16, 0.0, _path(p=2, node=i)) for i in range(2)],
    }
    result = {}
    edge_sets(plan, choices, result)
    assert result["tesla_grid_edge_nodes"] == 0 and result["tesla_grid_edge_nodes_flat"] == 0
    assert result["keller_grid_edge_nodes"] == 2 and result["keller_grid_edge_nodes_flat"] == 0  # edges at the top
    assert result["static_grid_edge_nodes"] == 2 and result["static_grid_edge_nodes_flat"] == 2  # empty at the top


def test_keller_truncation_matches_the_solver():
    """edges.KELLER_TRUNCATE is the kernel truncation solver.keller_design uses (the flat-bandwidth test)."""
    from pgmflow.tasks.tesla import solver
    from pgmflow.tesla.edges import KELLER_TRUNCATE

    assert inspect.signature(solver.keller_design).parameters["truncate"].default == KELLER_TRUNCATE
    X = np.array([[1, -1], [-1, 1], [1, 1], [-1, -1]], np.int8)
    tix = np.array([0, 1, 2, 3])
    just_below = solver.keller_design(X, tix, 4, np.nextafter(1 / KELLER_TRUNCATE, 0))
    static = solver.tesla_design(X, tix, 4)
    assert np.array_equal(just_below.lo, static.lo) and np.array_equal(just_below.hi, static.hi)
    assert np.array_equal(just_below.w, static.w)
    at = solver.keller_design(X, tix, 4, 1 / KELLER_TRUNCATE)
    assert not np.array_equal(at.hi, static.hi)
