"""The typed plan of a tempering run: what ``validate`` returns and ``run(ctx, plan)`` works from.

The settings of the ``tempering`` section with their types, and the targets built once (a data file
read once): one per entry of ``tempering.chain_overrides`` (or just the model). Replica exchange as
in Swendsen & Wang (1986) and Geyer (1991), with the non-reversible swaps and the adaptive ladder of
Syed, Bouchard-Côté, Deligiannidis & Doucet (2022) and the variational reference of Surjanovic,
Syed, Bouchard-Côté & Campbell (2022).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pgmflow.bounds.settings import VariationalSettings
from pgmflow.tempering.targets import Target


@dataclass(frozen=True)
class TemperingSettings:
    """The ``tempering`` section, validated and typed (see conf/pipeline/tempering.yaml)."""

    n_replicas: int
    n_rounds: int
    n_chains: int
    explorer: str  # resolved for the target: metropolis | heatbath | rwm | hmc
    explorer_requested: str  # as configured ("auto" allowed); read only by the layout's cost estimate
    sweeps_per_scan: int
    n_leapfrog: int
    step_size: float
    swap: str  # deo (non-reversible) | seo (reversible)
    adapt_schedule: bool
    initial_schedule: str  # linear | power
    schedule_power: float
    n_blocks: int | None  # None: one block per worker
    layout: str  # auto | chain | blocks
    scans_per_task: int | None  # None: about 0.5 s of work per task
    checkpoint_every: int  # 0: never
    figures: bool
    reference: str  # fixed | variational | stabilized
    variational_family: str  # diagonal | full
    variational_from_round: int
    stabilized_split: str  # adaptive | half
    ladder: tuple[float, ...] | None  # an explicit initial ladder from 0 to 1

    @property
    def n_levels(self) -> int:
        """Levels of each ladder."""
        return len(self.ladder) if self.ladder else self.n_replicas


@dataclass(frozen=True)
class TemperingPlan:
    """A tempering run: the seed, the settings, the targets farmed at once (``targets[g]`` is built
    from the model with ``overrides[g]``; each is run by ``tempering.n_chains`` chains) and, with
    ``bounds=true``, the settings of the variational bounds along the ladder."""

    seed: int
    tempering: TemperingSettings
    targets: tuple[Target, ...]
    overrides: tuple[Mapping, ...]
    bounds: VariationalSettings | None = None


def work_seconds(plan: TemperingPlan) -> float | None:
    """Rough single-core seconds of the run (``pgmflow.core.smallwork``): every chain's scans (rounds
    1..R run 2, 4, ... 2**R scans) at its target's ``scan_cost_s``; None with ``bounds=true`` (the bounds
    along the ladder are not counted)."""
    ts = plan.tempering
    if plan.bounds is not None:
        return None
    inner = ts.n_leapfrog if ts.explorer_requested == "hmc" else 1
    scans = 2 ** (ts.n_rounds + 1) - 2
    per_scan = sum(t.scan_cost_s(ts.n_levels, ts.sweeps_per_scan, inner) for t in plan.targets)
    return per_scan * ts.n_chains * scans
