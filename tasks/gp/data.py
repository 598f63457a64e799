"""Synthetic regression data for the GP workload, and the standardisation recorded with a model.

Generators draw from ``pgmflow.tasks.rng.generator(seed, STAGE_GP, GP_STREAM_DATA, part)``: the same
``(seed, part)`` gives the same rows wherever it runs; a large data set can be made as several
parts (one task each), concatenated in part order.

* :func:`friedman1` -- Friedman (1991) #1, written out: ``x ~ U(0, 1)^d`` (``d >= 5``; the extra
  dimensions are irrelevant) and
  ``y = 10 sin(pi x1 x2) + 20 (x3 - 1/2)^2 + 10 x4 + 5 x5 + noise_std * N(0, 1)``.
* :func:`sine_1d` -- ``x ~ U(0, 1)``, ``y = sin(3 pi x) + 0.3 cos(9 pi x) + noise_std * N(0, 1)``.

:class:`Standardizer` holds the column means and standard deviations of ``X`` and the mean and
standard deviation of ``y``; models are fitted on standardised data and their predictions mapped
back with :meth:`Standardizer.invert_mean` and :meth:`Standardizer.invert_var`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pgmflow.tasks import rng as trng

__all__ = ["GP_STREAM_DATA", "Standardizer", "friedman1", "friedman1_mean", "sine_1d", "sine_1d_mean"]

GP_STREAM_DATA = 0  # first identity element under rng.STAGE_GP: synthetic data (then: part)


def friedman1_mean(X) -> np.ndarray:
    """The noiseless Friedman #1 function of the first five columns of ``X`` [n, d >= 5]: [n]."""
    X = np.asarray(X, dtype=np.float64)
    return 10.0 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20.0 * (X[:, 2] - 0.5) ** 2 + 10.0 * X[:, 3] + 5.0 * X[:, 4]


def friedman1(seed: int, n: int, d: int = 10, noise_std: float = 1.0, part: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(X [n, d], y [n])`` of Friedman #1 (see the module docstring); ``d >= 5``."""
    if int(d) < 5:
        raise ValueError(f"friedman1 needs d >= 5; got d={d}")
    if int(n) < 0 or noise_std < 0:
        raise ValueError(f"n and noise_std must be >= 0; got n={n}, noise_std={noise_std}")
    g = trng.generator(seed, trng.STAGE_GP, GP_STREAM_DATA, int(part))
    X = g.random((int(n), int(d)))
    y = friedman1_mean(X) + noise_std * g.standard_normal(int(n))
    return X, y


def sine_1d_mean(X) -> np.ndarray:
    """``sin(3 pi x) + 0.3 cos(9 pi x)`` of the single column of ``X`` [n, 1]: [n]."""
    x = np.asarray(X, dtype=np.float64)[:, 0]
    return np.sin(3.0 * np.pi * x) + 0.3 * np.cos(9.0 * np.pi * x)


def sine_1d(seed: int, n: int, noise_std: float = 0.1, part: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(X [n, 1], y [n])`` of the 1-D sine data (see the module docstring)."""
    if int(n) < 0 or noise_std < 0:
        raise ValueError(f"n and noise_std must be >= 0; got n={n}, noise_std={noise_std}")
    g = trng.generator(seed, trng.STAGE_GP, GP_STREAM_DATA, int(part))
    X = g.random((int(n), 1))
    return X, sine_1d_mean(X) + noise_std * g.standard_normal(int(n))


class Standardizer(NamedTuple):
    """Affine standardisation of inputs and targets, recorded with a model.

    x_mean: float64 [d], column means of the training ``X``.
    x_std: float64 [d], column standard deviations (1 where a column is constant).
    y_mean: float, mean of the training ``y``.
    y_std: float, standard deviation of ``y`` (1 when ``y`` is constant).
    """

    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: float
    y_std: float

    @classmethod
    def fit(cls, X, y) -> Standardizer:
        """Means and standard deviations (ddof 0) of ``X`` [n, d] and ``y`` [n]."""
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if X.ndim != 2 or y.shape != (X.shape[0],) or X.shape[0] < 1:
            raise ValueError(f"need X [n, d] and y [n] with n >= 1; got {X.shape}, {y.shape}")
        xs = X.std(axis=0)
        ys = float(y.std())
        return cls(X.mean(axis=0), np.where(xs > 0, xs, 1.0), float(y.mean()), ys if ys > 0 else 1.0)

    def apply_X(self, X) -> np.ndarray:
        """``(X - x_mean) / x_std``."""
        return (np.asarray(X, dtype=np.float64) - self.x_mean) / self.x_std

    def apply_y(self, y) -> np.ndarray:
        """``(y - y_mean) / y_std``."""
        return (np.asarray(y, dtype=np.float64) - self.y_mean) / self.y_std

    def apply(self, X, y) -> tuple[np.ndarray, np.ndarray]:
        """``(apply_X(X), apply_y(y))``."""
        return self.apply_X(X), self.apply_y(y)

    def invert_X(self, Xs) -> np.ndarray:
        """Standardised inputs back to original units."""
        return np.asarray(Xs, dtype=np.float64) * self.x_std + self.x_mean

    def invert_mean(self, mean) -> np.ndarray:
        """A predictive mean (or standardised ``y``) back to original units."""
        return np.asarray(mean, dtype=np.float64) * self.y_std + self.y_mean

    def invert_var(self, var) -> np.ndarray:
        """A predictive variance (or covariance) back to original units (times ``y_std^2``)."""
        return np.asarray(var, dtype=np.float64) * self.y_std**2

    def to_dict(self) -> dict:
        """Plain lists and floats (for a JSON or MLflow record); :meth:`from_dict` inverts it."""
        return {
            "x_mean": [float(v) for v in self.x_mean],
            "x_std": [float(v) for v in self.x_std],
            "y_mean": float(self.y_mean),
            "y_std": float(self.y_std),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Standardizer:
        """Inverse of :meth:`to_dict`."""
        return cls(
            np.asarray(d["x_mean"], dtype=np.float64),
            np.asarray(d["x_std"], dtype=np.float64),
            float(d["y_mean"]),
            float(d["y_std"]),
        )


# --- the held-out split: a pure function of the row index, so any chunking of the rows agrees --------

GP_STREAM_SPLIT = 3  # identity element under rng.STAGE_GP for the held-out split (0-2: pgmflow.tasks.gp)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def split_key(seed: int) -> int:
    """The 64-bit key of the held-out split of ``seed``."""
    return int(trng.seed_sequence(seed, trng.STAGE_GP, GP_STREAM_SPLIT).generate_state(1, dtype=np.uint64)[0])


def heldout_rows(key: int, start: int, stop: int, fraction: float) -> np.ndarray:
    """bool [stop - start]: which of rows ``start .. stop - 1`` are held out (a pure function of the
    row index, so any chunking of the rows agrees)."""
    n = max(0, int(stop) - int(start))
    if fraction <= 0 or n == 0:
        return np.zeros(n, dtype=bool)
    z = np.arange(int(start) + 1, int(stop) + 1, dtype=np.uint64)
    z *= _GOLDEN
    z += np.uint64(key)
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    u = (z >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)  # [0, 1), 53 bits
    return u < float(fraction)


def open_npy(path: str):
    """The memory-mapped array of an ``.npy`` file (read-only)."""
    return np.load(path, mmap_mode="r", allow_pickle=False)
