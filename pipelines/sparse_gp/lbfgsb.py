"""L-BFGS-B whose whole state can be saved after any iteration and continued exactly.

The optimiser is pgmflow's own explicit-state L-BFGS-B (``pgmflow.tasks.gp.lbfgsb``: Byrd, Lu, Nocedal &
Zhu 1995 with Morales & Nocedal's 2011 subspace step and Moré & Thuente's 1994 line search, the method
of scipy's ``minimize(method="L-BFGS-B")``), a pure step ``(state, f, g) -> state`` whose state is plain
arrays. This module drives it with the interface the fits use: :meth:`LBFGSB.state` after an iteration,
:meth:`LBFGSB.from_state` to continue it in another process, where the next iterations are, bit for
bit, the ones the first process would have made. No scipy internals: the state is the same on every
scipy.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pgmflow.tasks.gp import lbfgsb as glbfgsb

DEFAULTS = {"maxcor": 10, "ftol": 2.2204460492503131e-09, "gtol": 1e-5, "maxls": 20, "maxfun": 15000}
Result = glbfgsb.Result


def available() -> bool:
    """Whether the optimiser's state can be saved and continued here: always (it is pgmflow's own).
    Kept so that callers (and tests that force the fallback) keep one switch."""
    return True


def continues(saved) -> bool:
    """Whether a checkpoint (a dict of arrays) holds a state this optimiser can continue exactly; False
    for one written by the scipy-driven optimiser of earlier versions or by the fallback (``x`` alone)."""
    return "lbfgsb_format" in saved and int(np.asarray(saved["lbfgsb_format"])) == glbfgsb.FORMAT


def _box(bounds, n):
    """``(lower [n], upper [n])`` from scipy-style ``[(lo, hi), ...]`` (None for an open side) or None."""
    lower, upper = np.full(n, -np.inf), np.full(n, np.inf)
    if bounds is None:
        return lower, upper
    if len(bounds) != n:
        raise ValueError(f"L-BFGS-B: {len(bounds)} bounds for {n} variables")
    for i, (lo, hi) in enumerate(bounds):
        lower[i] = -np.inf if lo is None else float(lo)
        upper[i] = np.inf if hi is None else float(hi)
    return lower, upper


class LBFGSB:
    """``minimize(fun_and_grad, x0, jac=True, method="L-BFGS-B", bounds=..., options={"maxiter": ...})``
    with its state exposed. ``fun_and_grad(x) -> (f, g)``; options as scipy's (``maxcor``, ``ftol``,
    ``gtol``, ``maxls``, ``maxfun``)."""

    def __init__(self, fun_and_grad: Callable, x0, bounds, maxiter: int, **options):
        o = {**DEFAULTS, **options}
        x0 = np.asarray(x0, dtype=np.float64).ravel()
        lower, upper = _box(bounds, x0.size)
        self.fun_and_grad = fun_and_grad
        self._state = glbfgsb.init(
            x0,
            lower,
            upper,
            memory=int(o["maxcor"]),
            ftol=float(o["ftol"]),
            gtol=float(o["gtol"]),
            max_iter=int(maxiter),
            max_fun=int(o["maxfun"]),
            max_ls=int(o["maxls"]),
        )
        self._last = None  # the last point evaluated, with its (f, g): a repeated point is not evaluated again

    @property
    def nit(self) -> int:
        return self._state.nit

    @property
    def nfev(self) -> int:
        return self._state.nfev

    @property
    def done(self) -> bool:
        return self._state.done

    def state(self) -> dict:
        """Everything needed to continue: plain arrays and scalars (no pickle), ``np.savez``-ready."""
        return glbfgsb.to_arrays(self._state)

    @classmethod
    def from_state(cls, fun_and_grad: Callable, state: dict) -> LBFGSB:
        opt = cls.__new__(cls)
        opt.fun_and_grad = fun_and_grad
        opt._state = glbfgsb.from_arrays(state)
        opt._last = None
        return opt

    def _evaluate(self, x):
        key = x.tobytes()
        if self._last is not None and self._last[0] == key:
            return self._last[1], self._last[2]
        f, g = self.fun_and_grad(x.copy())
        g = np.array(g, dtype=np.float64, copy=True)
        self._last = (key, float(f), g)
        return float(f), g

    def run(self, callback: Callable | None = None, on_iteration: Callable | None = None) -> Result:
        """Iterate to the end. ``callback(x, f)`` after each iteration (as scipy's); then
        ``on_iteration(self)`` (the moment to save :meth:`state`; :attr:`done` says it was the last)."""
        while not self._state.done:
            f, g = self._evaluate(self._state.x_eval)
            nit = self._state.nit
            self._state = glbfgsb.step(self._state, f, g)
            if self._state.nit > nit:
                if callback is not None:
                    callback(self._state.x, self._state.f)
                if on_iteration is not None:
                    on_iteration(self)
        return self.result()

    def result(self) -> Result:
        return glbfgsb.result(self._state)
