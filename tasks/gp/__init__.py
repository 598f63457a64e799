"""Inducing-point Gaussian processes: kernels, distributed statistics, bounds, exact GP, SVGP.

Modules: :mod:`~tasks.gp.kernels` (hyperparameters, kernels and their adjoints, Cholesky with
jitter), :mod:`~tasks.gp.stats` (per-chunk statistics and gradient pass), :mod:`~tasks.gp.bounds`
(SGPR / DTC / FITC objectives, adjoints, predictions), :mod:`~tasks.gp.exact` (exact GP for small
n), :mod:`~tasks.gp.svgp` (stochastic variational GP, Hensman et al. 2013),
:mod:`~tasks.gp.inducing` (k-means++ inducing inputs), :mod:`~tasks.gp.data` (synthetic data,
standardisation).
"""
