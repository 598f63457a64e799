"""Known-answer tests of pgmflow.tasks.tempering.schedule (Syed et al. 2021 schedule adaptation)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.interpolate

from pgmflow.tasks.tempering import schedule as S


def fitted_barrier(betas, rejection):
    """The interpolant adapt_schedule inverts: PCHIP through (b_k, cumulative_k), floored."""
    cum = np.concatenate([[0.0], np.cumsum(np.maximum(rejection, S.REJECTION_FLOOR))])
    return scipy.interpolate.PchipInterpolator(betas, cum)


# ---------------------------------------------------------------- initial schedules


def test_initial_schedule_linear_and_power():
    b = S.initial_schedule(5)
    assert b.dtype == np.float64
    np.testing.assert_array_equal(b, [0.0, 0.25, 0.5, 0.75, 1.0])
    p = S.initial_schedule(5, kind="power", power=2.0)
    np.testing.assert_allclose(p, [0.0, 1 / 16, 1 / 4, 9 / 16, 1.0], rtol=1e-15)
    for K in (2, 3, 17, 100):
        for kind in ("linear", "power"):
            b = S.initial_schedule(K, kind=kind)
            assert b.shape == (K,) and b[0] == 0.0 and b[-1] == 1.0
            assert np.all(np.diff(b) > 0)


def test_initial_schedule_rejects_bad_input():
    with pytest.raises(ValueError, match="n_levels"):
        S.initial_schedule(1)
    with pytest.raises(ValueError, match="kind"):
        S.initial_schedule(4, kind="geometric")
    with pytest.raises(ValueError, match="power"):
        S.initial_schedule(4, kind="power", power=-1.0)
    with pytest.raises(ValueError, match="strictly increasing"):
        S.initial_schedule(10_000, kind="power", power=400.0)


# ---------------------------------------------------------------- communication barrier


def test_communication_barrier_known_answer():
    Lam, cum = S.communication_barrier([0.0, 0.3, 0.5, 1.0], [0.25, 0.0, 0.5])
    assert Lam == 0.75
    np.testing.assert_array_equal(cum, [0.0, 0.25, 0.25, 0.75])


def test_communication_barrier_validates():
    with pytest.raises(ValueError, match="NaN"):
        S.communication_barrier([0.0, 0.5, 1.0], [0.1, np.nan])
    with pytest.raises(ValueError, match="shape"):
        S.communication_barrier([0.0, 0.5, 1.0], [0.1])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        S.communication_barrier([0.0, 0.5, 1.0], [0.1, 1.2])
    with pytest.raises(ValueError, match="strictly increasing"):
        S.communication_barrier([0.0, 0.5, 0.5, 1.0], [0.1, 0.1, 0.1])


# ---------------------------------------------------------------- adaptation


def test_adapted_ladder_has_equal_increments_under_the_fitted_barrier():
    betas = S.initial_schedule(9)
    rejection = np.array([0.9, 0.6, 0.3, 0.2, 0.1, 0.08, 0.05, 0.02])
    for n in (5, 9, 20):
        new = S.adapt_schedule(betas, rejection, n_levels=n)
        assert new.shape == (n,) and new[0] == 0.0 and new[-1] == 1.0
        assert np.all(np.diff(new) > 0)
        inc = np.diff(fitted_barrier(betas, rejection)(new))
        np.testing.assert_allclose(inc, rejection.sum() / (n - 1), rtol=1e-9)
    # levels move towards b = 0, where the barrier is concentrated
    assert S.adapt_schedule(betas, rejection)[1] < betas[1] / 2


def test_adapted_ladder_recovers_a_known_barrier():
    # true cumulative barrier Lambda(b) = 4 * (1 - exp(-6 b)) / (1 - exp(-6)); its rejection
    # rates on a fine linear ladder are its increments; the optimal ladder is its exact inverse.
    def Lam(b):
        return 4.0 * (1 - np.exp(-6 * b)) / (1 - np.exp(-6))

    def Lam_inv(y):
        return -np.log(1 - y * (1 - np.exp(-6)) / 4.0) / 6

    fine = S.initial_schedule(41)
    rejection = np.diff(Lam(fine))
    new = S.adapt_schedule(fine, rejection, n_levels=9)
    exact = Lam_inv(4.0 * np.arange(9) / 8)
    np.testing.assert_allclose(new, exact, atol=2e-4)
    true_rejection = np.diff(Lam(new))
    np.testing.assert_allclose(true_rejection, 0.5, rtol=2e-3)  # equalised


def test_adapt_is_idempotent_on_equal_rejections():
    for betas in (S.initial_schedule(12), S.initial_schedule(7, kind="power", power=3.0)):
        K = betas.shape[0]
        for r in (0.37, 1e-3, 0.0):
            new = S.adapt_schedule(betas, np.full(K - 1, r))
            np.testing.assert_allclose(new, betas, atol=1e-12, rtol=0)


def test_adapt_handles_zero_rejection_segments():
    betas = S.initial_schedule(6)
    rejection = np.array([0.1, 0.5, 0.0, 0.0, 0.3])
    new = S.adapt_schedule(betas, rejection, n_levels=8)
    assert new[0] == 0.0 and new[-1] == 1.0 and np.all(np.diff(new) > 0)
    assert np.all(np.isfinite(new))
    # nothing to gain on [0.4, 0.8], where no swap is rejected: no level lands strictly inside
    inside = (new > 0.4 + 1e-6) & (new < 0.8 - 1e-6)
    assert not np.any(inside)


def test_adapt_is_deterministic_and_does_not_modify_inputs():
    betas = S.initial_schedule(10, kind="power", power=2.0)
    rejection = np.random.default_rng(0).uniform(0.0, 0.8, size=9)
    b0, r0 = betas.copy(), rejection.copy()
    a = S.adapt_schedule(betas, rejection, n_levels=13)
    b = S.adapt_schedule(betas.copy(), rejection.copy(), n_levels=13)
    assert a.tobytes() == b.tobytes()
    np.testing.assert_array_equal(betas, b0)
    np.testing.assert_array_equal(rejection, r0)


def test_adapt_validates():
    betas = S.initial_schedule(4)
    with pytest.raises(ValueError, match="NaN"):
        S.adapt_schedule(betas, [0.1, np.nan, 0.2])
    with pytest.raises(ValueError, match="exactly 0"):
        S.adapt_schedule([0.1, 0.5, 1.0], [0.1, 0.2])
    with pytest.raises(ValueError, match="n_levels"):
        S.adapt_schedule(betas, [0.1, 0.1, 0.2], n_levels=1)
    np.testing.assert_array_equal(S.adapt_schedule(betas, [0.1, 0.1, 0.2], n_levels=2), [0, 1])


# ---------------------------------------------------------------- helpers


def test_optimal_n_levels_and_round_trip_rate():
    assert S.optimal_n_levels(0.0) == 2
    assert S.optimal_n_levels(0.2) == 2
    assert S.optimal_n_levels(3.0) == 7
    assert S.optimal_n_levels(3.1) == 8
    with pytest.raises(ValueError):
        S.optimal_n_levels(np.nan)
    assert S.round_trip_rate([0.0, 0.0]) == 0.5
    assert S.round_trip_rate([0.5, 0.5]) == pytest.approx(1 / 6)
    assert S.round_trip_rate([0.2, 1.0]) == 0.0
