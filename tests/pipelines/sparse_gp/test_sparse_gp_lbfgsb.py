"""pipelines/sparse_gp/lbfgsb.py: the driver of pgmflow's own L-BFGS-B (pgmflow.tasks.gp.lbfgsb) reaches
scipy's L-BFGS-B optimum, and a state saved after any iteration, read back from an .npz, continues in a
fresh object exactly as the uninterrupted run. No private scipy name is imported."""

from __future__ import annotations

import ast
import io
from pathlib import Path

import numpy as np
import pytest
import scipy.optimize

from pgmflow.sparse_gp import lbfgsb


def rosen(x):
    return float(scipy.optimize.rosen(x)), scipy.optimize.rosen_der(x)


def bumpy(x):
    r = x - np.linspace(-2, 2, x.size)
    return float(r @ r + np.sum(np.sin(3 * x))), 2 * r + 3 * np.cos(3 * x)


PROBLEMS = {
    "rosenbrock": (rosen, np.full(6, -1.2), None, 15000),
    "rosenbrock_box": (rosen, np.full(6, 0.3), [(-0.5, 0.8)] * 3 + [(None, 0.9), (0.2, None), (None, None)], 15000),
    "bumpy_maxiter": (bumpy, np.zeros(8), [(-1.0, 1.0)] * 8, 4),
    "start_outside_box": (bumpy, np.full(4, 5.0), [(-1.0, 1.0)] * 4, 15000),
}


class _Stop(Exception):
    pass


def _npz(state: dict) -> dict:
    buf = io.BytesIO()
    np.savez(buf, **state)
    buf.seek(0)
    with np.load(buf, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_scipys_optimum_and_one_callback_per_iteration(name):
    fun, x0, bounds, maxiter = PROBLEMS[name]
    ref = scipy.optimize.minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": maxiter})
    seen = []
    got = lbfgsb.LBFGSB(fun, x0, bounds, maxiter).run(callback=lambda x, f: seen.append((x.copy(), f)))
    assert (got.success, got.message) == (ref.success, ref.message)
    assert len(seen) == got.nit and seen[-1][0].tobytes() == got.x.tobytes() and seen[-1][1] == got.fun
    assert all(fun(x)[0] == f for x, f in seen)  # the callback gets each iterate with its own value
    if ref.success:
        assert abs(got.fun - ref.fun) <= 1e-8 * max(1.0, abs(ref.fun))
        np.testing.assert_allclose(got.x, ref.x, rtol=0, atol=2e-4)
    else:  # stopped by maxiter after the same number of iterations, no worse
        assert got.nit == ref.nit == maxiter and got.fun <= ref.fun + 1e-6 * max(1.0, abs(ref.fun))


@pytest.mark.parametrize("name", ["rosenbrock", "rosenbrock_box"])
@pytest.mark.parametrize("stop_at", [1, 5, 17])
def test_a_saved_state_continues_exactly(name, stop_at):
    fun, x0, bounds, maxiter = PROBLEMS[name]
    full = lbfgsb.LBFGSB(fun, x0, bounds, maxiter).run()
    saved = {}

    def interrupt(opt):
        if opt.nit == stop_at:
            saved.update(opt.state())
            raise _Stop

    with pytest.raises(_Stop):
        lbfgsb.LBFGSB(fun, x0, bounds, maxiter).run(on_iteration=interrupt)
    assert lbfgsb.continues(saved)
    rest = lbfgsb.LBFGSB.from_state(fun, _npz(saved)).run()
    assert rest.x.tobytes() == full.x.tobytes() and rest.fun == full.fun
    assert (rest.nit, rest.nfev, rest.message) == (full.nit, full.nfev, full.message)


def test_this_optimiser_can_always_be_continued():
    assert lbfgsb.available()
    old = {"x": np.zeros(3), "wa": np.zeros(10), "isave": np.zeros(44, np.int32), "nit": np.int64(3)}
    assert not lbfgsb.continues(old), "a checkpoint of the scipy-driven optimiser must not be continued as this one's"
    assert not lbfgsb.continues({"x": np.zeros(3)})  # the fallback's


@pytest.mark.parametrize("name", ["rosenbrock", "bumpy_maxiter"])
def test_the_last_saved_state_gives_the_same_answer(name):
    """A driver killed after its last checkpoint (converged, or stopped by maxiter) but before it
    finished: the state saved at the last iteration ends at once with the same answer."""
    fun, x0, bounds, maxiter = PROBLEMS[name]
    states = []
    full = lbfgsb.LBFGSB(fun, x0, bounds, maxiter).run(on_iteration=lambda o: states.append((o.state(), o.done)))
    assert int(states[-1][0]["nit"]) == full.nit and states[-1][1] and not any(done for _, done in states[:-1])
    calls = []

    def counted(x):
        calls.append(x)
        return fun(x)

    rest = lbfgsb.LBFGSB.from_state(counted, _npz(states[-1][0])).run()
    assert rest.x.tobytes() == full.x.tobytes() and rest.fun == full.fun
    assert (rest.nit, rest.nfev, rest.success, rest.message) == (full.nit, full.nfev, full.success, full.message)
    assert calls == []


def test_no_private_scipy_name_is_imported():
    root = Path(__file__).resolve().parents[3]
    for path in (root / "pipelines" / "sparse_gp" / "lbfgsb.py", root / "tasks" / "gp" / "lbfgsb.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scipy"):
                names = [node.module, *(a.name for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("scipy")]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "scipy":
                names = [node.attr]
            else:
                continue
            assert not any(part.startswith("_") for n in names for part in n.split(".")), (path.name, names)
