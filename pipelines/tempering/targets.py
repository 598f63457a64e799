"""The driver's view of a tempering target: the task-side target and what the driver asks of it.

A :class:`Target` wraps the task-side target (``task``: a NamedTuple of ``pgmflow.tasks.tempering``,
what the workers receive) and answers the driver's questions itself: which explorers suit it, the
exact log Z where one is known, the cost of a scan (how the graph is cut), what is logged per level
and per round, and the labels of its figures. :data:`TARGETS` maps ``model.name`` to the class;
:func:`build_target` builds one from a validated model section (the only place the section is read
outside the validation). The path between reference and target is the one of Geyer (1991) and
Syed, Bouchard-Côté, Deligiannidis & Doucet (2022): ``pi_b ∝ ref exp(b l)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from pgmflow.core.errors import ConfigError


@dataclass(frozen=True, eq=False)
class Target:
    """A validated target on the driver.

    task: the task-side target (scattered to the workers once per run).
    spec: the model fields it was built from (overrides applied), recorded with the run's input.
    exact_log_z, exact_source: the exact log Z where known and how it was obtained (Kaufman 1949,
    the transfer matrix, or the target's own analytic value), else ``(None, "none")``.
    data_path: the file its data came from, as configured (None: a generated target).
    """

    task: Any
    spec: Mapping
    exact_log_z: float | None
    exact_source: str
    data_path: str | None = None

    name: ClassVar[str] = ""
    explorers: ClassVar[tuple[str, ...]] = ("rwm", "hmc")
    default_explorer: ClassVar[str] = "rwm"
    wrong_explorer: ClassVar[tuple[str, str]] = (
        "is an Ising spin update, the target is continuous",
        "set tempering.explorer=rwm or hmc",
    )
    continuous: ClassVar[bool] = True  # a fitted Gaussian reference (Surjanovic et al. 2022) applies
    supports_bounds: ClassVar[bool] = False  # a binary pairwise model: variational bounds apply
    adapts_step_size: ClassVar[bool] = True  # RWM / HMC step sizes tuned per level between rounds
    observable_name: ClassVar[str] = "log-likelihood"  # the series of the autocorrelation and R-hat
    magnitude_name: ClassVar[str] = "|x|"  # what ``abs_m`` of the traces measures
    trace_ylabel: ClassVar[str] = "log-likelihood l(x)"
    ladder_xlabel: ClassVar[str] = "b (annealing parameter)"

    @classmethod
    def make_task(cls, model: Mapping):
        """The task-side target of a validated model section."""
        raise NotImplementedError

    @classmethod
    def source_of(cls, model: Mapping) -> str | None:
        """The data file of a validated model section (None: the target is generated)."""
        return None

    @classmethod
    def build(cls, model: Mapping, task=None) -> Target:
        """The target of a validated model section (``task``: its task-side target, if already built)."""
        from pgmflow.tasks.tempering.exact import reference_log_z

        task = cls.make_task(model) if task is None else task
        exact, how = reference_log_z(task)
        return cls(task=task, spec=dict(model), exact_log_z=exact, exact_source=how, data_path=cls.source_of(model))

    @classmethod
    def resolve_explorer(cls, explorer: str) -> str:
        """``tempering.explorer`` for this target: ``auto`` picks the default; others must suit it."""
        if explorer == "auto":
            return cls.default_explorer
        if explorer not in cls.explorers:
            raise ConfigError("tempering.explorer", explorer, *cls.wrong_explorer)
        return explorer

    def variant(self, overrides: Mapping) -> Target:
        """The target with some model fields overridden (``tempering.chain_overrides``)."""
        return self if not overrides else type(self).build({**self.spec, **overrides})

    @property
    def log_z_reference(self) -> float:
        return self.task.log_z_reference

    def scan_cost_s(self, n_levels: int, sweeps: int, inner: int) -> float:
        """Rough seconds of one scan of a chain (``inner``: leapfrog steps per HMC move, else 1)."""
        return n_levels * sweeps * inner * 30e-6

    def site_updates(self, level_sweeps: int) -> int | None:
        """Spin updates of ``level_sweeps`` sweeps of one level (None: not a spin system)."""
        return None

    def observable(self, trace) -> np.ndarray:
        """The energy-like series of a round's trace, [T, K]: the log-likelihood l(x)."""
        return trace.loglik

    def trace_values(self, trace, k: int) -> np.ndarray:
        """What the trace figure plots at level k, [T]."""
        return trace.loglik[:, k]

    def level_label(self, b: float) -> str:
        return f"b = {b:.3g}"

    def level_columns(self, betas, trace) -> list[dict]:
        """Columns of the per-temperature table beyond the common ones, one dict per level."""
        return [{} for _ in betas]

    def per_site_results(self, log_z: float) -> dict:
        """Results per degree of freedom (a spin system's log Z per site)."""
        return {}


@dataclass(frozen=True, eq=False)
class SpinTarget(Target):
    """What the binary targets share (the Ising lattice, an MRF on any graph): spin updates, bounds along the
    ladder, no step size to adapt, energy as the observable."""

    explorers: ClassVar[tuple[str, ...]] = ("metropolis", "heatbath")
    default_explorer: ClassVar[str] = "heatbath"
    continuous: ClassVar[bool] = False
    supports_bounds: ClassVar[bool] = True
    adapts_step_size: ClassVar[bool] = False
    observable_name: ClassVar[str] = "energy"


@dataclass(frozen=True, eq=False)
class IsingLattice(SpinTarget):
    """The 2D Ising model on an L x L periodic lattice; the ladder is a ladder of temperatures T / b
    (Swendsen & Wang 1986; exact log Z by Kaufman 1949 or the transfer matrix)."""

    name: ClassVar[str] = "ising"
    wrong_explorer: ClassVar[tuple[str, str]] = (
        "is for continuous targets, the Ising model needs spin updates",
        "set tempering.explorer=heatbath or metropolis",
    )
    magnitude_name: ClassVar[str] = "|magnetisation|"
    trace_ylabel: ClassVar[str] = "energy per site"
    ladder_xlabel: ClassVar[str] = "b (annealing parameter; T = T_target / b)"

    @classmethod
    def make_task(cls, model: Mapping):
        from pgmflow.tasks.tempering import targets

        return targets.make_ising(
            model["L"], model["T"], model["J"], model["h"], model["couplings"], model["disorder_seed"]
        )

    @property
    def L(self) -> int:
        return self.task.L

    @property
    def n_sites(self) -> int:
        return self.task.n_sites

    @property
    def beta_model(self) -> float:
        return self.task.beta_model

    def scan_cost_s(self, n_levels: int, sweeps: int, inner: int) -> float:
        return n_levels * self.n_sites * sweeps * 1.5e-9

    def site_updates(self, level_sweeps: int) -> int | None:
        return level_sweeps * self.n_sites

    def observable(self, trace) -> np.ndarray:
        return trace.energy

    def trace_values(self, trace, k: int) -> np.ndarray:
        return trace.energy[:, k] / self.n_sites

    def level_label(self, b: float) -> str:
        beta = b * self.beta_model
        return f"T = {1 / beta:.3g}" if beta > 0 else "T = inf (reference)"

    def level_columns(self, betas, trace) -> list[dict]:
        """Temperature, energy and specific heat per site, and the energy's effective sample size."""
        from pgmflow.tasks.tempering import diagnostics

        ess_e = diagnostics.effective_sample_size(trace.energy.T)
        n = self.n_sites
        cols = []
        for k in range(len(betas)):
            beta = float(betas[k]) * self.beta_model
            e = trace.energy[:, k]
            cols.append(
                {
                    "temperature": (1.0 / beta) if beta > 0 else float("inf"),
                    "energy_per_site": float(e.mean() / n),
                    "specific_heat_per_site": float(beta**2 * e.var() / n),
                    "ess_energy": float(ess_e[k]),
                }
            )
        return cols

    def per_site_results(self, log_z: float) -> dict:
        return {"log_z_ss_per_site": log_z / self.n_sites}


@dataclass(frozen=True, eq=False)
class GaussianMixture(Target):
    """An unnormalised isotropic Gaussian mixture (exact log Z known): a multimodal test target."""

    name: ClassVar[str] = "gaussian_mixture"
    default_explorer: ClassVar[str] = "hmc"

    @classmethod
    def make_task(cls, model: Mapping):
        from pgmflow.tasks.tempering import targets

        return targets.make_gaussian_mixture(
            model["dim"],
            model["n_components"],
            model["separation"],
            model["sigma"],
            model["reference_scale"],
            model["target_seed"],
            model.get("weights"),
        )


@dataclass(frozen=True, eq=False)
class CorrelatedGaussian(Target):
    """A correlated Gaussian with scales spread over a range (exact log Z known)."""

    name: ClassVar[str] = "gaussian"
    default_explorer: ClassVar[str] = "hmc"

    @classmethod
    def make_task(cls, model: Mapping):
        from pgmflow.tasks.tempering.gaussian_target import make_correlated_gaussian

        return make_correlated_gaussian(
            model["dim"],
            model["shift"],
            model["scale_min"],
            model["scale_max"],
            model["correlation"],
            model["reference_scale"],
        )


@dataclass(frozen=True, eq=False)
class CustomDensity(Target):
    """A user's log-density, an importable callable, against a Gaussian reference."""

    name: ClassVar[str] = "custom"

    @classmethod
    def make_task(cls, model: Mapping):
        from pgmflow.tasks.tempering import targets

        return targets.CustomTarget(
            log_density=model["log_density"],
            grad_log_density=model.get("grad_log_density") or "",
            reference=targets.GaussianReference(model["dim"], float(model["reference_scale"])),
        )


@dataclass(frozen=True, eq=False)
class BayesianModel(Target):
    """A Bayesian model (named priors, a data file, a likelihood): log Z is the log evidence. The data
    file is read once, when the target is built; variants share the arrays (``model.data`` cannot be
    overridden per chain)."""

    name: ClassVar[str] = "bayes"

    @classmethod
    def make_task(cls, model: Mapping, data: dict | None = None):
        from pgmflow.tempering.bayes import build_bayes

        return build_bayes(model, data)

    @classmethod
    def source_of(cls, model: Mapping) -> str | None:
        return model["data"]["path"]

    def variant(self, overrides: Mapping) -> Target:
        if not overrides:
            return self
        spec = {**self.spec, **overrides}
        return self.build(spec, self.make_task(spec, self.task.data))


@dataclass(frozen=True, eq=False)
class MarkovRandomField(SpinTarget):
    """A pairwise binary MRF on any graph from a file (``model=mrf``; ``pgmflow.tempering.mrf``): per-colour
    spin updates; the reference is uniform spins or, with ``tempering.reference=variational``, the mean-field
    product (then ``spec["reference"] == "mean_field"``); with ``stabilized`` the target keeps uniform spins and the
    product leg's reference travels on the path (``pgmflow.tempering.reference``); exact log Z by enumeration up
    to 20 nodes."""

    name: ClassVar[str] = "mrf"
    wrong_explorer: ClassVar[tuple[str, str]] = (
        "is for continuous targets, an MRF needs spin updates",
        "set tempering.explorer=heatbath or metropolis",
    )
    magnitude_name: ClassVar[str] = "|mean spin|"
    trace_ylabel: ClassVar[str] = "energy per node -(h.x + sum J x_i x_j) / n"

    @classmethod
    def make_task(cls, model: Mapping):
        from pgmflow.tempering.mrf import build_task

        return build_task(model)

    @classmethod
    def source_of(cls, model: Mapping) -> str | None:
        return model.get("path")

    @property
    def n_sites(self) -> int:
        return self.task.n_sites

    def scan_cost_s(self, n_levels: int, sweeps: int, inner: int) -> float:
        return n_levels * sweeps * (self.task.n_sites + self.task.nbr.shape[0]) * 3e-9

    def site_updates(self, level_sweeps: int) -> int | None:
        return level_sweeps * self.n_sites

    def observable(self, trace) -> np.ndarray:
        return trace.energy

    def trace_values(self, trace, k: int) -> np.ndarray:
        return trace.energy[:, k] / self.n_sites

    def level_columns(self, betas, trace) -> list[dict]:
        """Energy per node and its effective sample size at each level."""
        from pgmflow.tasks.tempering import diagnostics

        ess_e = diagnostics.effective_sample_size(trace.energy.T)
        return [
            {"energy_per_site": float(trace.energy[:, k].mean() / self.n_sites), "ess_energy": float(ess_e[k])}
            for k in range(len(betas))
        ]

    def per_site_results(self, log_z: float) -> dict:
        return {"log_z_ss_per_site": log_z / self.n_sites}


#: The builders, keyed by ``model.name``.
TARGETS: dict[str, type[Target]] = {
    cls.name: cls
    for cls in (IsingLattice, GaussianMixture, CustomDensity, CorrelatedGaussian, BayesianModel, MarkovRandomField)
}
MODELS = tuple(TARGETS)


def build_target(model: Mapping) -> Target:
    """The driver-side target (with its task-side target) of a validated model section."""
    cls = TARGETS.get(model["name"])
    if cls is None:
        raise ConfigError("model.name", model["name"], "unknown target", f"use one of {', '.join(MODELS)}")
    return cls.build(model)
