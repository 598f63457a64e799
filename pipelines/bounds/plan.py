"""The typed plan of ``pipeline=bounds``: the ``variational`` section's settings and the model built once
(a model file read once per run).

Naive mean field gives a lower bound on log Z, loopy belief propagation the Bethe approximation
(Yedidia, Freeman & Weiss 2005), tree-reweighted BP an upper bound (Wainwright, Jaakkola & Willsky 2005).
"""

from __future__ import annotations

from dataclasses import dataclass

from pgmflow.bounds.models import BoundsModel
from pgmflow.bounds.settings import VariationalSettings


@dataclass(frozen=True)
class BoundsPlan:
    """A ``pipeline=bounds`` run: the seed, the settings and the model (its temperatures inside)."""

    seed: int
    variational: VariationalSettings
    model: BoundsModel


def work_seconds(plan: BoundsPlan) -> float:
    """Rough single-core seconds of the run (``pgmflow.core.smallwork``): at each temperature, mean field,
    loopy BP and TRW, each ~2,000 sweeps over nodes and edges (the iteration cap is rarely reached)."""
    mrfs = [t.model for t in plan.model.temperatures]
    return sum(3 * 2000 * (m.n + 2 * m.E) * 10e-9 for m in mrfs)


__all__ = ["BoundsPlan"]
