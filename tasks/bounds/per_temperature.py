"""What one Dask task of the bounds workload computes: MF, BP and TRW at one temperature.

Pure numerics over arrays and NumPy structures (``pgmflow.tasks.bounds.mrf.PairwiseMRF``), so the
orchestration layer only builds the graph. An Ising tempering target at ladder level ``b`` is turned
into its MRF here, on the worker, so the graph carries the lattice's bond signs, not its edge arrays.
"""

from __future__ import annotations

import numpy as np

from pgmflow.tasks.bounds import mrf as _mrf
from pgmflow.tasks.bounds import summary

EXACT_MAX_NODES = 20  # exact log Z and marginals by enumeration up to this many nodes


def ising_model(target, b: float = 1.0) -> _mrf.PairwiseMRF:
    """The tempering target at ladder level ``b`` (inverse temperature ``b * beta_model``) as an MRF."""
    return _mrf.ising_lattice(
        target.L, J=target.J_abs, h=target.h, beta=b * target.beta_model, bonds_h=target.bonds_h, bonds_v=target.bonds_v
    )


def mrf_level(target, b: float) -> _mrf.PairwiseMRF:
    """Level ``b`` of an MRF tempering target (``pgmflow.tasks.tempering.mrf_target.MRFTarget``) as an MRF:
    couplings ``b J``, fields ``b h + (1 - b) a`` (``a``: the target's reference fields)."""
    return _mrf.PairwiseMRF(b * target.h + (1.0 - b) * target.ref_field, target.edges, b * target.J)


def lattice_of(target):
    """``(L, W, periodic)`` of an Ising target on which the lattice kernels apply (sides >= 3), else None."""
    return (target.L, target.L, True) if target.L >= 3 else None


def bounds_task(model, rho, settings: dict, lattice=None) -> summary.Bounds:
    """One temperature: MF, BP and TRW. ``model`` is a PairwiseMRF or ``(target, b)``, an Ising
    target at ladder level b; ``rho`` an array [E] or the string "uniform" for ``(n - 1) / E``;
    ``settings`` the keyword arguments of :func:`pgmflow.tasks.bounds.summary.compute_bounds`."""
    if not isinstance(model, _mrf.PairwiseMRF):  # (target, b)
        model = ising_model(*model)
    if isinstance(rho, str):
        rho = np.full(model.E, (model.n - 1) / model.E)
    return summary.compute_bounds(model, rho, lattice=lattice, **settings)


def small_exact(model) -> float | None:
    """Exact log Z by enumeration for models of at most :data:`EXACT_MAX_NODES` nodes, else None."""
    if model.n <= EXACT_MAX_NODES:
        from pgmflow.tasks.bounds import exact

        return float(exact.log_z_enumeration(model))
    return None


def small_exact_marginals(model) -> np.ndarray | None:
    """Exact mean spins by enumeration for small models (see :func:`small_exact`), else None."""
    if model.n <= EXACT_MAX_NODES:
        from pgmflow.tasks.bounds import exact

        return np.asarray(exact.exact_marginals(model).mean)
    return None
