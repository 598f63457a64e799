"""The exact TV / fused-lasso prox against its optimality certificate and independent SciPy solvers.

Notation: D [n-1, n] is the first difference, (Dx)_t = x_{t+1} - x_t, so (D^T u)_i = u_{i-1} - u_i
and y - x = D^T u means u_k = -sum_{i<=k} (y_i - x_i) with the full sum 0.
"""

import numpy as np
import pytest
from scipy.optimize import linprog, lsq_linear

from pgmflow.tasks.tesla import prox

# --- helpers --------------------------------------------------------------------------------------


def _diff_matrix(n):
    """D [n-1, n]."""
    return np.eye(n, k=1)[: n - 1] - np.eye(n)[: n - 1]


def _tv_certificate(y, x, lam):
    """Problems with x as the TV solution (empty list iff x passes), from the dual u = -cumsum(y - x).

    A jump smaller than 1e-12 * scale counts as no jump: where the exact solution has two adjacent
    segments with the same value (a degenerate tie, |u_t| = lam exactly), rounding may leave them
    an ulp apart in either direction.
    """
    problems = []
    scale = 1.0 + np.max(np.abs(y))
    c = np.cumsum(y - x)
    u = -c[:-1]
    d = np.diff(x)
    tol = lam * 1e-9 + 1e-12 * scale
    if np.any(np.abs(u) > lam + tol):
        problems.append(f"|u| exceeds lam: max |u| - lam = {np.max(np.abs(u)) - lam:.3e}")
    jump = np.abs(d) > 1e-12 * scale
    if np.any(np.abs(u[jump] - lam * np.sign(d[jump])) > tol):
        problems.append(f"sign condition: max err {np.max(np.abs(u[jump] - lam * np.sign(d[jump]))):.3e}")
    if abs(c[-1]) > 1e-12 * scale * len(y):
        problems.append(f"sum(y - x) = {c[-1]:.3e} != 0")
    return problems


def _random_case(rng, i):
    """(y [n], lam) of many shapes: lengths 1..300, lam from 0 to beyond tv_lambda_max(y)."""
    n = int(rng.integers(1, 301)) if i % 3 else int(rng.integers(1, 12))
    kind = i % 7
    if kind == 0:  # gaussian noise
        y = rng.standard_normal(n)
    elif kind == 1:  # small integers: many exact ties
        y = rng.integers(-2, 3, n).astype(float)
    elif kind == 2:  # steps plus noise
        y = np.repeat(rng.normal(0, 3, n), rng.integers(1, 30, n))[:n] + 0.3 * rng.standard_normal(n)
    elif kind == 3:  # spikes on a flat background
        y = np.where(rng.random(n) < 0.05, rng.normal(0, 10, n), 0.0)
    elif kind == 4:  # constant
        y = np.full(n, rng.normal())
    elif kind == 5:  # random walk
        y = np.cumsum(rng.standard_normal(n))
    else:  # one-decimal values: ties of sums
        y = np.round(rng.standard_normal(n), 1)
    lmax = prox.tv_lambda_max(y)
    r = i % 5
    if r == 0:
        lam = 0.0
    elif r == 1:
        lam = float(rng.choice([0.1, 0.5, 1.0, 1.5, 2.0]))  # decimal lam with decimal data: exact ties
    elif r == 2:
        lam = lmax * (1.0 + rng.exponential())  # beyond the bound: constant solution
    else:
        lam = float(rng.exponential() * 10 ** rng.uniform(-3, 1))
    return y, lam


# --- TV denoising ---------------------------------------------------------------------------------


def test_certificate_rejects_wrong_answers():
    rng = np.random.default_rng(0)
    y = np.cumsum(rng.standard_normal(50))
    x = prox.tv_denoise_1d(y, 2.0)
    assert _tv_certificate(y, x, 2.0) == []
    assert _tv_certificate(y, prox.tv_denoise_1d(y, 2.2), 2.0)  # the solution for another lam
    bad = x.copy()
    bad[10] += 1e-6
    assert _tv_certificate(y, bad, 2.0)
    assert _tv_certificate(y, np.full(50, y.mean()), 2.0)  # below the bound the mean is not optimal


def test_optimality_certificate_random_cases():
    rng = np.random.default_rng(12345)
    failures = []
    for i in range(2000):
        y, lam = _random_case(rng, i)
        x = prox.tv_denoise_1d(y, lam)
        assert x.shape == y.shape and x.dtype == np.float64
        problems = _tv_certificate(y, x, lam)
        if problems:
            failures.append((i, len(y), lam, problems))
    assert failures == []


