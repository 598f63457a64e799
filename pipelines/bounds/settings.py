"""The ``variational`` section, typed: the solver settings of the bounds (``pipeline=bounds`` and
``bounds=true`` in tempering). Mean field, loopy BP (Yedidia, Freeman & Weiss 2005) and TRW
(Wainwright, Jaakkola & Willsky 2005)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class VariationalSettings:
    """The ``variational`` section, validated and typed (see conf/config.yaml)."""

    damping: float  # in (0, 1]; 1: no damping
    max_iter: int
    tol: float
    mf_restarts: int
    rho: str  # auto | uniform | spanning_trees
    n_trees: int  # random spanning trees behind TRW's rho, when drawn
    temperatures: tuple[float, ...] | None  # pipeline=bounds on model=ising (None: model.T)
    marginals: bool
    figures: bool
    checkpoint_seconds: float

    @classmethod
    def from_section(cls, v: Mapping) -> VariationalSettings:
        temps = v.get("temperatures")
        return cls(damping=float(v["damping"]), max_iter=int(v["max_iter"]), tol=float(v["tol"]),
                   mf_restarts=int(v["mf_restarts"]), rho=str(v.get("rho", "auto")), n_trees=int(v["n_trees"]),
                   temperatures=None if temps is None else tuple(float(t) for t in temps),
                   marginals=bool(v.get("marginals")), figures=bool(v.get("figures", True)),
                   checkpoint_seconds=float(v.get("checkpoint_seconds", 10.0)))

    def solver_options(self, backend: str = "numpy") -> dict:
        """The keyword arguments of ``pgmflow.tasks.bounds.summary.compute_bounds``."""
        return dict(damping=self.damping, max_iter=self.max_iter, tol=self.tol, mf_restarts=self.mf_restarts,
                    backend=backend)
