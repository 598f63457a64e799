"""Inducing-point Gaussian processes: kernels, distributed statistics, bounds, exact GP, SVGP.

Modules: :mod:`~pgmflow.tasks.gp.kernels` (hyperparameters, kernels and their adjoints, Cholesky with
jitter), :mod:`~pgmflow.tasks.gp.stats` (per-chunk statistics and gradient pass), :mod:`~pgmflow.tasks.gp.bounds`
(SGPR / DTC / FITC objectives, adjoints, predictions), :mod:`~pgmflow.tasks.gp.exact` (exact GP for small
n), :mod:`~pgmflow.tasks.gp.svgp` (stochastic variational GP, Hensman et al. 2013),
:mod:`~pgmflow.tasks.gp.inducing` (k-means++ inducing inputs), :mod:`~pgmflow.tasks.gp.data` (synthetic data,
standardisation).
"""