@pytest.mark.parametrize("seed", range(6))
def test_matches_scipy_dual_qp(seed):
    # the dual: min_u 0.5 ||D^T u - y||^2 s.t. |u| <= lam (bounded least squares), x = y - D^T u
    rng = np.random.default_rng(seed)
    for i in range(40):
        n = int(rng.integers(2, 40))
        y = rng.standard_normal(n) if i % 2 else np.round(np.cumsum(rng.standard_normal(n)), 1)
        lam = float(rng.uniform(0.01, 1.2) * max(prox.tv_lambda_max(y), 0.1))
        A = _diff_matrix(n).T
        res = lsq_linear(A, y, bounds=(-lam, lam), method="bvls", tol=1e-14)
        ref = y - A @ res.x
        np.testing.assert_allclose(prox.tv_denoise_1d(y, lam), ref, rtol=0, atol=1e-6)


def test_known_answers():
    rng = np.random.default_rng(3)
    for n in (1, 2, 5, 100):
        y = rng.standard_normal(n)
        np.testing.assert_array_equal(prox.tv_denoise_1d(y, 0.0), y)  # lam = 0: identity
        bound = prox.tv_lambda_max(y)
        for lam in (bound, 2 * bound + 1e-3, 1e300):  # at or above the bound: the mean
            np.testing.assert_allclose(prox.tv_denoise_1d(y, lam), np.full(n, y.mean()), rtol=1e-13, atol=1e-15)
        if n > 1:  # just below the bound the solution is not constant
            assert np.ptp(prox.tv_denoise_1d(y, 0.9 * bound)) > 0
    y1 = np.array([3.25])
    for lam in (0.0, 1.0, 1e300):
        np.testing.assert_array_equal(prox.tv_denoise_1d(y1, lam), y1)  # n = 1: identity
    np.testing.assert_array_equal(prox.tv_denoise_1d(np.full(7, -2.5), 1.0), np.full(7, -2.5))  # constant
    # two points: each moves lam toward the other until they meet
    np.testing.assert_allclose(prox.tv_denoise_1d(np.array([0.0, 1.0]), 0.2), [0.2, 0.8], atol=1e-15)
    np.testing.assert_allclose(prox.tv_denoise_1d(np.array([0.0, 1.0]), 0.7), [0.5, 0.5], atol=1e-15)
    # a step of height 2 over 5 + 5 points: each side moves lam / 5 toward the other
    np.testing.assert_allclose(
        prox.tv_denoise_1d(np.r_[np.zeros(5), 2 * np.ones(5)], 1.0), np.r_[np.full(5, 0.2), np.full(5, 1.8)], atol=1e-14
    )
    # the bound itself: max partial sum of y - mean
    assert prox.tv_lambda_max(np.array([0.0, 0.0, 3.0])) == pytest.approx(2.0)


def test_non_contiguous_views_and_in_place():
    rng = np.random.default_rng(4)
    Y = np.cumsum(rng.standard_normal((120, 7)), axis=0)  # C order: columns are strided views
    out = np.zeros((120, 7))
    for j in range(7):
        ref = prox.tv_denoise_1d(Y[:, j].copy(), 1.3)
        np.testing.assert_array_equal(prox.tv_denoise_1d(Y[:, j], 1.3), ref)
        res = prox.tv_denoise_1d(Y[:, j], 1.3, out=out[:, j])
        assert np.shares_memory(res, out)
        np.testing.assert_array_equal(out[:, j], ref)
        np.testing.assert_array_equal(prox.tv_denoise_1d(Y[::-1, j], 1.3), prox.tv_denoise_1d(Y[::-1, j].copy(), 1.3))
    # in place, and an output that overlaps the input only partly
    y = Y[:, 0].copy()
    ref = prox.tv_denoise_1d(y, 0.7)
    prox.tv_denoise_1d(y, 0.7, out=y)
    np.testing.assert_array_equal(y, ref)
    buf = np.r_[Y[:, 1], 0.0]
    ref = prox.tv_denoise_1d(buf[:-1].copy(), 0.7)
    prox.tv_denoise_1d(buf[:-1], 0.7, out=buf[1:])
    np.testing.assert_array_equal(buf[1:], ref)


