"""The plan of a TESLA run: every setting with its type, and the data, resolved once.

:func:`pgmflow.tesla.validate.check_tesla` reads the config and returns a :class:`TeslaPlan`;
``run(ctx, plan)`` and everything below it work from the plan and its pieces only. The estimators
are TESLA (Ahmed & Xing 2009, eq. 13: temporally smoothed L1 logistic regression per node),
KELLER (Song, Kolar & Xing 2009; Kolar et al. 2010: kernel-weighted L1 logistic regression) and
static per-time-point neighbourhood selection (Meinshausen & Buehlmann 2006).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pgmflow.tesla.networks import NetworkData, NetworkFile, RollCallSource, SyntheticNetwork

NetworkSource = SyntheticNetwork | NetworkFile | RollCallSource  # where the data comes from


@dataclass(frozen=True)
class Grid:
    """The penalty grid every node's path is solved over.

    lambda1: the L1 penalties on the edge weights, solved in this order, each warm-started from the one
    before (largest first); TESLA's, and KELLER's and static's unless they have their own.
    lambda2: TESLA's temporal smoothing penalties (Ahmed & Xing 2009, eq. 13). bandwidths: KELLER's
    Gaussian kernel bandwidths h, in time points (Kolar et al. 2010). keller_lambda1, static_lambda1:
    KELLER's and static's own lambda1 grids (``tesla.keller_lambda1``, ``tesla.static_lambda1``), or None
    for the shared ``lambda1``. The methods' criteria turn at different penalties (the 109th Senate's BIC
    wants KELLER and static far above TESLA: docs/tesla.md), so one shared grid is either too narrow for
    some method or wastes solves on the others.
    """

    lambda1: tuple[float, ...]
    lambda2: tuple[float, ...]
    bandwidths: tuple[float, ...]
    keller_lambda1: tuple[float, ...] | None = None
    static_lambda1: tuple[float, ...] | None = None

    def lambda1_of(self, method: str) -> tuple[float, ...]:
        """The lambda1 grid ``method`` is solved over: its own, else the shared ``lambda1``."""
        own = {"keller": self.keller_lambda1, "static": self.static_lambda1}.get(method)
        return self.lambda1 if own is None else own

    def second_axis(self, method: str) -> tuple[float, ...]:
        """The grid's second axis for ``method``: lambda2 (TESLA), the bandwidths (KELLER), one point (static)."""
        return self.lambda2 if method == "tesla" else self.bandwidths if method == "keller" else (0.0,)


@dataclass(frozen=True)
class SolverSettings:
    """How one node's path is solved (FISTA; docs/tesla.md).

    q: the smoothing norm ``||theta^t - theta^{t-1}||_q^q``, 1 (fused) or 2 (ridge-like). max_iter: FISTA
    iterations per solve at most. tol: the stopping test on the gradient-mapping norm. active_sets: the
    active-set solver with a KKT certificate (True) or the full-update reference solver (False). algorithm:
    ``auto`` (SSNAL where it applies, certified by FISTA's test; ``solver.solve_path``) or ``fista``.
    """

    q: int
    max_iter: int
    tol: float
    active_sets: bool
    algorithm: str = "auto"


@dataclass(frozen=True, eq=False)
class Selection:
    """How each node's grid point is chosen.

    criterion: ``bic`` (as Ahmed & Xing 2009), ``ebic`` (extended BIC, Chen & Chen 2008) or ``heldout``
    (held-out log-likelihood). ebic_gamma: the extended BIC's gamma. heldout_fraction: the share of
    samples held out when criterion is ``heldout``. heldout: bool [N], the held-out samples (all False
    unless criterion is ``heldout``; keyed by the seed alone).
    """

    criterion: str
    ebic_gamma: float
    heldout_fraction: float
    heldout: np.ndarray


@dataclass(frozen=True, eq=False)
class Estimation:
    """What is estimated and how: the graph's whole specification apart from the data.

    methods: the estimators, among ``tesla``, ``keller``, ``static``, in order (the first is the run's
    objective). grid, solver, selection: see :class:`Grid`, :class:`SolverSettings`, :class:`Selection`.
    """

    methods: tuple[str, ...]
    grid: Grid
    solver: SolverSettings
    selection: Selection

    def n_path_tasks(self, p: int) -> int:
        """Path solves over ``p`` nodes: one per method, node and point of the grid's second axis."""
        return sum(p * len(self.grid.second_axis(m)) for m in self.methods)


@dataclass(frozen=True)
class ReportSettings:
    """What the end of the run reports.

    rule: the edge rule of the reported edges and F1, ``and`` or ``or`` (Meinshausen & Buehlmann 2006;
    both are saved). snapshot_times: the time points drawn in the network snapshots. figures: log figures.
    """

    rule: str
    snapshot_times: tuple[int, ...]
    figures: bool


@dataclass(frozen=True, eq=False)
class TeslaPlan:
    """A TESLA run, typed: what ``run(ctx, plan)`` works from (the config is read in validation only).

    seed: the master seed. network: where the data comes from (a generator's settings, or a file).
    data: the data itself, loaded and checked once, in validation. estimation: the methods, grid, solver
    and selection. report: the edge rule, snapshots and figures. checkpoint_seconds: finished nodes'
    results are saved at most this often (0: as each finishes), so a resumed run solves only the rest.
    """

    seed: int
    network: NetworkSource
    data: NetworkData
    estimation: Estimation
    report: ReportSettings
    checkpoint_seconds: float


def work_seconds(plan: TeslaPlan) -> float:
    """Rough single-core seconds of the run (``pgmflow.core.smallwork``): each node's solves (TESLA: one
    per lambda1 x lambda2; KELLER: one per lambda1 x bandwidth x time point; static: one per lambda1 x
    time point), each ~200 FISTA iterations over the rows it reads (all N rows: p coefficients each)."""
    X = plan.data.series.X
    N, p = X.shape
    T = len(plan.data.series.n_per_time)
    g = plan.estimation.grid
    per_solve = 200 * N * p * 2e-9
    solves = 0
    for m in plan.estimation.methods:
        if m == "tesla":
            solves += len(g.lambda1_of(m)) * len(g.lambda2)
        elif m == "keller":
            solves += len(g.lambda1_of(m)) * len(g.bandwidths) * T
        else:
            solves += len(g.lambda1_of(m)) * max(1, T // 10)  # a static fit per time point reads only its own rows
    return p * solves * per_solve
