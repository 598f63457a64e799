"""Two-leg (stabilized) chains: the split of the levels between the legs, and round trips / tempered
restarts counted as Pigeons.jl counts them (either end of the chain is a reference; the target is
where the legs join)."""

from __future__ import annotations

import numpy as np
import pytest

from pgmflow.tasks.tempering import diagnostics as D
from pgmflow.tasks.tempering import variational as V
from pgmflow.tempering import reference as ref_mod


def pigeons_counts(levels, ends):
    """Plain loop: Pigeons.jl's RoundTripRecorder state machine, replica by replica, scan by scan."""
    T, R = levels.shape
    state, trips, restarts = np.zeros(R, int), np.zeros(R, int), np.zeros(R, int)
    for t in range(T):
        for r in range(R):
            is_ref, is_target = ends[levels[t, r]] == 0, ends[levels[t, r]] == 1
            if state[r] == 0 and is_ref:
                state[r] = 1
            elif state[r] == 1 and is_target:
                state[r], restarts[r] = 2, restarts[r] + 1
            elif state[r] == 2 and is_ref:
                state[r], trips[r] = 1, trips[r] + 1
    return state, trips, restarts


def test_round_trip_ends_of_one_and_two_legs():
    np.testing.assert_array_equal(V.round_trip_ends(np.zeros(5, dtype=np.int64)), [0, -1, -1, -1, 1])
    # fixed leg: levels 0..2 (reference 0, target 2); variational leg: levels 3..6 (target 3, reference 6)
    np.testing.assert_array_equal(V.round_trip_ends(V.leg_sizes_to_legs(3, 4)), [0, -1, 1, 1, -1, -1, 0])
    np.testing.assert_array_equal(V.round_trip_ends(V.leg_sizes_to_legs(2, 2)), [0, 1, 1, 0])
    with pytest.raises(ValueError, match="both a reference and a target"):
        D.end_levels(3, references=(0,), targets=(0, 2))


def test_fixed_ref_to_target_to_variational_ref_is_a_round_trip():
    ends = V.round_trip_ends(V.leg_sizes_to_legs(3, 3))  # [0, -1, 1, 1, -1, 0]
    walk = np.array([[0], [1], [2], [3], [4], [5], [4], [3], [2], [1], [0]])
    s = D.round_trip_update(D.round_trip_init(1), walk, 6, ends)
    # 0 (ref) -> 2 (target: restart) -> 5 (the other ref: trip) -> 3 (restart) -> 0 (trip)
    np.testing.assert_array_equal(s.trips, [2])
    np.testing.assert_array_equal(s.restarts, [2])
    # end to end (the old count) this walk is one trip 0 -> 5 -> 0
    np.testing.assert_array_equal(D.round_trip_update(D.round_trip_init(1), walk, 6).trips, [1])
    # a replica that only goes up and down the variational leg makes round trips too
    s = D.round_trip_update(D.round_trip_init(1), np.array([[5], [4], [3], [4], [5], [4], [3]]), 6, ends)
    np.testing.assert_array_equal((s.trips, s.restarts, s.phase), ([1], [2], [2]))


@pytest.mark.parametrize("k0,k1", [(2, 2), (5, 3), (3, 6)])
def test_streaming_counts_match_the_state_machine(k0, k1):
    rng = np.random.default_rng(k0 * 10 + k1)
    K, T, R = k0 + k1, 2500, 6
    ends = V.round_trip_ends(V.leg_sizes_to_legs(k0, k1))
    levels = np.empty((T, R), dtype=np.int64)
    cur = rng.integers(0, K, size=R)
    for t in range(T):  # reflected random walk on 0..K-1
        cur = np.clip(cur + rng.choice([-1, 1], size=R), 0, K - 1)
        levels[t] = cur
    phase, trips, restarts = pigeons_counts(levels, ends)
    whole = D.round_trip_update(D.round_trip_init(R), levels, K, ends)
    np.testing.assert_array_equal(whole.trips, trips)
    np.testing.assert_array_equal(whole.restarts, restarts)
    np.testing.assert_array_equal(whole.phase, phase)
    assert trips.sum() > 30 and np.all((whole.trips <= whole.restarts) & (whole.restarts <= whole.trips + 1))
    state = D.round_trip_init(R)
    for a, b in zip([0, 7, 7, 900, 1801], [7, 7, 900, 1801, T]):  # chunked, with an empty chunk
        state = D.round_trip_update(state, levels[a:b], K, ends)
    for got, want in zip(state, whole):
        np.testing.assert_array_equal(got, want)


def test_split_follows_the_barriers():
    # equal rejection along the joined path: (K0 - 1) : (K1 - 1) = Λ0 : Λ1 over N - 2 pairs
    assert V.stabilized_split([3.0, 3.0], 16) == (8, 8)
    assert V.stabilized_split([6.0, 1.0], 16) == (13, 3)  # 14 * 6/7 = 12 pairs for the fixed leg
    assert V.stabilized_split([11.0, 0.2], 16) == (14, 2)  # the variational leg keeps its 2 levels
    assert V.stabilized_split([0.1, 9.0], 10) == (2, 8)
    assert V.stabilized_split([0.0, 0.0], 6) == (3, 3)
    with pytest.raises(ValueError, match="n_levels >= 4"):
        V.stabilized_split([1.0, 1.0], 3)


def test_adapt_reshares_levels_and_keeps_both_ladders_valid():
    legs = V.leg_sizes_to_legs(6, 6)
    betas = V.stabilized_betas(np.linspace(0, 1, 6), np.linspace(0, 1, 6))
    # fixed leg rejects 0.8 per pair (Λ0 = 4), variational leg 0.1 (Λ1 = 0.5); the join never rejects
    rej = np.where(legs[:-1] == 0, 0.8, 0.1)
    rej[5] = 0.0
    new_b, new_legs = ref_mod.adapt(betas, legs, rej, "adaptive")
    k0, k1 = V.stabilized_split([4.0, 0.5], 12)
    assert (k0, k1) == (10, 2)
    np.testing.assert_array_equal(new_legs, V.leg_sizes_to_legs(k0, k1))
    fixed, var = new_b[:k0], new_b[k0:][::-1]
    for b in (fixed, var):
        assert b[0] == 0.0 and b[-1] == 1.0 and np.all(np.diff(b) > 0)
    same_b, same_legs = ref_mod.adapt(betas, legs, rej, "half")
    np.testing.assert_array_equal(same_legs, legs)
    assert same_b.shape == betas.shape
    one_b, one_legs = ref_mod.adapt(np.linspace(0, 1, 5), None, np.full(4, 0.3))
    assert one_legs is None and one_b.shape == (5,)