def test_argument_checks():
    with pytest.raises(ValueError):
        prox.tv_denoise_1d(np.ones(3), -1.0)
    with pytest.raises(ValueError):
        prox.tv_denoise_1d(np.ones(3), float("nan"))
    with pytest.raises(ValueError):
        prox.tv_denoise_1d(np.ones((3, 2)), 1.0)
    with pytest.raises(ValueError):
        prox.tv_denoise_1d(np.ones(3), 1.0, out=np.empty(4))
    with pytest.raises(ValueError):
        prox.prox_fused_lasso(np.ones((3, 2)), 1.0, 1.0, np.ones(3, bool))
    with pytest.raises(ValueError):
        prox.prox_fused_lasso(np.ones((3, 2)), -1.0, 1.0, True)


# --- fused lasso ----------------------------------------------------------------------------------


def _fused_certificate_gap(y, x, lam1, lam2):
    """The least t such that y - x = lam1 s + D^T u with s in sign(x), |u| <= lam2 + t, u_t within t of
    lam2 sign(x_{t+1} - x_t) at jumps, and sum(y - x - lam1 s) within t of 0 (an LP over the free
    s_i in [-1, 1] where x_i = 0). x is optimal iff the gap is 0."""
    n = len(y)
    scale = 1.0 + np.max(np.abs(y))
    zero = x == 0.0
    s_fixed = np.where(zero, 0.0, np.sign(x))
    cw = np.cumsum(y - x - lam1 * s_fixed)  # partial sums before the free signs
    M = lam1 * np.tril(np.ones((n, n)))[:, zero]  # partial sums of lam1 * s_free
    m = M.shape[1]
    d = np.diff(x)
    jump = np.abs(d) > 1e-12 * scale
    rows, rhs = [], []

    def le(coef_s, coef_t, b):  # coef_s @ s + coef_t * t <= b
        rows.append(np.r_[coef_s, coef_t])
        rhs.append(b)

    for k in range(n - 1):  # C_k = cw_k - M_k s, need |C_k| <= lam2 + t
        le(-M[k], -1.0, lam2 - cw[k])
        le(M[k], -1.0, lam2 + cw[k])
        if jump[k]:  # u_k = -C_k = lam2 sign(d_k)  ->  |cw_k + lam2 sign(d_k) - M_k s| <= t
            target = cw[k] + lam2 * np.sign(d[k])
            le(-M[k], -1.0, -target)
            le(M[k], -1.0, target)
    le(-M[n - 1], -1.0, -cw[n - 1])  # the full sum is 0
    le(M[n - 1], -1.0, cw[n - 1])
    res = linprog(
        np.r_[np.zeros(m), 1.0],
        A_ub=np.array(rows),
        b_ub=np.array(rhs),
        bounds=[(-1, 1)] * m + [(0, None)],
        method="highs",
    )
    assert res.status == 0, res.message
    return res.fun / scale


def _fused_reference(y, lam1, lam2):
    """An independent solver: the dual min ||v + D^T u - y||^2, |v| <= lam1, |u| <= lam2; x = y - v - D^T u."""
    n = len(y)
    A = np.hstack([np.eye(n), _diff_matrix(n).T])
    ub = np.r_[np.full(n, lam1), np.full(n - 1, lam2)]
    A, ub = A[:, ub > 0], ub[ub > 0]  # a zero bound fixes that dual variable at 0
    res = lsq_linear(A, y, bounds=(-ub, ub), method="bvls", tol=1e-14)
    return y - A @ res.x


def test_fused_certificate_rejects_wrong_answers():
    rng = np.random.default_rng(5)
    y = np.cumsum(rng.standard_normal(30))
    Y = y[:, None]
    x = prox.prox_fused_lasso(Y, 0.8, 1.5, True)[:, 0]
    assert _fused_certificate_gap(y, x, 0.8, 1.5) < 1e-9
    assert _fused_certificate_gap(y, prox.prox_fused_lasso(Y, 1.0, 1.5, True)[:, 0], 0.8, 1.5) > 1e-6
    assert _fused_certificate_gap(y, prox.prox_fused_lasso(Y, 0.8, 1.5, False)[:, 0], 0.8, 1.5) > 1e-6
    assert _fused_certificate_gap(y, prox.prox_fused_lasso(Y, 0.8, 1.8, True)[:, 0], 0.8, 1.5) > 1e-6


