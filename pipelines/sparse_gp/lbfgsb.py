"""L-BFGS-B whose whole state can be saved after any iteration and continued exactly.

scipy's L-BFGS-B (``scipy.optimize._lbfgsb.setulb``, scipy >= 1.15) is a reverse-communication
routine: everything it knows between calls (the point, the gradient, the limited memory of ``s``
and ``y`` pairs, the line search's progress, its counters) lives in the arrays it is handed. This
module drives it with the same loop as ``scipy.optimize.minimize(method="L-BFGS-B")``, so its
iterates are the same bits (``tests/pipelines/test_sparse_gp_lbfgsb.py`` checks it against scipy),
and exposes that state: :meth:`LBFGSB.state` after an iteration, :meth:`LBFGSB.from_state` to
continue it in another process, where the next iterations are the ones the first process would
have made.

Where the private routine is missing or has another signature (another scipy), :func:`available`
is False and callers fall back to ``scipy.optimize.minimize`` from the saved point with a fresh
memory.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import numpy as np

ARRAYS = ("x", "g", "wa", "iwa", "task", "ln_task", "lsave", "isave", "dsave", "low", "up", "nbd")
DEFAULTS = {"maxcor": 10, "ftol": 2.2204460492503131e-09, "gtol": 1e-5, "maxls": 20, "maxfun": 15000}


class Result(NamedTuple):
    x: np.ndarray
    fun: float
    nit: int
    nfev: int
    success: bool
    message: str


def _setulb():
    from scipy.optimize import _lbfgsb

    return _lbfgsb.setulb


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether this scipy's L-BFGS-B can be driven (and so saved and continued) here: the private
    routine exists and, on a small bounded problem, gives scipy's own iterates."""
    import scipy.optimize

    try:
        _setulb()
    except Exception:
        return False

    def f(x):
        r = x - np.array([0.3, -1.2, 2.0])
        return float(r @ r + np.sin(3 * x[0])), 2 * r + np.array([3 * np.cos(3 * x[0]), 0.0, 0.0])

    bounds = [(-1.0, 1.0), (None, 0.5), (0.0, None)]
    try:
        ref = scipy.optimize.minimize(f, np.zeros(3), jac=True, method="L-BFGS-B", bounds=bounds)
        got = LBFGSB(f, np.zeros(3), bounds, maxiter=15000).run()
    except Exception:
        return False
    return bool(np.array_equal(ref.x, got.x) and ref.nit == got.nit and ref.fun == got.fun)


def _box(bounds, n):
    """scipy's encoding of the bounds: ``(low, up, nbd)`` with nbd 0 free, 1 lower, 2 both, 3 upper."""
    low, up, nbd = np.zeros(n), np.zeros(n), np.zeros(n, np.int32)
    if bounds is None:
        return low, up, nbd
    for i, (lo, hi) in enumerate(bounds):
        lo = -np.inf if lo is None else float(lo)
        hi = np.inf if hi is None else float(hi)
        if lo > hi:
            raise ValueError("L-BFGS-B: a lower bound is above its upper bound")
        if np.isfinite(lo):
            low[i] = lo
        if np.isfinite(hi):
            up[i] = hi
        nbd[i] = {(False, False): 0, (True, False): 1, (True, True): 2, (False, True): 3}[
            (bool(np.isfinite(lo)), bool(np.isfinite(hi)))]
    return low, up, nbd


