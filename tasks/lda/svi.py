"""The global step of stochastic variational inference for LDA (Hoffman, Blei, Wang and
Paisley 2013, "Stochastic variational inference", JMLR 14, Alg. 2).

``q(beta_k) = Dir(lambda_k)``. After the E-step of minibatch ``t`` (``S`` documents of a corpus of
``D``) gives sufficient statistics ``sstats`` [K, V], the natural-gradient step is::

    rho_t  = (tau0 + t)^(-kappa)                      t = 0, 1, 2, ... (state.count)
    lambda <- (1 - rho_t) lambda + rho_t (eta + D / S * sstats)

which is the noisy natural gradient of the ELBO with step ``rho_t``; ``kappa`` in (0.5, 1] and
``tau0 >= 0`` satisfy the Robbins-Monro conditions.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.special import digamma, gammaln

from pgmflow.tasks import rng as _rng

__all__ = ["SVIState", "SVIInfo", "exp_elog_beta", "init", "step_size", "update", "topic_term_bound"]


class SVIState(NamedTuple):
    count: int  # number of global steps taken (t of the next step)
    lam: np.ndarray  # [K, V] variational Dirichlet parameters of the topics
    docs_seen: int  # documents processed so far


class SVIInfo(NamedTuple):
    rho: float  # the step size used
    batch_docs: int  # S, documents in the minibatch


def init(n_topics: int, n_words: int, seed: int, restart: int = 0) -> SVIState:
    """lambda ~ Gamma(100, 1/100) elementwise (Hoffman's initialisation), keyed by the seed alone
    (and, for a restart r >= 1, by r)."""
    g = (
        _rng.generator(seed, _rng.STAGE_LDA_INIT)
        if restart == 0
        else _rng.generator(seed, _rng.STAGE_LDA_INIT, int(restart))
    )
    return SVIState(0, g.gamma(100.0, 0.01, size=(n_topics, n_words)), 0)


def step_size(count: int, tau0: float, kappa: float) -> float:
    return float((tau0 + count) ** (-kappa))


def update(
    state: SVIState, sstats: np.ndarray, batch_docs: int, n_docs: int, eta: float, tau0: float, kappa: float
) -> tuple[SVIState, SVIInfo]:
    """One natural-gradient step. sstats [K, V] summed over the minibatch's ``batch_docs`` documents."""
    rho = step_size(state.count, tau0, kappa)
    scale = n_docs / max(batch_docs, 1)
    lam = (1.0 - rho) * state.lam + rho * (eta + scale * sstats)
    return SVIState(state.count + 1, lam, state.docs_seen + batch_docs), SVIInfo(rho, batch_docs)


def topic_term_bound(lam: np.ndarray, eta: float) -> float:
    """``E_q[log p(beta | eta) - log q(beta | lambda)]`` summed over topics (the global ELBO term)."""
    V = lam.shape[1]
    elog = digamma(lam) - digamma(lam.sum(axis=1))[:, None]
    return float(
        np.sum((eta - lam) * elog)
        + np.sum(gammaln(lam) - gammaln(eta))
        + np.sum(gammaln(eta * V) - gammaln(lam.sum(axis=1)))
    )


def exp_elog_beta(lam: np.ndarray, cols: np.ndarray, rowsum: np.ndarray | None = None) -> np.ndarray:
    """``exp(E[log beta])`` of the columns ``cols`` of lambda [K, V], word-major [len(cols), K]:
    what the driver sends with each E-step task (scipy's digamma; ``rowsum`` = ``lam.sum(axis=1)``
    when the caller has it already)."""
    rowsum = lam.sum(axis=1) if rowsum is None else rowsum
    sub = lam[:, cols]
    return np.ascontiguousarray(np.exp(digamma(sub) - digamma(rowsum)[:, None]).T)