@pytest.mark.parametrize("seed", range(4))
def test_fused_lasso_certificate_and_reference(seed):
    rng = np.random.default_rng(100 + seed)
    T, p = int(rng.integers(1, 40)), 6
    Y = np.cumsum(rng.standard_normal((T, p)), axis=0) + rng.normal(0, 2, p)
    Y[:, 0] = np.round(Y[:, 0])  # ties
    Y[:, 1] = 0.0  # all zero
    penalized = np.array([True, True, True, False, True, False])
    for lam1, lam2 in [(0.0, 0.5), (0.5, 0.0), (0.7, 1.3), (2.0, 0.3), (0.3, 1e3), (1e3, 1.0)]:
        X = prox.prox_fused_lasso(Y, lam1, lam2, penalized)
        assert X.shape == (T, p) and X.dtype == np.float64
        for j in range(p):
            l1 = lam1 if penalized[j] else 0.0
            assert _fused_certificate_gap(Y[:, j], X[:, j], l1, lam2) < 1e-9, (lam1, lam2, j)
            if T > 1 and (l1 > 0 or lam2 > 0):
                np.testing.assert_allclose(X[:, j], _fused_reference(Y[:, j], l1, lam2), rtol=0, atol=1e-6)


def test_fused_lasso_is_soft_thresholded_tv_and_respects_penalized():
    rng = np.random.default_rng(6)
    Y = np.cumsum(rng.standard_normal((80, 9)), axis=0)
    penalized = rng.random(9) < 0.5
    penalized[:2] = [True, False]
    lam1, lam2 = 1.1, 2.0
    X = prox.prox_fused_lasso(Y, lam1, lam2, penalized)
    for j in range(9):
        z = prox.tv_denoise_1d(Y[:, j].copy(), lam2)
        if penalized[j]:
            np.testing.assert_array_equal(X[:, j], np.sign(z) * np.maximum(np.abs(z) - lam1, 0.0))
            assert np.any(X[:, j] == 0.0) or np.min(np.abs(z)) > lam1
        else:
            np.testing.assert_array_equal(X[:, j], z)  # no soft thresholding at all
    # a scalar penalized applies to every column
    np.testing.assert_array_equal(
        prox.prox_fused_lasso(Y, lam1, lam2, False),
        np.column_stack([prox.tv_denoise_1d(Y[:, j].copy(), lam2) for j in range(9)]),
    )
    np.testing.assert_array_equal(
        prox.prox_fused_lasso(Y, lam1, lam2, True), prox.prox_fused_lasso(Y, lam1, lam2, np.ones(9, bool))
    )


@pytest.mark.slow
def test_fused_lasso_layouts_and_in_place():
    rng = np.random.default_rng(7)
    Y = np.cumsum(rng.standard_normal((60, 5)), axis=0)
    pen = np.array([True, False, True, True, False])
    ref = prox.prox_fused_lasso(Y, 0.4, 0.9, pen)
    np.testing.assert_array_equal(prox.prox_fused_lasso(np.asfortranarray(Y), 0.4, 0.9, pen), ref)
    big = np.zeros((120, 10))
    big[::2, ::2] = Y  # strided in both axes
    np.testing.assert_array_equal(prox.prox_fused_lasso(big[::2, ::2], 0.4, 0.9, pen), ref)
    out = np.zeros((60, 10))
    prox.prox_fused_lasso(Y, 0.4, 0.9, pen, out=out[:, 1::2])
    np.testing.assert_array_equal(out[:, 1::2], ref)
    assert np.all(out[:, ::2] == 0.0)
    Z = Y.copy()
    assert prox.prox_fused_lasso(Z, 0.4, 0.9, pen, out=Z) is Z
    np.testing.assert_array_equal(Z, ref)


def test_kernels_callable_from_numba():
    nb = pytest.importorskip("numba")
    k = prox._kernels()
    assert k.tv1d is prox._tv1d and k.prox_fused_lasso is prox._prox_fused_lasso
    kern = k.prox_fused_lasso

    @nb.njit
    def two_steps(Y, pen):  # a caller that slices and loops, as a FISTA loop would
        out = np.empty_like(Y)
        kern(Y, 0.2, 0.5, pen, out)
        kern(out, 0.2, 0.5, pen, out)
        x = np.empty(Y.shape[0])
        prox._tv1d(Y[:, 0], 0.5, x)
        return out, x

    rng = np.random.default_rng(8)
    Y = np.cumsum(rng.standard_normal((30, 4)), axis=0)
    pen = np.array([True, False, True, False])
    out, x = two_steps(Y, pen)
    once = prox.prox_fused_lasso(Y, 0.2, 0.5, pen)
    np.testing.assert_array_equal(out, prox.prox_fused_lasso(once, 0.2, 0.5, pen))
    np.testing.assert_array_equal(x, prox.tv_denoise_1d(Y[:, 0], 0.5))


