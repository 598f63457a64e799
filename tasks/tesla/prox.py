"""Exact proximal operators of the 1-D total variation and of the fused lasso penalty.

Total-variation denoising of a series ``y`` [n]::

    tv(y, lam) = argmin_x  0.5 * ||x - y||^2 + lam * sum_{t>=1} |x_t - x_{t-1}|

is solved exactly by the direct algorithm of L. Condat, "A direct algorithm for 1D total
variation denoising", IEEE Signal Processing Letters 20(11), 2013 (implemented here from the
optimality conditions, restated below). Typical cost O(n); the worst case is O(n^2).

Optimality conditions. With ``D`` [n-1, n] the first difference, ``(Dx)_t = x_{t+1} - x_t``, x
is optimal iff ``y - x = D^T u`` for some ``u`` [n-1] with ``|u_t| <= lam`` and
``u_t = lam * sign(x_{t+1} - x_t)`` wherever ``x_{t+1} != x_t``. Equivalently the partial sums
``S_k = sum_{i<=k} (y_i - x_i) = -u_k`` stay in ``[-lam, lam]``, end at ``S_{n-1} = 0``, and
touch ``-lam`` (``+lam``) where x jumps up (down). The algorithm scans one segment (a run of
equal values starting at ``k0``) at a time, with the partial sum ``P`` before ``k0`` known
(``0`` at the start, ``+lam`` after a jump down, ``-lam`` after a jump up). It keeps the lowest
and highest segment values ``vmin <= vmax`` that keep the partial sums of ``y - v`` over
``k0..k`` within the tube, their partial sums ``umin``, ``umax`` at ``k`` and the last indices
``km``, ``kp`` where those bounds were tight. If extending to ``k+1`` makes even ``vmin`` too
high (``umin < -lam``) the segment must end with a jump down at ``km``; symmetrically for
``vmax`` and a jump up at ``kp``. The next segment restarts from there. At the end the final
partial sum must be 0: if that needs a value below ``vmin`` (above ``vmax``) the segment jumps
at ``km`` (``kp``) and scanning restarts after it; otherwise the segment takes the value that
makes the final sum exactly 0.

If ``lam >= tv_lambda_max(y) = max_k |sum_{i<=k} (y_i - mean(y))|`` the solution is
``mean(y)`` everywhere; that case is detected first, so a huge ``lam`` loses no precision.

Fused lasso. The proximal operator of ``lam1 * ||x||_1 + lam2 * TV(x)`` is the soft
thresholding at ``lam1`` of ``tv(y, lam2)`` (Friedman, Hastie, Hoefling and Tibshirani 2007,
"Pathwise coordinate optimization", Proposition 1). :func:`prox_fused_lasso` applies it to each
column of a ``[T, p]`` matrix (time down the rows, one coefficient path per column), with the
l1 part only on the columns marked ``penalized``.

Numba kernels (for use inside other numba code): ``k = prox._kernels()`` compiles them on first use
and returns a :class:`Kernels` named tuple ``(tv1d, prox_fused_lasso, fused_zero, tv1d_warm)``; the
module globals ``prox._tv1d``, ``prox._prox_fused_lasso``, ``prox._fused_zero`` and ``prox._tv1d_warm``
are then the same dispatchers (before, the same functions as plain Python):

- ``_tv1d(y, lam, x)``: y [n] float64, x [n] float64 (output), lam float >= 0. Any strides
  (e.g. ``Y[:, j]`` of a C-ordered matrix); ``x`` may be ``y`` itself, no other overlap.
- ``_prox_fused_lasso(Y, lam1, lam2, penalized, out)``: Y [T, p] float64, penalized [p] bool,
  out [T, p] float64 (output; may be ``Y`` itself, no other overlap), lam1, lam2 floats >= 0.
- ``_fused_zero(y, lam1, lam2) -> bool``: whether ``soft(tv(y, lam2), lam1)`` is all zero, in one
  pass without solving (the common case inside an L1 solver: most columns stay at zero).
- ``_tv1d_warm(y, lam, signs, x) -> bool``: ``tv(y, lam)`` from a guessed jump set ``signs``
  [n-1] int8 (+1 up, -1 down, 0 none), verified against the optimality conditions in two passes;
  False when the guess is wrong (then call ``_tv1d``). Contiguous y and x of the same length.

None of the kernels checks its arguments (the Python wrappers do). To call them from a kernel of
your own module, name them there and pass the dispatcher as ``bind`` when your module compiles
(:func:`pgmflow.tasks.backend.compile_kernels`; a module global, not a closure cell, keeps numba's
on-disk cache key the same in every process), e.g.::

    _prox = prox._prox_fused_lasso  # bound to its dispatcher by _kernels()

    @backend.kernel(cache=True, nogil=True)
    def _fista(...):
        ...
        _prox(V, step * lam1, step * lam2, penalized, X)

    @functools.lru_cache(maxsize=None)
    def _kernels():
        return backend.compile_kernels(sys.modules[__name__],
                                       bind={"_prox": prox._kernels().prox_fused_lasso})

(numba's cache of the caller does not notice edits to this file: clear ``__pycache__`` then.)
"""

