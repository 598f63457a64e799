"""The ``variational`` section, typed: the solver settings of the bounds (``pipeline=bounds`` and
``bounds=true`` in tempering). Mean field, loopy BP (Yedidia, Freeman & Weiss 2005) and TRW
(Wainwright, Jaakkola & Willsky 2005)."""

from __future__ import annotations

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

    def solver_options(self, backend: str = "numpy") -> dict:
        """The keyword arguments of ``pgmflow.tasks.bounds.summary.compute_bounds``."""
        return dict(
            damping=self.damping, max_iter=self.max_iter, tol=self.tol, mf_restarts=self.mf_restarts, backend=backend
        )
