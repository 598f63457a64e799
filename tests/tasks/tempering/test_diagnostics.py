"""Known-answer and calibrated tests of pgmflow.tasks.tempering.diagnostics."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.signal

from pgmflow.tasks.tempering import diagnostics as D


def ar1(rng, rho, shape):
    """Stationary AR(1) with unit marginal variance along the last axis: float [*shape]."""
    eps = rng.standard_normal(shape)
    eps[..., 0] /= np.sqrt(1 - rho**2)  # start in the stationary law
    return scipy.signal.lfilter([np.sqrt(1 - rho**2)], [1.0, -rho], eps, axis=-1)


# ---------------------------------------------------------------- autocorrelation


def test_autocorrelation_known_answer():
    # x = 1..4: mean 2.5, biased autocovariances c_t = (1.25, 0.3125, -0.375, -0.5625)
    rho = D.autocorrelation(np.array([1.0, 2.0, 3.0, 4.0]))
    np.testing.assert_allclose(rho, [1.0, 0.25, -0.3, -0.45], atol=1e-14)


def test_autocorrelation_matches_direct_sum_and_shapes():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 2, 57))
    rho = D.autocorrelation(x, max_lag=10)
    assert rho.shape == (3, 2, 11)
    xc = x - x.mean(-1, keepdims=True)
    T = x.shape[-1]
    direct = np.stack([np.sum(xc[..., : T - t] * xc[..., t:], -1) for t in range(11)], -1)
    np.testing.assert_allclose(rho, direct / direct[..., :1], atol=1e-12)


def test_autocorrelation_ar1_decays_geometrically():
    rho = D.autocorrelation(ar1(np.random.default_rng(2), 0.7, (200_000,)), max_lag=3)
    np.testing.assert_allclose(rho, 0.7 ** np.arange(4), atol=0.02)


def test_autocorrelation_constant_and_nan():
    rho = D.autocorrelation(np.full((2, 7), 0.1))
    np.testing.assert_array_equal(rho, np.tile([1.0, 0, 0, 0, 0, 0, 0], (2, 1)))
    x = np.arange(6.0)
    x[3] = np.nan
    assert np.all(np.isnan(D.autocorrelation(x)))
    with pytest.raises(ValueError, match="max_lag"):
        D.autocorrelation(np.arange(5.0), max_lag=5)


# ---------------------------------------------------------------- ESS


@pytest.mark.parametrize("rho", [0.5, 0.9])
def test_ess_ar1_matches_theory(rho):
    T = 100_000
    x = ar1(np.random.default_rng(int(rho * 10)), rho, (4, T))
    ratio = D.effective_sample_size(x) / T
    expected = (1 - rho) / (1 + rho)
    assert ratio.shape == (4,)
    np.testing.assert_allclose(ratio, expected, rtol=0.15)
    np.testing.assert_allclose(D.integrated_autocorrelation_time(x), 1 / ratio, rtol=1e-12)


def test_ess_iid_close_to_T():
    T = 20_000
    x = np.random.default_rng(3).standard_normal((5, T))
    np.testing.assert_allclose(D.effective_sample_size(x) / T, 1.0, rtol=0.15)


def test_ess_constant_is_T_and_nan_propagates():
    np.testing.assert_array_equal(D.effective_sample_size(np.full((3, 50), -2.3)), 50.0)
    assert D.effective_sample_size(np.ones(1)) == 1.0
    x = np.random.default_rng(0).standard_normal((2, 30))
    x[1, 4] = np.nan
    ess = D.effective_sample_size(x)
    assert np.isfinite(ess[0]) and np.isnan(ess[1])


def test_ess_antithetic_is_capped():
    T = 1000
    x = np.tile([1.0, -1.0], T // 2)  # tau -> 0; ESS would be unbounded without the cap
    assert D.effective_sample_size(x) == pytest.approx(T * np.log10(T))
    # negatively correlated AR(1): ESS > T but below the cap
    ess = D.effective_sample_size(ar1(np.random.default_rng(5), -0.5, (50_000,)))
    assert ess / 50_000 == pytest.approx(3.0, rel=0.15)


# ---------------------------------------------------------------- split R-hat


def test_split_rhat_known_answer():
    chains = np.arange(8.0).reshape(2, 4)
    # halves [0,1],[2,3],[4,5],[6,7]: W = 0.5, B/n = 20/3, var+ = 0.25 + 20/3
    assert D.split_rhat(chains) == pytest.approx(np.sqrt((0.25 + 20 / 3) / 0.5), rel=1e-14)
    # odd T drops the middle draw
    np.testing.assert_allclose(D.split_rhat(np.array([[0, 1, 99, 2, 3.0]])), D.split_rhat(np.array([[0, 1, 2, 3.0]])))


def test_split_rhat_iid_near_one():
    rng = np.random.default_rng(6)
    chains = rng.standard_normal((3, 4, 4000))
    for rank in (False, True):
        r = D.split_rhat(chains, rank_normalize=rank)
        assert r.shape == (3,)
        assert np.all(r < 1.02) and np.all(r > 0.99)


def test_split_rhat_detects_shifted_means_and_trends():
    rng = np.random.default_rng(7)
    chains = rng.standard_normal((4, 1000)) + np.array([0.0, 0.0, 1.0, 1.0])[:, None]
    assert D.split_rhat(chains) > 1.1
    assert D.split_rhat(chains, rank_normalize=True) > 1.1
    # a single chain with a drift is caught by the split
    one = rng.standard_normal((1, 1000)) + np.linspace(0.0, 3.0, 1000)
    assert D.split_rhat(one) > 1.1


def test_split_rhat_rank_normalized_detects_scale_difference():
    rng = np.random.default_rng(8)
    chains = rng.standard_normal((4, 2000)) * np.array([1.0, 1.0, 3.0, 3.0])[:, None]
    assert D.split_rhat(chains) < 1.05  # same mean: the classic statistic misses it
    assert D.split_rhat(chains, rank_normalize=True) > 1.1  # the folded (tail) part does not


def test_split_rhat_edge_cases():
    assert np.isnan(D.split_rhat(np.zeros((2, 3))))
    assert D.split_rhat(np.ones((2, 10))) == 1.0
    assert D.split_rhat(np.array([[1.0] * 6, [2.0] * 6])) == np.inf
    x = np.random.default_rng(0).standard_normal((2, 2, 10))
    x[1, 0, 0] = np.nan
    r = D.split_rhat(x, rank_normalize=True)
    assert np.isfinite(r[0]) and np.isnan(r[1])
    with pytest.raises(ValueError):
        D.split_rhat(np.zeros(10))


# ---------------------------------------------------------------- round trips


def reference_round_trips(levels, K, phase=None, trips=None):
    """Plain loop over scans, the definition the vectorised code must match."""
    T, R = levels.shape
    phase = np.zeros(R, int) if phase is None else phase.copy()
    trips = np.zeros(R, int) if trips is None else trips.copy()
    for t in range(T):
        for r in range(R):
            lv = levels[t, r]
            if lv == 0:
                if phase[r] == 2:
                    trips[r] += 1
                phase[r] = 1
            elif lv == K - 1 and phase[r] == 1:
                phase[r] = 2
    return phase, trips


def test_round_trips_hand_built():
    K = 3
    levels = np.array(
        [
            [0, 2, 1, 0],
            [1, 1, 2, 0],
            [2, 0, 1, 0],
            [1, 1, 0, 0],
            [0, 2, 1, 0],
            [0, 1, 2, 0],
            [2, 0, 0, 0],
            [0, 1, 1, 0],
        ]
    )
    # replica 0: 0 ->2 ->0 (trip) ->0 ->2 ->0 (trip): 2 trips, ends in phase 1
    # replica 1: top before any bottom ignored; 0 ->2 ->0 (trip): 1 trip, ends going up (phase 1)
    # replica 2: 1, 2 (ignored: no bottom yet), 1, 0, 1, 2, 0 (trip), 1: 1 trip, phase 1
    # replica 3: never leaves the bottom: 0 trips, phase 1
    state = D.round_trip_update(D.round_trip_init(4), levels, K)
    np.testing.assert_array_equal(state.trips, [2, 1, 1, 0])
    np.testing.assert_array_equal(state.phase, [1, 1, 1, 1])
    assert state.trips.dtype == np.int64 and state.phase.dtype == np.int64

    s = D.round_trip_update(D.round_trip_init(1), np.array([[0], [1], [2]]), K)
    np.testing.assert_array_equal(s.phase, [2])  # reached the top, on the way down
    np.testing.assert_array_equal(s.trips, [0])
    s = D.round_trip_update(D.round_trip_init(1), np.array([[2], [1]]), K)
    np.testing.assert_array_equal(s.phase, [0])  # never at the bottom yet


def test_round_trips_chunked_equals_whole_and_reference():
    rng = np.random.default_rng(9)
    K, T, R = 5, 3000, 7
    steps = rng.choice([-1, 1], size=(T, R))
    levels = np.empty((T, R), dtype=np.int64)
    cur = rng.integers(0, K, size=R)
    for t in range(T):  # reflected random walk on 0..K-1
        cur = np.clip(cur + steps[t], 0, K - 1)
        levels[t] = cur
    whole = D.round_trip_update(D.round_trip_init(R), levels, K)
    ref_phase, ref_trips = reference_round_trips(levels, K)
    np.testing.assert_array_equal(whole.trips, ref_trips)
    np.testing.assert_array_equal(whole.phase, ref_phase)
    assert whole.trips.sum() > 50  # the test exercises many trips

    cuts = np.sort(rng.choice(np.arange(1, T), size=12, replace=False))
    bounds = sorted([0, 0, *cuts.tolist(), int(cuts[4]), T])  # includes two empty chunks
    state = D.round_trip_init(R)
    for a, b in zip(bounds[:-1], bounds[1:]):
        state = D.round_trip_update(state, levels[a:b], K)
    np.testing.assert_array_equal(state.trips, whole.trips)
    np.testing.assert_array_equal(state.phase, whole.phase)

    # one scan at a time, too
    state = D.round_trip_init(R)
    for t in range(200):
        state = D.round_trip_update(state, levels[t : t + 1], K)
    np.testing.assert_array_equal(state.trips, D.round_trip_update(D.round_trip_init(R), levels[:200], K).trips)


def test_round_trip_update_is_pure_and_validates():
    state = D.round_trip_init(2)
    before = (state.phase.copy(), state.trips.copy())
    new = D.round_trip_update(state, np.array([[0, 0], [1, 1], [0, 1]]), 2)
    np.testing.assert_array_equal(state.phase, before[0])
    np.testing.assert_array_equal(state.trips, before[1])
    np.testing.assert_array_equal(new.trips, [1, 0])
    with pytest.raises(ValueError, match="level_trace"):
        D.round_trip_update(state, np.array([[0, 3]]), 3)
    with pytest.raises(ValueError, match="shape"):
        D.round_trip_update(state, np.array([0, 1]), 3)
    with pytest.raises(ValueError, match="n_levels"):
        D.round_trip_update(state, np.array([[0, 0]]), 1)


# ---------------------------------------------------------------- swap statistics


def test_swap_rejection_from_acceptance_ignores_nan():
    nan = np.nan
    accept = np.array(
        [
            [0.2, nan, 1.0],
            [nan, 0.5, nan],
            [0.4, nan, 0.0],
            [nan, 0.7, nan],
        ]
    )
    np.testing.assert_allclose(D.swap_rejection_from_acceptance(accept), [0.7, 0.4, 0.5])
    never = D.swap_rejection_from_acceptance(np.array([[0.5, nan], [0.5, nan]]))
    assert never[0] == 0.5 and np.isnan(never[1])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        D.swap_rejection_from_acceptance(np.array([[1.5, 0.2]]))
