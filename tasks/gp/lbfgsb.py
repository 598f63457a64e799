"""L-BFGS-B with an explicit state: a pure step ``(state, f, g) -> state`` that can be saved anywhere.

The method is L-BFGS-B (Byrd, Lu, Nocedal & Zhu 1995, "A limited memory algorithm for bound
constrained optimization", SIAM J. Sci. Comput. 16(5), 1190-1208), as in the authors' code
version 3.0, on which scipy's ``minimize(method="L-BFGS-B")`` rests:

* the limited-memory BFGS matrix in compact form ``B = theta I - W M W'`` with ``W = [Y, theta S]``
  (Byrd, Nocedal & Schnabel 1994, "Representations of quasi-Newton matrices and their use in limited
  memory methods", Math. Program. 63, eq. 3.5; Byrd et al. 1995, eq. 3.2-3.4);
* the generalized Cauchy point: the first local minimiser of the quadratic model along the
  projected steepest-descent path, found segment by segment between the breakpoints (Byrd et al.
  1995, section 4, algorithm CP);
* subspace minimisation over the variables free at the Cauchy point by the direct primal method
  (the Sherman-Morrison-Woodbury form of ``(Z' B Z)^-1``, Byrd et al. 1995, section 5.1), then
  projected onto the box and, when the projected point is not a descent direction, backtracked into
  the box (Morales & Nocedal 2011, "Remark on algorithm 778: L-BFGS-B", ACM TOMS 38(1), 7);
* a line search that satisfies the strong Wolfe conditions (sufficient decrease 1e-3, curvature 0.9)
  inside the box: Moré & Thuente 1994, "Line search algorithms with guaranteed sufficient decrease",
  ACM TOMS 20(3), 286-307 (their ``dcsrch`` and ``dcstep``); the unconstrained case is the two-loop
  L-BFGS of Nocedal & Wright, Numerical Optimization (2006), ch. 7, in compact form, and ch. 3.5;
* the memory is refreshed when a matrix it needs is singular, and a pair with ``s'y <= eps (-g's)``
  is skipped.

Stopping rules as scipy's: the projected gradient's infinity norm ``<= gtol``; the relative reduction
``(f_k - f_k+1) / max(|f_k|, |f_k+1|, 1) <= ftol``; ``max_iter`` iterations; more than ``max_fun``
evaluations; ``max_ls`` evaluations in one line search (memory refreshed, or, with an empty memory, an
abnormal end).

Reverse communication: the state names the point it wants evaluated next (``state.x_eval``), and a
driver is ::

    state = init(x0, lower, upper)
    while not state.done:
        f, g = fun(state.x_eval)
        state = step(state, f, g)

Every field of :class:`State` is a plain array or scalar: :func:`to_arrays` gives a dict for
``np.savez``, :func:`from_arrays` reads it back, and the continued run makes the same steps, bit for
bit, as the uninterrupted one. :func:`minimize` is that loop with a callback.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

EPS = float(np.finfo(np.float64).eps)
FORMAT = 1  # the layout of State in to_arrays; from_arrays refuses another

# phase: what the evaluation handed to step() is
START, SEARCH, DONE = 0, 1, 2
# status: why it stopped (0 while running)
RUNNING, CONV_GRAD, CONV_F, STOP_FUN, STOP_ITER, ABNORMAL, ERROR_NOFEAS = 0, 401, 402, 502, 504, 801, 701
MESSAGES = {
    RUNNING: "RUNNING",
    CONV_GRAD: "CONVERGENCE: NORM OF PROJECTED GRADIENT <= PGTOL",
    CONV_F: "CONVERGENCE: RELATIVE REDUCTION OF F <= FACTR*EPSMCH",
    STOP_FUN: "STOP: TOTAL NO. OF F,G EVALUATIONS EXCEEDS LIMIT",
    STOP_ITER: "STOP: TOTAL NO. OF ITERATIONS REACHED LIMIT",
    ABNORMAL: "ABNORMAL: ",
}
DEFAULTS = {
    "memory": 10,
    "ftol": 2.2204460492503131e-09,
    "gtol": 1e-5,
    "max_iter": 15000,
    "max_fun": 15000,
    "max_ls": 20,
}
# the line search's constants (Byrd et al. 1995, section 6; Moré & Thuente 1994)
LS_FTOL, LS_GTOL, LS_XTOL = 1e-3, 0.9, 0.1
LS_XTRAPL, LS_XTRAPU = 1.1, 4.0
STPMAX_FREE = 1e10


class State(NamedTuple):
    """Everything L-BFGS-B knows between two evaluations. n variables, memory m.

    Settings (unchanged by :func:`step`):
    lower, upper: float64 [n], the box (-inf / +inf where a side is open).
    memory: int, m, the most (s, y) pairs kept. ftol, gtol: float, the stopping tolerances.
    max_iter, max_fun, max_ls: int, the most iterations, evaluations, evaluations per line search.

    The iterate:
    x: float64 [n], the current iterate (inside the box). f: float, g: float64 [n], its value and gradient.
    x_eval: float64 [n], the point whose ``(f, g)`` the next :func:`step` takes.
    phase: int, START (x_eval is the start), SEARCH (x_eval is a line-search trial) or DONE.
    status: int, RUNNING or the reason for stopping (:data:`MESSAGES`).

    The limited memory (Byrd et al. 1995, section 3):
    S, Y: float64 [m, n], the last ``col`` steps s = x_k+1 - x_k and gradient changes y, oldest first
    (rows ``col:`` are zero). col: int, how many pairs are held. theta: float, the scaling of B_0 = theta I.

    The line search along ``d`` from ``x`` (Moré & Thuente 1994, ``dcsrch``; names as theirs):
    d: float64 [n], the search direction (the subspace minimiser minus x). stp: float, the trial step.
    stpmax: float, the largest step that stays in the box. f0: float, f(x). gd0: float, g(x)'d.
    n_ls: int, evaluations made in this search.
    brackt: int, whether a minimiser is bracketed. stage: int, 1 or 2.
    ginit, gtest, gx, gy, finit, fx, fy, stx, sty, stmin, stmax, width, width1: float, dcsrch's interval.

    Counters: nit (iterations), nfev (evaluations), nskip (skipped updates), nrefresh (memory refreshes).
    """

    lower: np.ndarray
    upper: np.ndarray
    memory: int
    ftol: float
    gtol: float
    max_iter: int
    max_fun: int
    max_ls: int
    x: np.ndarray
    f: float
    g: np.ndarray
    x_eval: np.ndarray
    phase: int
    status: int
    S: np.ndarray
    Y: np.ndarray
    col: int
    theta: float
    d: np.ndarray
    stp: float
    stpmax: float
    f0: float
    gd0: float
    n_ls: int
    brackt: int
    stage: int
    ginit: float
    gtest: float
    gx: float
    gy: float
    finit: float
    fx: float
    fy: float
    stx: float
    sty: float
    stmin: float
    stmax: float
    width: float
    width1: float
    nit: int
    nfev: int
    nskip: int
    nrefresh: int

    @property
    def done(self) -> bool:
        return self.phase == DONE

    @property
    def success(self) -> bool:
        return self.status in (CONV_GRAD, CONV_F)

    @property
    def message(self) -> str:
        return MESSAGES.get(self.status, f"STATUS {self.status}")


_INT = {
    "memory",
    "max_iter",
    "max_fun",
    "max_ls",
    "phase",
    "status",
    "col",
    "n_ls",
    "brackt",
    "stage",
    "nit",
    "nfev",
    "nskip",
    "nrefresh",
}
_ARRAY = {"lower", "upper", "x", "g", "x_eval", "S", "Y", "d"}


def to_arrays(state: State) -> dict:
    """The state as a dict of numpy arrays for ``np.savez`` (no pickle); ``lbfgsb_format`` marks the layout."""
    out = {"lbfgsb_format": np.int64(FORMAT)}
    for k, v in state._asdict().items():
        out[k] = (
            np.array(v, dtype=np.float64, copy=True) if k in _ARRAY else np.int64(v) if k in _INT else np.float64(v)
        )
    return out


def from_arrays(arrays) -> State:
    """The state :func:`to_arrays` wrote (from an ``np.load`` or a dict); raises ValueError for another layout."""
    if "lbfgsb_format" not in arrays or int(arrays["lbfgsb_format"]) != FORMAT:
        raise ValueError("not a pgmflow L-BFGS-B state of this layout")
    vals = {}
    for k in State._fields:
        v = arrays[k]
        vals[k] = np.array(v, dtype=np.float64, copy=True) if k in _ARRAY else int(v) if k in _INT else float(v)
    return State(**vals)


def _fmax(a, b):  # C's fmax: a NaN argument loses
    return b if math.isnan(a) else a if math.isnan(b) else max(a, b)


def _fmin(a, b):
    return b if math.isnan(a) else a if math.isnan(b) else min(a, b)


def init(
    x0,
    lower=None,
    upper=None,
    memory: int = 10,
    ftol: float = DEFAULTS["ftol"],
    gtol: float = 1e-5,
    max_iter: int = 15000,
    max_fun: int = 15000,
    max_ls: int = 20,
) -> State:
    """The state before the first evaluation: ``x0`` [n] projected onto the box ``[lower, upper]``
    ([n] each, or None; +-inf or NaN for an open side), which is the first ``x_eval``."""
    x = np.array(x0, dtype=np.float64).ravel()
    n = x.size
    lo = np.full(n, -np.inf) if lower is None else np.array(lower, dtype=np.float64).ravel()
    hi = np.full(n, np.inf) if upper is None else np.array(upper, dtype=np.float64).ravel()
    lo, hi = np.where(np.isnan(lo), -np.inf, lo), np.where(np.isnan(hi), np.inf, hi)
    if lo.shape != (n,) or hi.shape != (n,):
        raise ValueError(f"L-BFGS-B: the bounds must have {n} entries, like x0")
    if np.any(lo > hi):
        raise ValueError("L-BFGS-B: a lower bound is above its upper bound")
    if int(memory) < 1:
        raise ValueError("L-BFGS-B: the memory must be at least 1")
    x = np.minimum(np.maximum(x, lo), hi)
    m = int(memory)
    return State(
        lower=lo,
        upper=hi,
        memory=m,
        ftol=float(ftol),
        gtol=float(gtol),
        max_iter=int(max_iter),
        max_fun=int(max_fun),
        max_ls=int(max_ls),
        x=x,
        f=0.0,
        g=np.zeros(n),
        x_eval=x.copy(),
        phase=START,
        status=RUNNING,
        S=np.zeros((m, n)),
        Y=np.zeros((m, n)),
        col=0,
        theta=1.0,
        d=np.zeros(n),
        stp=0.0,
        stpmax=0.0,
        f0=0.0,
        gd0=0.0,
        n_ls=0,
        brackt=0,
        stage=1,
        ginit=0.0,
        gtest=0.0,
        gx=0.0,
        gy=0.0,
        finit=0.0,
        fx=0.0,
        fy=0.0,
        stx=0.0,
        sty=0.0,
        stmin=0.0,
        stmax=0.0,
        width=0.0,
        width1=0.0,
        nit=0,
        nfev=0,
        nskip=0,
        nrefresh=0,
    )


def projected_gradient_norm(x, g, lower, upper) -> float:
    """``max_i |P(x - g) - x|_i`` (Byrd et al. 1995, eq. 6.1): the infinity norm of the projected gradient."""
    if np.isnan(g).any():
        return float("nan")
    pg = np.where(g < 0, np.maximum(x - upper, g), np.minimum(x - lower, g))  # [n]
    return float(np.max(np.abs(pg), initial=0.0))


# --- the compact representation --------------------------------------------------------------------


class _Memory(NamedTuple):
    """The compact form of B for the ``col`` pairs held: ``W = [Y', theta S']`` [n, 2 col] and the middle
    matrix ``M = [[-D, L'], [L, theta S'S]]^-1`` (Byrd, Nocedal & Schnabel 1994, eq. 3.5)."""

    S: np.ndarray  # [col, n]
    Y: np.ndarray  # [col, n]
    SY: np.ndarray  # [col, col]  S Y'
    SS: np.ndarray  # [col, col]  S S'
    M: np.ndarray  # [2 col, 2 col]
    theta: float


def _memory(S, Y, col, theta) -> _Memory | None:
    """The pieces for ``col`` pairs, or None when ``T = theta S'S + L D^-1 L'`` is not positive definite
    (the L-BFGS-B code's ``formt``) or M is not finite. ``T`` is the Schur complement of ``-D`` in
    ``M^-1 = [[-D, L'], [L, theta S'S]]`` (Byrd et al. 1995, eq. 3.4), so::

        M = [[-D^-1 + D^-1 L' T^-1 L D^-1,  D^-1 L' T^-1],
             [T^-1 L D^-1,                  T^-1        ]]
    """
    S, Y = S[:col], Y[:col]  # [col, n]
    SY = S @ Y.T  # [col, col]
    SS = S @ S.T  # [col, col]
    dg = np.diag(SY).copy()  # [col]  D
    L = np.tril(SY, -1)  # [col, col]  L_ij = s_i'y_j, i > j
    LD = L / dg  # [col, col]  L D^-1
    T = theta * SS + LD @ L.T  # [col, col]
    try:
        J = np.linalg.cholesky(T)  # [col, col]
        Jinv = np.linalg.inv(J)  # [col, col]
    except np.linalg.LinAlgError:
        return None
    Tinv = Jinv.T @ Jinv  # [col, col]
    M21 = Tinv @ LD  # [col, col]  T^-1 L D^-1
    M11 = np.diag(-1.0 / dg) + LD.T @ M21  # [col, col]
    M = np.empty((2 * col, 2 * col))  # [2 col, 2 col]
    M[:col, :col], M[:col, col:], M[col:, :col], M[col:, col:] = M11, M21.T, M21, Tinv
    if not np.all(np.isfinite(M)):
        return None
    return _Memory(S, Y, SY, SS, M, theta)


def _mv(mem: _Memory, v):
    """``M v`` [2 col] for v [2 col]."""
    return mem.M @ v


def _w_row(mem: _Memory, i):
    """Row i of W: ``[y_1(i) .. y_col(i), theta s_1(i) .. theta s_col(i)]`` [2 col]."""
    return np.concatenate([mem.Y[:, i], mem.theta * mem.S[:, i]])


# --- the generalized Cauchy point --------------------------------------------------------------------


def _cauchy(x, g, lower, upper, mem: _Memory | None, theta, pgnorm):
    """``(xcp [n], free [n] bool, c [2 col])``: the generalized Cauchy point, the variables free there
    (not at a bound it reached, nor at a bound the gradient pushes against), and ``c = W'(xcp - x)``
    (Byrd et al. 1995, algorithm CP)."""
    n = x.size
    col = 0 if mem is None else mem.SY.shape[0]
    if pgnorm <= 0.0:
        return x.copy(), np.ones(n, bool), np.zeros(2 * col)
    neg = -g  # [n]
    has_lo, has_hi = np.isfinite(lower), np.isfinite(upper)  # [n]
    fixed = has_lo & has_hi & (upper - lower <= 0.0)  # [n]  always fixed
    tl = x - lower  # [n]
    tu = upper - x  # [n]
    at_lo = has_lo & (tl <= 0.0)
    at_hi = has_hi & (tu <= 0.0)
    # where: 1 at a lower bound the gradient pushes against, 2 likewise upper, -3 zero gradient, 0 moves
    held_lo = ~fixed & at_lo & (neg <= 0.0)
    held_hi = ~fixed & ~at_lo & at_hi & (neg >= 0.0)
    still = ~fixed & ~at_lo & ~at_hi & (np.abs(neg) <= 0.0) & (has_lo | has_hi)
    moves = ~(fixed | held_lo | held_hi | still)  # [n]  d_i = -g_i (also unbounded ones)
    d = np.where(moves, neg, 0.0)  # [n]
    f1 = -float(d @ d)
    free = ~(fixed | held_lo | held_hi)  # [n]  at x: the variables not held at a bound
    brk_lo = moves & has_lo & (neg < 0.0)
    brk_hi = moves & has_hi & (neg > 0.0) & ~brk_lo
    tbrk = np.full(n, np.inf)  # [n]
    tbrk[brk_lo] = tl[brk_lo] / (-neg[brk_lo])
    tbrk[brk_hi] = tu[brk_hi] / neg[brk_hi]
    is_brk = brk_lo | brk_hi  # [n]
    bounded_path = not bool(np.any(moves & ~is_brk & (np.abs(neg) > 0.0)))
    xcp = x.copy()
    if not np.any(moves):
        return xcp, free, np.zeros(2 * col)
    if col:
        p = np.concatenate([mem.Y @ d, theta * (mem.S @ d)])  # [2 col]  W'd
        c = np.zeros(2 * col)  # [2 col]
        f2 = -theta * f1 - float(_mv(mem, p) @ p)
    else:
        p = c = np.zeros(0)
        f2 = -theta * f1
    f2_org = f2
    dtm = -f1 / f2
    tsum = 0.0
    order = np.flatnonzero(is_brk)
    order = order[np.argsort(tbrk[order], kind="stable")]  # the breakpoints, nearest first
    nbreak = order.size
    tj = 0.0
    where = np.zeros(n, np.int8)  # 1 / 2: fixed at the lower / upper bound on the path
    reached_all = False
    for k in range(nbreak):
        ibp = int(order[k])
        tj0, tj = tj, float(tbrk[ibp])
        dt = tj - tj0
        if dtm < dt:
            break
        tsum += dt
        dibp = float(d[ibp])
        d[ibp] = 0.0
        if dibp > 0.0:
            zibp = upper[ibp] - x[ibp]
            xcp[ibp] = upper[ibp]
            where[ibp] = 2
        else:
            zibp = lower[ibp] - x[ibp]
            xcp[ibp] = lower[ibp]
            where[ibp] = 1
        nleft = nbreak - k - 1
        if nleft == 0 and nbreak == n:  # every variable fixed: xcp is the Cauchy point
            dtm = dt
            reached_all = True
            break
        dibp2 = dibp * dibp
        f1 = f1 + dt * f2 + dibp2 - theta * dibp * zibp
        f2 = f2 - theta * dibp2
        if col:
            c = c + dt * p
            wbp = _w_row(mem, ibp)  # [2 col]
            v = _mv(mem, wbp)  # [2 col]
            wmc, wmp, wmw = float(c @ v), float(p @ v), float(wbp @ v)
            p = p - dibp * wbp
            f1 = f1 + dibp * wmc
            f2 = f2 + dibp * 2.0 * wmp - dibp2 * wmw
        f2 = max(EPS * f2_org, f2)
        if nleft > 0:
            dtm = -f1 / f2
        elif bounded_path:
            dtm = 0.0
            break
        else:
            dtm = -f1 / f2
            break
    if not reached_all:
        dtm = max(dtm, 0.0)
        tsum += dtm
        xcp = xcp + tsum * d
    if col:
        c = c + dtm * p
    free = free & (where == 0)
    return xcp, free, c


# --- subspace minimisation ----------------------------------------------------------------------------


def _subspace(x, g, xcp, free, c, lower, upper, mem: _Memory, theta, constrained: bool):
    """The point z [n] that minimises the model over the free variables from ``xcp`` (direct primal
    method, Byrd et al. 1995, section 5.1), projected onto the box, backtracked into it when the
    projection is no descent direction (Morales & Nocedal 2011); None when K is singular."""
    idx = np.flatnonzero(free)
    Wz = np.concatenate([mem.Y[:, idx], theta * mem.S[:, idx]])  # [2 col, nf]  W'Z
    if not constrained:
        r = -g[idx]  # [nf]
    else:
        r = -theta * (xcp[idx] - x[idx]) - g[idx] + Wz.T @ _mv(mem, c)  # [nf]  -Z'(g + B (xcp - x))
    col = mem.SY.shape[0]
    dg = np.diag(mem.SY)
    L = np.tril(mem.SY, -1)
    Minv = np.empty((2 * col, 2 * col))  # [2 col, 2 col]
    Minv[:col, :col], Minv[:col, col:], Minv[col:, :col], Minv[col:, col:] = -np.diag(dg), L.T, L, theta * mem.SS
    K = Minv - (Wz @ Wz.T) / theta  # [2 col, 2 col]
    try:
        v = np.linalg.solve(K, Wz @ r)  # [2 col]
    except np.linalg.LinAlgError:
        return None
    if not np.all(np.isfinite(v)):
        return None
    du = r / theta + (Wz.T @ v) / (theta * theta)  # [nf]  (Z'BZ)^-1 r by Sherman-Morrison-Woodbury
    z = xcp.copy()
    lo, hi = lower[idx], upper[idx]
    zt = np.minimum(np.maximum(xcp[idx] + du, lo), hi)  # [nf]  projected
    z[idx] = zt
    if not np.any((zt == lo) | (zt == hi)):
        return z
    if float((z - x) @ g) <= 0.0:
        return z
    # not a descent direction: the longest step along du from xcp that stays in the box
    z = xcp.copy()
    xs = xcp[idx]  # [nf]
    with np.errstate(divide="ignore", invalid="ignore"):
        down = (du < 0.0) & np.isfinite(lo)  # [nf]
        up = (du > 0.0) & np.isfinite(hi)  # [nf]
        gap = np.where(down, lo - xs, np.where(up, hi - xs, 0.0))  # [nf]
        ratio = np.where(
            down, np.where(gap >= 0.0, 0.0, gap / du), np.where(up, np.where(gap <= 0.0, 0.0, gap / du), np.inf)
        )  # [nf]
    ibd = int(np.argmin(ratio)) if ratio.size else -1
    alpha = float(ratio[ibd]) if ibd >= 0 and ratio[ibd] < 1.0 else 1.0
    du = du.copy()
    if alpha < 1.0:
        k = idx[ibd]
        if du[ibd] > 0.0:
            z[k] = hi[ibd]
            du[ibd] = 0.0
        elif du[ibd] < 0.0:
            z[k] = lo[ibd]
            du[ibd] = 0.0
    z[idx] = z[idx] + alpha * du
    return z


# --- the line search: Moré & Thuente (1994) ---------------------------------------------------------------


def _dcstep(stx, fx, dx, sty, fy, dy, stp, fp, dp, brackt, stpmin, stpmax):
    """One safeguarded step of Moré & Thuente (1994), section 4 (MINPACK-2 ``dcstep``): the new
    ``(stx, fx, dx, sty, fy, dy, stp, brackt)``. In IEEE arithmetic as the Fortran and C codes (a
    division by zero gives inf or NaN, not an exception)."""
    with np.errstate(all="ignore"):
        stx, fx, dx, sty, fy, dy, stp, fp, dp = (np.float64(v) for v in (stx, fx, dx, sty, fy, dy, stp, fp, dp))
        stpmin, stpmax = np.float64(stpmin), np.float64(stpmax)
        sgnd = dp * (dx / abs(dx))
        if fp > fx:  # case 1: a higher value; the minimum is bracketed
            theta = 3.0 * (fx - fp) / (stp - stx) + dx + dp
            s = _fmax(abs(theta), _fmax(abs(dx), abs(dp)))
            gamma = s * np.sqrt((theta / s) ** 2 - (dx / s) * (dp / s))
            if stp < stx:
                gamma = -gamma
            p = (gamma - dx) + theta
            q = ((gamma - dx) + gamma) + dp
            r = p / q
            stpc = stx + r * (stp - stx)
            stpq = stx + ((dx / ((fx - fp) / (stp - stx) + dx)) / 2.0) * (stp - stx)
            stpf = stpc if abs(stpc - stx) < abs(stpq - stx) else stpc + (stpq - stpc) / 2.0
            brackt = 1
        elif sgnd < 0.0:  # case 2: lower value, derivatives of opposite sign
            theta = 3.0 * (fx - fp) / (stp - stx) + dx + dp
            s = _fmax(abs(theta), _fmax(abs(dx), abs(dp)))
            gamma = s * np.sqrt((theta / s) ** 2 - (dx / s) * (dp / s))
            if stp > stx:
                gamma = -gamma
            p = (gamma - dp) + theta
            q = ((gamma - dp) + gamma) + dx
            r = p / q
            stpc = stp + r * (stx - stp)
            stpq = stp + (dp / (dp - dx)) * (stx - stp)
            stpf = stpc if abs(stpc - stp) > abs(stpq - stp) else stpq
            brackt = 1
        elif abs(dp) < abs(dx):  # case 3: lower value, same sign, the derivative's magnitude decreases
            theta = 3.0 * (fx - fp) / (stp - stx) + dx + dp
            s = _fmax(abs(theta), _fmax(abs(dx), abs(dp)))
            gamma = s * np.sqrt(_fmax(np.float64(0.0), (theta / s) ** 2 - (dx / s) * (dp / s)))
            if stp > stx:
                gamma = -gamma
            p = (gamma - dp) + theta
            q = (gamma + (dx - dp)) + gamma
            r = p / q
            if r < 0.0 and gamma != 0.0:
                stpc = stp + r * (stx - stp)
            elif stp > stx:
                stpc = stpmax
            else:
                stpc = stpmin
            stpq = stp + (dp / (dp - dx)) * (stx - stp)
            if brackt:
                stpf = stpc if abs(stpc - stp) < abs(stpq - stp) else stpq
                if stp > stx:
                    stpf = _fmin(stp + 0.66 * (sty - stp), stpf)
                else:
                    stpf = _fmax(stp + 0.66 * (sty - stp), stpf)
            else:
                stpf = stpc if abs(stpc - stp) > abs(stpq - stp) else stpq
                stpf = _fmax(stpmin, _fmin(stpmax, stpf))
        else:  # case 4: lower value, same sign, the derivative's magnitude does not decrease
            if brackt:
                theta = 3.0 * (fp - fy) / (sty - stp) + dy + dp
                s = _fmax(abs(theta), _fmax(abs(dy), abs(dp)))
                gamma = s * np.sqrt((theta / s) ** 2 - (dy / s) * (dp / s))
                if stp > sty:
                    gamma = -gamma
                p = (gamma - dp) + theta
                q = ((gamma - dp) + gamma) + dy
                r = p / q
                stpf = stp + r * (sty - stp)
            elif stp > stx:
                stpf = stpmax
            else:
                stpf = stpmin
        if fp > fx:
            sty, fy, dy = stp, fp, dp
        else:
            if sgnd < 0.0:
                sty, fy, dy = stx, fx, dx
            stx, fx, dx = stp, fp, dp
    return (float(stx), float(fx), float(dx), float(sty), float(fy), float(dy), float(stpf), int(brackt))


def _search_start(st: State, stp: float) -> State:
    """dcsrch's initialisation for a search from ``st.x`` along ``st.d`` with slope ``st.gd0``."""
    return st._replace(
        stp=stp,
        brackt=0,
        stage=1,
        finit=st.f,
        ginit=st.gd0,
        gtest=LS_FTOL * st.gd0,
        width=st.stpmax,
        width1=st.stpmax / 0.5,
        stx=0.0,
        fx=st.f,
        gx=st.gd0,
        sty=0.0,
        fy=st.f,
        gy=st.gd0,
        stmin=0.0,
        stmax=stp + LS_XTRAPU * stp,
        n_ls=0,
    )


def _dcsrch(st: State, f: float, gd: float):
    """One call of Moré & Thuente's ``dcsrch`` with ``(f, gd)`` at ``st.stp``: ``(state, verdict)`` with
    verdict 'fg' (evaluate at the new ``stp``), 'conv' (strong Wolfe holds) or 'warn' (no progress
    possible; ``stp`` is the best step found)."""
    stp, brackt, stage = st.stp, st.brackt, st.stage
    ftest = st.finit + stp * st.gtest
    if stage == 1 and f <= ftest and gd >= 0.0:
        stage = 2
    verdict = None
    if brackt and (stp <= st.stmin or stp >= st.stmax):
        verdict = "warn"
    if brackt and st.stmax - st.stmin <= LS_XTOL * st.stmax:
        verdict = "warn"
    if stp == st.stpmax and f <= ftest and gd <= st.gtest:
        verdict = "warn"
    if stp == 0.0 and (f > ftest or gd >= st.gtest):
        verdict = "warn"
    if f <= ftest and abs(gd) <= LS_GTOL * (-st.ginit):
        verdict = "conv"
    if verdict is not None:
        return st._replace(stage=stage), verdict
    stx, fx, gx, sty, fy, gy = st.stx, st.fx, st.gx, st.sty, st.fy, st.gy
    gtest = st.gtest
    if stage == 1 and f <= fx and f > ftest:  # the modified function psi
        fm, fxm, fym = f - stp * gtest, fx - stx * gtest, fy - sty * gtest
        gm, gxm, gym = gd - gtest, gx - gtest, gy - gtest
        stx, fxm, gxm, sty, fym, gym, stp, brackt = _dcstep(
            stx, fxm, gxm, sty, fym, gym, stp, fm, gm, brackt, st.stmin, st.stmax
        )
        fx, fy, gx, gy = fxm + stx * gtest, fym + sty * gtest, gxm + gtest, gym + gtest
    else:
        stx, fx, gx, sty, fy, gy, stp, brackt = _dcstep(
            stx, fx, gx, sty, fy, gy, stp, f, gd, brackt, st.stmin, st.stmax
        )
    width, width1 = st.width, st.width1
    if brackt:
        if abs(sty - stx) >= 0.66 * width1:
            stp = stx + 0.5 * (sty - stx)
        width1 = width
        width = abs(sty - stx)
    if brackt:
        stmin, stmax = min(stx, sty), max(stx, sty)
    else:
        stmin, stmax = stp + LS_XTRAPL * (stp - stx), stp + LS_XTRAPU * (stp - stx)
    stp = _fmin(_fmax(stp, 0.0), st.stpmax)
    if (brackt and (stp <= stmin or stp >= stmax)) or (brackt and stmax - stmin <= LS_XTOL * stmax):
        stp = stx
    return st._replace(
        stp=stp,
        brackt=brackt,
        stage=stage,
        stx=stx,
        fx=fx,
        gx=gx,
        sty=sty,
        fy=fy,
        gy=gy,
        stmin=stmin,
        stmax=stmax,
        width=width,
        width1=width1,
    ), "fg"


def _trial(st: State) -> np.ndarray:
    """The line search's trial point ``x + stp d`` [n], kept in the box against rounding."""
    if st.stp == 1.0:
        xt = st.x + st.d
    else:
        xt = st.stp * st.d + st.x
    return np.minimum(np.maximum(xt, st.lower), st.upper)


# --- one iteration's direction -----------------------------------------------------------------------------


def _refresh(st: State) -> State:
    return st._replace(S=np.zeros_like(st.S), Y=np.zeros_like(st.Y), col=0, theta=1.0, nrefresh=st.nrefresh + 1)


def _direction(st: State) -> State:
    """From the iterate ``(x, f, g)``: the Cauchy point, the subspace minimiser, the direction, the
    largest step, and the line search's first trial (``x_eval``). Refreshes the memory (and starts
    again) where a matrix is singular."""
    constrained = bool(np.any(np.isfinite(st.lower) | np.isfinite(st.upper)))
    boxed = bool(np.all(np.isfinite(st.lower) & np.isfinite(st.upper)))
    pg = projected_gradient_norm(st.x, st.g, st.lower, st.upper)
    for _ in range(2):  # at most one refresh: with an empty memory nothing is singular
        mem = _memory(st.S, st.Y, st.col, st.theta) if st.col else None
        if st.col and mem is None:
            st = _refresh(st)
            continue
        if not constrained and st.col:
            z = _subspace(st.x, st.g, st.x, np.ones(st.x.size, bool), None, st.lower, st.upper, mem, st.theta, False)
        else:
            xcp, free, c = _cauchy(st.x, st.g, st.lower, st.upper, mem, st.theta, pg)
            z = (
                xcp
                if (not np.any(free) or not st.col)
                else _subspace(st.x, st.g, xcp, free, c, st.lower, st.upper, mem, st.theta, True)
            )
        if z is None:
            st = _refresh(st)
            continue
        break
    d = z - st.x  # [n]
    dnorm = float(np.sqrt(d @ d))
    stpmax = STPMAX_FREE
    if constrained:
        if st.nit == 0:
            stpmax = 1.0
        else:
            neg = (d < 0.0) & np.isfinite(st.lower)  # [n]
            pos = (d > 0.0) & np.isfinite(st.upper)  # [n]
            gap = np.where(neg, st.lower - st.x, np.where(pos, st.upper - st.x, 0.0))  # [n]
            if np.any(neg & (gap >= 0.0)) or np.any(pos & (gap <= 0.0)):
                stpmax = 0.0
            elif np.any(neg | pos):
                with np.errstate(divide="ignore", invalid="ignore"):
                    stpmax = min(stpmax, float(np.min(np.where(neg | pos, gap / d, np.inf))))
    if not dnorm > 0.0:
        return _search_failed(st._replace(d=d, stpmax=float(stpmax), f0=st.f, gd0=0.0))
    stp = min(1.0 / dnorm, stpmax) if (st.nit == 0 and not boxed) else min(1.0, stpmax)
    gd0 = float(st.g @ d)
    st = st._replace(d=d, stpmax=float(stpmax), f0=st.f, gd0=gd0)
    if not gd0 < 0.0 or not stp > 0.0:  # no descent direction (or no room in the box): no search
        return _search_failed(st)
    st = _search_start(st, float(stp))
    return st._replace(x_eval=_trial(st), phase=SEARCH)


def _search_failed(st: State) -> State:
    """The line search failed (no descent, or max_ls evaluations): with pairs in memory, refresh it and
    search again from x; with none, stop abnormally at x."""
    if st.col == 0:
        return st._replace(phase=DONE, status=ABNORMAL, x_eval=st.x.copy())
    return _direction(_refresh(st))


def _accept(st: State, x_new, f, g) -> State:
    """The line search ended at ``x_new``: an iteration is made. Stop (iterations, evaluations,
    projected gradient, relative reduction), or update the memory and start the next search."""
    y = g - st.g  # [n]
    fold = st.f
    st = st._replace(x=x_new, f=f, g=g, nit=st.nit + 1)
    if st.nit >= st.max_iter:
        return st._replace(phase=DONE, status=STOP_ITER, x_eval=x_new.copy())
    if st.nfev > st.max_fun:
        return st._replace(phase=DONE, status=STOP_FUN, x_eval=x_new.copy())
    if projected_gradient_norm(x_new, g, st.lower, st.upper) <= st.gtol:
        return st._replace(phase=DONE, status=CONV_GRAD, x_eval=x_new.copy())
    if fold - f <= st.ftol * max(abs(fold), abs(f), 1.0):
        return st._replace(phase=DONE, status=CONV_F, x_eval=x_new.copy())
    sd = st.stp * st.d  # [n]
    dr = float(y @ sd)
    if dr <= EPS * (-st.gd0 * st.stp):  # curvature too small: skip the pair
        st = st._replace(nskip=st.nskip + 1)
    else:
        m = st.memory
        S, Y = st.S.copy(), st.Y.copy()  # [m, n]
        if st.col == m:
            S[:-1], Y[:-1] = S[1:].copy(), Y[1:].copy()
            k = m - 1
        else:
            k = st.col
        S[k], Y[k] = sd, y
        st = st._replace(S=S, Y=Y, col=k + 1, theta=float(y @ y) / dr)
    return _direction(st)


def step(state: State, f, g) -> State:
    """The next state, given ``f`` (float) and ``g`` [n] at ``state.x_eval``. Pure: ``state`` is not changed."""
    st = state
    if st.phase == DONE:
        return st
    f = float(f)
    g = np.array(g, dtype=np.float64).ravel()  # [n]
    st = st._replace(nfev=st.nfev + 1)
    if st.phase == START:
        st = st._replace(f=f, g=g)
        if projected_gradient_norm(st.x, g, st.lower, st.upper) <= st.gtol:
            return st._replace(phase=DONE, status=CONV_GRAD)
        return _direction(st)
    # a line-search trial
    gd = float(g @ st.d)
    st = st._replace(n_ls=st.n_ls + 1)
    st, verdict = _dcsrch(st, f, gd)
    if verdict != "fg":
        return _accept(st, st.x_eval, f, g)
    if st.n_ls >= st.max_ls:
        return _search_failed(st)
    return st._replace(x_eval=_trial(st))


class Result(NamedTuple):
    """x [n], fun, nit, nfev, success, message: as scipy's OptimizeResult fields of the same names."""

    x: np.ndarray
    fun: float
    nit: int
    nfev: int
    success: bool
    message: str


def result(state: State) -> Result:
    return Result(state.x.copy(), float(state.f), int(state.nit), int(state.nfev), state.success, state.message)


def minimize(fun: Callable, x0, lower=None, upper=None, callback: Callable | None = None, **options) -> Result:
    """``fun(x) -> (f, g)`` minimised from ``x0`` in the box; ``callback(state)`` after each iteration."""
    st = init(x0, lower, upper, **options)
    while not st.done:
        f, g = fun(st.x_eval.copy())
        nit = st.nit
        st = step(st, f, g)
        if callback is not None and st.nit > nit:
            callback(st)
    return result(st)
