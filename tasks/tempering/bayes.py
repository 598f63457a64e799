"""A Bayesian model as a tempering target: the path prior x likelihood^b, so log Z is the log evidence.

The sampler works on the unconstrained ``u`` of :mod:`pgmflow.tasks.tempering.priors`; the reference is the
prior on ``u`` (normalised, exact sampler), ``log gamma(u) = log prior(u) + log L(T(u))`` and the
tempering log-likelihood ``l = log gamma - log ref`` is exactly ``log L(T(u))``. Level b samples
``prior(u) L(T(u))^b``; ``log Z = log int prior(theta) L(theta) dtheta`` (the Jacobian is in the prior
on u, so the evidence does not depend on the parametrisation).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pgmflow.tasks.tempering.priors import PriorReference
from pgmflow.tasks.tempering.targets import continuous_target, load_callable


@continuous_target
class BayesTarget(NamedTuple):
    """reference: the prior (PriorReference); data: dict of arrays (X [N, p], y [N]); log_likelihood,
    grad_log_likelihood: import paths ("" for none); options: keyword arguments of the likelihood."""

    reference: PriorReference
    data: dict
    log_likelihood: str
    grad_log_likelihood: str
    options: dict

    @property
    def exact_log_z(self):
        f = getattr(load_callable(self.log_likelihood), "exact_log_evidence", None)
        return None if f is None else f(self.reference.blocks, self.data, **self.options)

    def log_lik(self, u: np.ndarray) -> np.ndarray:
        theta, _ = self.reference.transform(u)
        out = np.asarray(load_callable(self.log_likelihood)(theta, self.data, **self.options), dtype=np.float64)
        return out.reshape(-1)

    def log_gamma(self, u: np.ndarray) -> np.ndarray:
        """u [n, d] -> log prior(u) + log L(T(u)) [n]."""
        return self.reference.log_density(u) + self.log_lik(u)

    def grad_log_gamma(self, u: np.ndarray) -> np.ndarray:
        if not self.grad_log_likelihood:
            raise ValueError("HMC needs model.grad_log_likelihood for model=bayes")
        theta, dtheta = self.reference.transform(u)
        g = np.asarray(load_callable(self.grad_log_likelihood)(theta, self.data, **self.options), dtype=np.float64)
        return self.reference.grad_log_density(u) + g.reshape(u.shape) * dtheta