from __future__ import annotations

import functools
import math
import sys
from typing import Any, NamedTuple

import numpy as np

from pgmflow.tasks import backend

__all__ = ["Kernels", "prox_fused_lasso", "tv_denoise_1d", "tv_lambda_max"]


class Kernels(NamedTuple):
    """The jitted kernels (numba dispatchers); see the module docstring for their contracts."""

    tv1d: Any  # (y [n], lam, x [n]) -> None, x = tv(y, lam)
    prox_fused_lasso: Any  # (Y [T, p], lam1, lam2, penalized [p], out [T, p]) -> None
    fused_zero: Any  # (y [n], lam1, lam2) -> bool: soft(tv(y, lam2), lam1) == 0
    tv1d_warm: Any  # (y [n], lam, signs [n-1] int8, x [n]) -> bool: x = tv(y, lam) if signs are its jumps


def tv_lambda_max(y: np.ndarray) -> float:
    """The smallest ``lam`` for which ``tv(y, lam)`` is constant (= mean(y)), for y [n], n >= 1.

    ``max_{k < n-1} |sum_{i<=k} (y_i - mean(y))|`` (0 for n == 1).
    """
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 1 or y.size == 0:
        raise ValueError(f"y must be a non-empty 1-D array, got shape {y.shape}")
    if y.size == 1:
        return 0.0
    return float(np.max(np.abs(np.cumsum(y - y.mean())[:-1])))


def _check_lam(name: str, lam: float) -> float:
    lam = float(lam)
    if not (math.isfinite(lam) and lam >= 0.0):
        raise ValueError(f"{name} must be finite and >= 0, got {lam}")
    return lam