# --- the solver's shortcuts: the one-pass zero test and the warm-started TV ---------------------------


def _jump_signs(x, scale):
    """int8 [n-1]: +1 / -1 where x jumps up / down by more than rounding, else 0."""
    d = np.diff(x)
    return np.where(np.abs(d) > 1e-12 * scale, np.sign(d), 0).astype(np.int8)


def test_fused_zero_is_the_zero_test_of_the_fused_prox():
    """``fused_zero(y, lam1, lam2)`` iff soft(tv(y, lam2), lam1) == 0, on 3000 random cases (ties
    within 1e-12 of lam1, where either answer is the prox up to rounding, are counted apart)."""
    k = prox._kernels()
    rng = np.random.default_rng(21)
    wrong, ties, zeros = [], 0, 0
    for i in range(3000):
        y, lam2 = _random_case(rng, i)
        top = float(np.max(np.abs(prox.tv_denoise_1d(y, lam2))))
        lam1 = top * float(rng.choice([0.5, 0.9, 0.999, 1.001, 1.5, 3.0])) if i % 4 else top
        want = top <= lam1
        got = bool(k.fused_zero(y, lam1, lam2))
        zeros += want
        if got != want:
            if abs(top - lam1) <= 1e-12 * (1.0 + np.max(np.abs(y))):
                ties += 1
            else:
                wrong.append((i, len(y), lam1, lam2, top))
    assert wrong == []
    assert 1000 < zeros < 2500  # both answers well represented


def test_warm_tv_from_the_true_jumps_is_the_solution():
    """``tv1d_warm`` given the jump signs of Condat's solution returns it (to rounding) and passes
    the optimality certificate; from wrong signs it either declines or still returns the solution:
    it never returns a wrong answer."""
    k = prox._kernels()
    rng = np.random.default_rng(22)
    hits = declined = 0
    for i in range(2000):
        y, lam = _random_case(rng, i)
        if len(y) < 2:
            continue
        x = prox.tv_denoise_1d(y, lam)
        scale = 1.0 + np.max(np.abs(y))
        signs = _jump_signs(x, scale)
        out = np.empty_like(y)
        if k.tv1d_warm(y, lam, signs, out):
            hits += 1
            np.testing.assert_allclose(out, x, rtol=0, atol=1e-9 * scale)
            assert _tv_certificate(y, out, lam) == []
        for _ in range(3):  # perturbed guesses
            bad = signs.copy()
            bad[rng.integers(0, len(bad))] = rng.integers(-1, 2)
            if k.tv1d_warm(y, lam, bad, out):
                assert _tv_certificate(y, out, lam) == [], (i, bad, signs)
            else:
                declined += 1
    assert hits >= 1900 and declined > 500


def test_solver_prox_step_equals_the_fused_prox_across_calls():
    """The FISTA prox step (zero test, warm jump sets kept between calls, Condat on a miss) gives the
    fused-lasso prox of ``Y - step G`` column by column, call after call on drifting inputs."""
    from pgmflow.tasks.tesla import solver

    solver._kernels()
    rng = np.random.default_rng(23)
    T, p = 40, 12
    pen = np.ones(p, bool)
    pen[3] = False
    state = np.zeros((p, T), np.int8)
    Y = np.cumsum(rng.standard_normal((T, p)), axis=0) * 0.1
    G = rng.standard_normal((T, p))
    out = np.empty((T, p))
    for it in range(30):
        Y = Y + 1e-3 * rng.standard_normal((T, p)) if it % 10 else rng.standard_normal((T, p))
        step, l1, l2 = 0.05, 0.02 * (1 + it % 3), 0.05
        solver._prox_step(Y, G, step, l1, l2, pen, out, state, np.empty(T), np.empty(T))
        ref = prox.prox_fused_lasso(Y - step * G, l1, l2, pen)
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
        assert np.array_equal(out == 0.0, ref == 0.0)
