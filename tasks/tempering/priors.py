"""Named priors per coordinate block, on an unconstrained space (the sampler's space).

A prior is a tuple of :class:`PriorBlock` (one named distribution over ``size`` consecutive
coordinates). Each block has a bijection ``theta = T(u)`` from the unconstrained ``u`` to its support,
and its density on ``u`` includes the log-Jacobian, so the prior on ``u`` is normalised:

| name | parameters | support of theta | T(u) | exact draw from z ~ N(0, 1) |
| --- | --- | --- | --- | --- |
| normal | loc, scale | R | u | u = loc + scale z |
| half_normal | scale | (0, inf) | exp(u) | theta = scale abs(z) |
| log_normal | loc, scale | (0, inf) | exp(u) | u = loc + scale z (log theta is normal) |
| uniform | low, high | (low, high) | low + (high - low) sigmoid(u) | theta = low + (high - low) Phi(z) |

So ``log p(u) = log p_theta(T(u)) + log |T'(u)|`` (half-normal: ``log p(e^u) + u``; uniform: the standard
logistic density ``-softplus(u) - softplus(-u)``). The exact sampler is ``from_standard(z)``, a map of
iid standard normals (the explorer's draw at ``b = 0``). Everything is elementwise per row.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy import special

PRIORS = {
    "normal": ("loc", "scale"),
    "half_normal": ("scale",),
    "log_normal": ("loc", "scale"),
    "uniform": ("low", "high"),
}
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class PriorBlock(NamedTuple):
    """One named prior over ``size`` coordinates; parameters are scalars (see the module table)."""

    name: str
    size: int
    loc: float = 0.0
    scale: float = 1.0
    low: float = 0.0
    high: float = 1.0


def _softplus(u):
    return np.logaddexp(0.0, u)


def _block_log_density(b: PriorBlock, u):
    if b.name in ("normal", "log_normal"):
        z = (u - b.loc) / b.scale
        return -0.5 * z * z - math.log(b.scale) - _HALF_LOG_2PI
    if b.name == "half_normal":
        t = np.exp(u)
        return math.log(2.0) - 0.5 * (t / b.scale) ** 2 - math.log(b.scale) - _HALF_LOG_2PI + u
    if b.name == "uniform":
        return -_softplus(u) - _softplus(-u)
    raise ValueError(f"unknown prior {b.name!r}; expected one of {sorted(PRIORS)}")


def _block_grad(b: PriorBlock, u):
    if b.name in ("normal", "log_normal"):
        return -(u - b.loc) / b.scale**2
    if b.name == "half_normal":
        return 1.0 - np.exp(2.0 * u) / b.scale**2
    if b.name == "uniform":
        return 1.0 - 2.0 * special.expit(u)
    raise ValueError(f"unknown prior {b.name!r}")


def _block_from_standard(b: PriorBlock, z):
    if b.name in ("normal", "log_normal"):
        return b.loc + b.scale * z
    if b.name == "half_normal":
        return np.log(b.scale) + np.log(np.abs(z))
    if b.name == "uniform":
        return special.log_ndtr(z) - special.log_ndtr(-z)  # logit(Phi(z))
    raise ValueError(f"unknown prior {b.name!r}")


def _block_transform(b: PriorBlock, u):
    """theta = T(u) and dtheta/du, elementwise."""
    if b.name == "normal":
        return u, np.ones_like(u)
    if b.name in ("half_normal", "log_normal"):
        t = np.exp(u)
        return t, t
    if b.name == "uniform":
        s = special.expit(u)
        return b.low + (b.high - b.low) * s, (b.high - b.low) * s * (1.0 - s)
    raise ValueError(f"unknown prior {b.name!r}")


class PriorReference(NamedTuple):
    """The prior on the unconstrained space as a normalised reference: blocks: tuple of PriorBlock."""

    blocks: tuple

    @property
    def dim(self) -> int:
        return int(sum(b.size for b in self.blocks))

    def _slices(self):
        start = 0
        for b in self.blocks:
            yield b, slice(start, start + b.size)
            start += b.size

    def log_density(self, u: np.ndarray) -> np.ndarray:
        """u [n, d] -> [n]."""
        return np.sum(np.concatenate([_block_log_density(b, u[:, s]) for b, s in self._slices()], axis=1), axis=1)

    def grad_log_density(self, u: np.ndarray) -> np.ndarray:
        return np.concatenate([_block_grad(b, u[:, s]) for b, s in self._slices()], axis=1)

    def from_standard(self, z: np.ndarray) -> np.ndarray:
        return np.concatenate([_block_from_standard(b, z[:, s]) for b, s in self._slices()], axis=1)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.from_standard(rng.standard_normal((n, self.dim)))

    def transform(self, u: np.ndarray):
        """(theta [n, d], dtheta/du [n, d]): the constrained parameters and the bijection's derivative."""
        parts = [_block_transform(b, u[:, s]) for b, s in self._slices()]
        return np.concatenate([p[0] for p in parts], axis=1), np.concatenate([p[1] for p in parts], axis=1)