class LBFGSB:
    """``minimize(fun_and_grad, x0, jac=True, method="L-BFGS-B", bounds=..., options={"maxiter": ...})``
    with its state exposed. ``fun_and_grad(x) -> (f, g)``."""

    def __init__(self, fun_and_grad: Callable, x0, bounds, maxiter: int, **options):
        o = {**DEFAULTS, **options}
        self.fun_and_grad, self.maxiter = fun_and_grad, int(maxiter)
        self.maxcor, self.maxls, self.maxfun = int(o["maxcor"]), int(o["maxls"]), int(o["maxfun"])
        self.factr, self.pgtol = float(o["ftol"]) / np.finfo(float).eps, float(o["gtol"])
        x0 = np.asarray(x0, dtype=np.float64).ravel()
        n, m = x0.size, self.maxcor
        self.low, self.up, self.nbd = _box(bounds, n)
        if bounds is not None:  # scipy starts from the start point clipped to the box
            x0 = np.clip(x0, np.where(self.nbd % 3 != 0, self.low, -np.inf), np.where(self.nbd >= 2, self.up, np.inf))
        self.x = x0.copy()
        self.f = np.array(0.0)
        self.g = np.zeros(n)
        self.wa = np.zeros(2 * m * n + 5 * n + 11 * m * m + 8 * m)
        self.iwa = np.zeros(3 * n, np.int32)
        self.task = np.zeros(2, np.int32)
        self.ln_task = np.zeros(2, np.int32)
        self.lsave = np.zeros(4, np.int32)
        self.isave = np.zeros(44, np.int32)
        self.dsave = np.zeros(29)
        self.nit = 0
        self.nfev = 0
        self._last = None  # the last point evaluated: scipy answers a repeated point from its cache

    def state(self) -> dict:
        """Everything needed to continue: arrays, counters and settings (plain arrays, no pickle)."""
        out = {k: np.array(getattr(self, k), copy=True) for k in ARRAYS}
        out.update(f=np.asarray(self.f, dtype=np.float64), nit=np.int64(self.nit), nfev=np.int64(self.nfev),
                   settings=np.array([self.maxcor, self.maxls, self.maxfun, self.factr, self.pgtol, self.maxiter],
                                     dtype=np.float64))
        return out

    @classmethod
    def from_state(cls, fun_and_grad: Callable, state: dict) -> "LBFGSB":
        opt = cls.__new__(cls)
        opt.fun_and_grad = fun_and_grad
        maxcor, maxls, maxfun, factr, pgtol, maxiter = (float(v) for v in state["settings"])
        opt.maxcor, opt.maxls, opt.maxfun, opt.maxiter = int(maxcor), int(maxls), int(maxfun), int(maxiter)
        opt.factr, opt.pgtol = factr, pgtol
        for k in ARRAYS:
            setattr(opt, k, np.array(state[k], copy=True))
        opt.f = np.array(state["f"], dtype=np.float64) if np.ndim(state["f"]) == 0 else state["f"]
        opt.f = float(opt.f)
        opt.nit, opt.nfev = int(state["nit"]), int(state["nfev"])
        opt._last = None
        return opt

    def _evaluate(self, x):
        key = x.tobytes()
        if self._last is not None and self._last[0] == key:
            return self._last[1], self._last[2]
        f, g = self.fun_and_grad(x.copy())
        g = np.array(g, dtype=np.float64, copy=True)
        self.nfev += 1
        self._last = (key, float(f), g)
        return float(f), g

    def run(self, callback: Callable | None = None, on_iteration: Callable | None = None) -> Result:
        """Iterate to the end. ``callback(x, f)`` after each iteration (as scipy's); then
        ``on_iteration(self)`` (the moment to save :meth:`state`)."""
        setulb = _setulb()
        while True:
            self.g = self.g.astype(np.float64)
            setulb(self.maxcor, self.x, self.low, self.up, self.nbd, self.f, self.g, self.factr, self.pgtol,
                   self.wa, self.iwa, self.task, self.lsave, self.isave, self.dsave, self.maxls, self.ln_task)
            if self.task[0] == 3:
                self.f, self.g = self._evaluate(self.x)
            elif self.task[0] == 1:
                self.nit += 1
                if callback is not None:
                    callback(self.x, self.f)
                if self.nit >= self.maxiter:
                    self.task[0], self.task[1] = 5, 504
                elif self.nfev > self.maxfun:
                    self.task[0], self.task[1] = 5, 502
                if on_iteration is not None:
                    on_iteration(self)
            else:
                break
        return self.result()

    def result(self) -> Result:
        from scipy.optimize._lbfgsb_py import status_messages, task_messages

        message = f"{status_messages[int(self.task[0])]}: {task_messages[int(self.task[1])]}"
        return Result(self.x.copy(), float(self.f), self.nit, self.nfev, bool(self.task[0] == 4), message)
