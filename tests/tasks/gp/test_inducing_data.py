"""k-means++ inducing inputs, the synthetic generators and the standardiser."""

import numpy as np
import pytest

from pgmflow.tasks import rng as trng
from pgmflow.tasks.gp import data, inducing


def _gen(seed=0):
    return trng.generator(seed, trng.STAGE_GP, inducing.GP_STREAM_INDUCING)


def test_kmeans_pp_shapes_determinism_and_distinct_rows():
    X, _ = data.friedman1(1, 3000, d=6)
    Z = inducing.kmeans_pp(_gen(), X, 40, n_iter=5, max_points=1000)
    assert Z.shape == (40, 6) and Z.dtype == np.float64
    assert np.unique(Z, axis=0).shape[0] == 40
    np.testing.assert_array_equal(Z, inducing.kmeans_pp(_gen(), X, 40, n_iter=5, max_points=1000))
    assert not np.array_equal(Z, inducing.kmeans_pp(_gen(1), X, 40, n_iter=5, max_points=1000))
    assert np.all(Z >= 0) and np.all(Z <= 1)  # means of rows of U(0,1)^d stay inside the cube


def test_kmeans_pp_seeds_are_rows_and_lloyd_lowers_the_distortion():
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((5, 2)) * 10
    X = np.repeat(centres, 50, axis=0) + 0.1 * rng.standard_normal((250, 2))
    seeds = inducing.kmeans_pp(_gen(), X, 5, n_iter=0)
    assert all(np.any(np.all(X == z, axis=1)) for z in seeds)  # n_iter=0: the k-means++ seeds themselves
    Z = inducing.kmeans_pp(_gen(), X, 5, n_iter=20)

    def distortion(C):
        return np.sum(np.min(((X[:, None, :] - C[None]) ** 2).sum(-1), axis=1))

    assert distortion(Z) <= distortion(seeds)
    # well separated clusters: one inducing input per cluster, at its mean
    nearest = np.argmin(((Z[:, None, :] - centres[None]) ** 2).sum(-1), axis=1)
    assert sorted(nearest) == [0, 1, 2, 3, 4]


def test_kmeans_pp_refuses_more_inducing_inputs_than_distinct_rows():
    X = np.repeat(np.arange(4.0)[:, None], 10, axis=0)  # 4 distinct rows
    assert inducing.kmeans_pp(_gen(), X, 4).shape == (4, 1)
    with pytest.raises(ValueError, match="4 distinct rows"):
        inducing.kmeans_pp(_gen(), X, 5)
    with pytest.raises(ValueError, match="NaN"):
        inducing.kmeans_pp(_gen(), np.array([[np.nan], [1.0]]), 1)


def test_friedman1_follows_the_formula_and_the_seed():
    X, y = data.friedman1(5, 200, d=7, noise_std=0.0)
    assert X.shape == (200, 7) and y.shape == (200,)
    want = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - 0.5) ** 2 + 10 * X[:, 3] + 5 * X[:, 4]
    np.testing.assert_allclose(y, want, rtol=1e-14)
    X1, y1 = data.friedman1(5, 200, d=7, noise_std=1.0)
    np.testing.assert_array_equal(X1, X)
    assert 0.8 < np.std(y1 - want) < 1.2
    X2, _ = data.friedman1(5, 200, d=7, part=1)
    assert not np.array_equal(X2, X)
    with pytest.raises(ValueError, match="d >= 5"):
        data.friedman1(5, 10, d=4)
    Xs, ys = data.sine_1d(0, 50, noise_std=0.0)
    assert Xs.shape == (50, 1)
    np.testing.assert_allclose(ys, np.sin(3 * np.pi * Xs[:, 0]) + 0.3 * np.cos(9 * np.pi * Xs[:, 0]))


def test_standardizer_round_trips_and_records():
    X, y = data.friedman1(2, 100, d=5)
    X[:, 3] = 2.0  # a constant column keeps std 1
    s = data.Standardizer.fit(X, y)
    Xs, ys = s.apply(X, y)
    np.testing.assert_allclose(Xs[:, [0, 1, 2, 4]].mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(Xs[:, [0, 1, 2, 4]].std(0), 1, rtol=1e-12)
    assert s.x_std[3] == 1.0 and np.all(Xs[:, 3] == 0)
    np.testing.assert_allclose(s.invert_X(Xs), X, rtol=1e-13)
    np.testing.assert_allclose(s.invert_mean(ys), y, rtol=1e-13)
    np.testing.assert_allclose(s.invert_var(np.ones(3)), np.full(3, np.std(y) ** 2), rtol=1e-13)
    s2 = data.Standardizer.from_dict(s.to_dict())
    np.testing.assert_array_equal(s2.x_mean, s.x_mean)
    assert s2.y_std == s.y_std