def _output(out: np.ndarray | None, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(array to write into, array to return). A partly overlapping ``out`` gets a temporary."""
    if out is None:
        buf = np.empty(y.shape)
        return buf, buf
    if not isinstance(out, np.ndarray) or out.dtype != np.float64 or out.shape != y.shape:
        raise ValueError(f"out must be a float64 array of shape {y.shape}")
    if not out.flags.writeable:
        raise ValueError("out must be writeable")
    same = out.__array_interface__["data"][0] == y.__array_interface__["data"][0] and out.strides == y.strides
    if not same and np.may_share_memory(out, y):
        return np.empty(y.shape), out
    return out, out


def tv_denoise_1d(y: np.ndarray, lam: float, out: np.ndarray | None = None) -> np.ndarray:
    """The exact ``argmin_x 0.5 ||x - y||^2 + lam * sum_t |x_t - x_{t-1}|`` for y [n].

    ``y`` [n] (n >= 1, any strides; converted to float64 if needed), ``lam >= 0``. ``out`` [n]
    float64 (any strides, may be ``y`` itself) receives the result; returns ``out`` (a new
    array [n] if None).
    """
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 1 or y.size == 0:
        raise ValueError(f"y must be a non-empty 1-D array, got shape {y.shape}")
    lam = _check_lam("lam", lam)
    buf, res = _output(out, y)
    _kernels().tv1d(y, lam, buf)
    if buf is not res:
        res[...] = buf
    return res


def prox_fused_lasso(
    Y: np.ndarray, lam1: float, lam2: float, penalized: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """The prox of ``lam1 * ||.||_1 + lam2 * TV`` applied to each column of Y [T, p].

    Column j becomes ``tv(Y[:, j], lam2)``, soft-thresholded at ``lam1`` if ``penalized[j]``
    (bool [p], or a scalar for all columns). ``lam1, lam2 >= 0``. ``out`` [T, p] float64 (any
    strides, may be ``Y`` itself) receives the result; returns ``out`` (a new C-ordered
    array [T, p] if None).
    """
    Y = np.asarray(Y, dtype=np.float64)
    if Y.ndim != 2 or Y.shape[0] == 0:
        raise ValueError(f"Y must be a 2-D array [T, p] with T >= 1, got shape {Y.shape}")
    lam1 = _check_lam("lam1", lam1)
    lam2 = _check_lam("lam2", lam2)
    pen = np.asarray(penalized)
    if pen.ndim > 1 or (pen.ndim == 1 and pen.shape[0] != Y.shape[1]):
        raise ValueError(f"penalized must be a scalar or have shape ({Y.shape[1]},), got {pen.shape}")
    pen = np.full(Y.shape[1], bool(pen)) if pen.ndim == 0 else np.ascontiguousarray(pen, dtype=np.bool_)
    buf, res = _output(out, Y)
    _kernels().prox_fused_lasso(Y, lam1, lam2, pen, buf)
    if buf is not res:
        res[...] = buf
    return res


# --- numba kernels ----------------------------------------------------------------------------------

# Plain module-level functions marked for numba; _kernels() compiles them and rebinds these names to the
# dispatchers (pgmflow.tasks.backend.compile_kernels), so that _prox_fused_lasso calls the compiled _tv1d.


@backend.kernel(cache=True, nogil=True)
def _fused_zero(y, lam1, lam2):
    """True iff ``soft(tv(y, lam2), lam1)`` is zero everywhere, in one pass without solving.

    The taut string (the cumulative sum of ``tv(y, lam2)``) minimises every convex function of
    its slopes among the strings F with ``F_0 = 0``, ``|F_k - S_k| <= lam2`` (``S_k`` the partial
    sums of y) and ``F_n = S_n``; so all of its slopes lie in ``[-lam1, lam1]`` iff some such
    string has slopes in that interval. The reachable values of ``F_k`` form one interval,
    propagated forwards (widened by ``lam1``, clipped to the tube); the test fails as soon as it
    is empty. Exact up to rounding: on a tie (``max |tv| == lam1``) either answer is the prox.
    """
    n = y.shape[0]
    lo = 0.0
    hi = 0.0
    s = 0.0
    for k in range(n - 1):
        s += y[k]
        lo = max(lo - lam1, s - lam2)
        hi = min(hi + lam1, s + lam2)
        if lo > hi:
            return False
    s += y[n - 1]
    return lo - lam1 <= s <= hi + lam1


@backend.kernel(cache=True, nogil=True)
def _tv1d_warm(y, lam, signs, x):
    """``x = tv(y, lam)`` if ``signs`` ([n-1] int8: +1 a jump up after t, -1 down, 0 none) are
    the jumps of the solution; returns False (x partly written) if they are not.

    A jump set fixes the solution: each segment ``a..b`` between jumps has the dual value
    ``-lam * sign`` at its jumps (0 at both ends of the series), hence the value
    ``v = (sum y[a..b] - (S_b - S_{a-1})) / (b - a + 1)``. The guess is the optimum iff the
    optimality conditions hold (module docstring): every partial sum of ``y - x`` inside a
    segment lies in ``[-lam, lam]`` (up to 1e-12 relative: rounding) and every jump goes the
    stated way (a zero-height jump is allowed: the dual value ``+-lam`` is then merely tight).
    Two passes over y with no backtracking; a solver iterating the prox of nearby points
    (FISTA) keeps the jump set of its last answer and falls back to :func:`_tv1d` on a miss.
    """
    n = y.shape[0]
    a = 0
    s_prev = 0.0
    v_prev = 0.0
    while a < n:
        b = a
        while b < n - 1 and signs[b] == 0:
            b += 1
        s_end = 0.0 if b == n - 1 else -lam * signs[b]
        tot = 0.0
        for i in range(a, b + 1):
            tot += y[i]
        v = (tot - (s_end - s_prev)) / (b - a + 1)
        if a > 0:
            if signs[a - 1] > 0:
                if v < v_prev:
                    return False
            elif v > v_prev:
                return False
        eps = 1e-12 * (lam + abs(tot) + abs(v) * (b - a + 1))
        part = s_prev
        for k in range(a, b):
            part += y[k] - v
            if part > lam + eps or part < -lam - eps:
                return False
        for i in range(a, b + 1):
            x[i] = v
        s_prev = s_end
        v_prev = v
        a = b + 1
    return True


@backend.kernel(cache=True, nogil=True)
def _tv1d(y, lam, x):
    """x [n] = tv(y [n], lam) (see the module docstring). Writes never pass reads: x may be y."""
    n = y.shape[0]
    if n == 0:
        return
    if n == 1 or not lam > 0.0:
        for i in range(n):
            x[i] = y[i]
        return
    # lam at or above tv_lambda_max(y): the mean everywhere (exact, and no catastrophic
    # cancellation in y - lam for a huge lam)
    s = 0.0
    for i in range(n):
        s += y[i]
    mean = s / n
    c = 0.0
    big = 0.0
    for i in range(n - 1):
        c += y[i] - mean
        if abs(c) > big:
            big = abs(c)
    if lam >= big:
        for i in range(n):
            x[i] = mean
        return
    # first segment: partial sum before it is 0, so its value lies in [y0 - lam, y0 + lam]
    k = 0  # last index scanned
    k0 = 0  # start of the current segment
    km = 0  # last index where the lower candidate was tight (partial sum = +lam)
    kp = 0  # last index where the upper candidate was tight (partial sum = -lam)
    vmin = y[0] - lam
    vmax = y[0] + lam
    umin = lam  # partial sum at k of y - vmin (including the one before k0)
    umax = -lam  # partial sum at k of y - vmax
    while True:
        if k == n - 1:
            # end of the series: the final partial sum must be 0
            if umin < 0.0:
                # even vmin is too high: jump down after km, restart there (partial sum +lam)
                for i in range(k0, km + 1):
                    x[i] = vmin
                k0 = km + 1
                k = k0
                km = k0
                kp = k0
                vmin = y[k0]
                vmax = vmin + 2.0 * lam
                umin = lam
                umax = -lam
            elif umax > 0.0:
                # even vmax is too low: jump up after kp, restart there (partial sum -lam)
                for i in range(k0, kp + 1):
                    x[i] = vmax
                k0 = kp + 1
                k = k0
                km = k0
                kp = k0
                vmax = y[k0]
                vmin = vmax - 2.0 * lam
                umin = lam
                umax = -lam
            else:
                v = vmin + umin / (k - k0 + 1)
                for i in range(k0, n):
                    x[i] = v
                return
            continue
        yn = y[k + 1]
        umin += yn - vmin
        if umin < -lam:
            # no value keeps the partial sums >= -lam through k+1: jump down after km
            for i in range(k0, km + 1):
                x[i] = vmin
            k0 = km + 1
            k = k0
            km = k0
            kp = k0
            vmin = y[k0]
            vmax = vmin + 2.0 * lam
            umin = lam
            umax = -lam
            continue
        umax += yn - vmax
        if umax > lam:
            # no value keeps the partial sums <= lam through k+1: jump up after kp
            for i in range(k0, kp + 1):
                x[i] = vmax
            k0 = kp + 1
            k = k0
            km = k0
            kp = k0
            vmax = y[k0]
            vmin = vmax - 2.0 * lam
            umin = lam
            umax = -lam
            continue
        k += 1
        if umin >= lam:
            # raise the lower candidate until its partial sum at k is exactly +lam
            vmin += (umin - lam) / (k - k0 + 1)
            umin = lam
            km = k
        if umax <= -lam:
            # lower the upper candidate until its partial sum at k is exactly -lam
            vmax += (umax + lam) / (k - k0 + 1)
            umax = -lam
            kp = k


@backend.kernel(cache=True, nogil=True)
def _prox_fused_lasso(Y, lam1, lam2, penalized, out):
    """out[:, j] = soft(tv(Y[:, j], lam2), lam1 if penalized[j] else 0) for Y, out [T, p]."""
    p = Y.shape[1]
    T = Y.shape[0]
    for j in range(p):
        col = out[:, j]
        if penalized[j] and lam1 > 0.0:
            # tv(y) lies within [min y, max y]: if every |y_t| <= lam1 the result is exactly 0
            big = 0.0
            for t in range(T):
                if abs(Y[t, j]) > big:
                    big = abs(Y[t, j])
            if big <= lam1:
                for t in range(T):
                    col[t] = 0.0
                continue
        _tv1d(Y[:, j], lam2, col)
        if penalized[j] and lam1 > 0.0:
            for t in range(T):
                v = col[t]
                if v > lam1:
                    col[t] = v - lam1
                elif v < -lam1:
                    col[t] = v + lam1
                else:
                    col[t] = 0.0


@functools.lru_cache(maxsize=None)
def _kernels() -> Kernels:
    """Compile the kernels above (once per process; numba's on-disk cache serves later processes)."""
    k = backend.compile_kernels(sys.modules[__name__])
    return Kernels(k["_tv1d"], k["_prox_fused_lasso"], k["_fused_zero"], k["_tv1d_warm"])
