"""pipelines/sparse_gp/lbfgsb.py: the same iterates as scipy's L-BFGS-B, bit for bit, and a state
saved after any iteration continues, in a fresh object, exactly as the uninterrupted run."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize

from pgmflow.pipelines.sparse_gp import lbfgsb


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


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_same_iterates_as_scipy(name):
    fun, x0, bounds, maxiter = PROBLEMS[name]
    seen_ref, seen = [], []

    def record(intermediate_result):  # scipy passes the OptimizeResult to a parameter of this name
        seen_ref.append((intermediate_result.x.copy(), intermediate_result.fun))

    ref = scipy.optimize.minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": maxiter},
                                  callback=record)
    got = lbfgsb.LBFGSB(fun, x0, bounds, maxiter).run(callback=lambda x, f: seen.append((x.copy(), f)))
    assert got.x.tobytes() == ref.x.tobytes() and got.fun == ref.fun
    assert (got.nit, got.nfev, got.success, got.message) == (ref.nit, ref.nfev, ref.success, ref.message)
    assert len(seen) == len(seen_ref) and all(a[0].tobytes() == b[0].tobytes() and a[1] == b[1]
                                              for a, b in zip(seen, seen_ref))


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
    state = {k: np.array(v) for k, v in saved.items()}  # as read back from an .npz
    rest = lbfgsb.LBFGSB.from_state(fun, state).run()
    assert rest.x.tobytes() == full.x.tobytes() and rest.fun == full.fun
    assert (rest.nit, rest.nfev, rest.message) == (full.nit, full.nfev, full.message)


def test_this_scipy_can_be_driven():
    assert lbfgsb.available(), "scipy's L-BFGS-B internals changed: resume falls back to a fresh memory"


@pytest.mark.parametrize("name", ["rosenbrock", "bumpy_maxiter"])
def test_the_last_saved_state_gives_the_same_answer(name):
    """A driver killed after its last checkpoint (converged, or stopped by maxiter) but before it
    finished: the state saved at the last iteration ends at once with the same answer."""
    fun, x0, bounds, maxiter = PROBLEMS[name]
    states = []
    full = lbfgsb.LBFGSB(fun, x0, bounds, maxiter).run(on_iteration=lambda o: states.append(o.state()))
    assert int(states[-1]["nit"]) == full.nit
    calls = []

    def counted(x):
        calls.append(x)
        return fun(x)

    rest = lbfgsb.LBFGSB.from_state(counted, {k: np.array(v) for k, v in states[-1].items()}).run()
    assert rest.x.tobytes() == full.x.tobytes() and rest.fun == full.fun
    assert (rest.nit, rest.nfev, rest.success, rest.message) == (full.nit, full.nfev, full.success, full.message)
    assert len(calls) == full.nfev - int(states[-1]["nfev"])
