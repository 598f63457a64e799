"""The models the bounds run on, built once from a validated config: the Ising target (as a tasks-side
object and as an MRF) at each temperature, or an MRF from a file, with TRW's edge appearance
probabilities (Wainwright, Jaakkola & Willsky 2005)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from pgmflow.bounds.settings import VariationalSettings
from pgmflow.core.errors import ConfigError
from pgmflow.tasks.bounds import mrf as _mrf
from pgmflow.tasks.bounds import trw
from pgmflow.tasks.bounds.per_temperature import ising_model, lattice_of, small_exact


def ising_target(mcfg: Mapping, T: float):
    """The Ising target of ``model=ising`` at temperature ``T`` (the tempering target, level b = 1)."""
    from pgmflow.tasks.tempering import targets

    return targets.make_ising(mcfg["L"], T, mcfg["J"], mcfg["h"], mcfg["couplings"], mcfg["disorder_seed"])


def ising_rho(target, model: _mrf.PairwiseMRF, settings: VariationalSettings):
    """TRW's rho for the periodic lattice: "uniform", (n-1)/E, for sides >= 3 (see trw.lattice_rho),
    else from random spanning trees."""
    if target.L >= 3 and settings.rho in ("auto", "uniform"):
        return "uniform"
    return trw.spanning_tree_rho(model, n_trees=settings.n_trees, seed=0)


class Temperature(NamedTuple):
    """One temperature of ``pipeline=bounds``: T; the Ising target (None for an MRF from a file); the
    MRF; TRW's rho ("uniform", (n - 1) / E, or an array [E]); the lattice of the lattice kernels or None."""

    T: float
    target: object | None
    model: _mrf.PairwiseMRF
    rho: str | np.ndarray
    lattice: tuple | None

    def task_model(self):
        """What ``bounds_task`` takes: ``(Ising target, b = 1)`` or the MRF."""
        return (self.target, 1.0) if self.target is not None else self.model

    def exact(self) -> tuple[float | None, str]:
        """The exact log Z where known, and how (Kaufman 1949, the transfer matrix, enumeration)."""
        if self.target is not None:
            from pgmflow.tasks.tempering.exact import reference_log_z

            return reference_log_z(self.target)
        return small_exact(self.model), "enumeration"


@dataclass(frozen=True, eq=False)
class BoundsModel:
    """The model of ``pipeline=bounds``: its name, the model fields as configured (recorded with the
    run's input), the file it was read from (None: generated), and its temperatures. Bounds on each
    node's marginal apply to an MRF from a file (``node_marginals``)."""

    name: str
    spec: Mapping
    data_path: str | None
    temperatures: tuple[Temperature, ...]
    node_marginals: bool

    @property
    def n(self) -> int:
        return self.temperatures[0].model.n

    @property
    def E(self) -> int:
        return self.temperatures[0].model.E


def ising_lattices(mcfg: Mapping, settings: VariationalSettings) -> BoundsModel:
    """``model=ising``: the lattice at each of ``variational.temperatures`` (default: ``model.T``)."""
    temps = []
    for T in settings.temperatures or (float(mcfg["T"]),):
        target = ising_target(mcfg, T)
        model = ising_model(target)
        temps.append(Temperature(T, target, model, ising_rho(target, model, settings), lattice_of(target)))
    return BoundsModel(name="ising", spec=dict(mcfg), data_path=None, temperatures=tuple(temps), node_marginals=False)


def file_mrf(mcfg: Mapping, loaded: tuple, settings: VariationalSettings, seed: int) -> BoundsModel:
    """``model=mrf``: the MRF read by :func:`load_mrf` (``loaded``); rho from the file, else from
    ``variational.n_trees`` random spanning trees (seeded by the run's seed)."""
    model, rho = loaded
    if rho is None:
        rho = trw.spanning_tree_rho(model, n_trees=settings.n_trees, seed=seed)
    T = 1.0 / float(mcfg.get("beta", 1.0))
    return BoundsModel(
        name="mrf",
        spec=dict(mcfg),
        data_path=mcfg.get("path"),
        temperatures=(Temperature(T, None, model, rho, None),),
        node_marginals=True,
    )


__all__ = [
    "BoundsModel",
    "Temperature",
    "file_mrf",
    "ising_lattices",
    "ising_model",
    "ising_rho",
    "ising_target",
    "load_mrf",
]


def load_mrf(mcfg: dict) -> tuple[_mrf.PairwiseMRF, np.ndarray | None]:
    """``model=mrf``: the model and TRW's rho from ``model.path`` (ConfigError on any problem)."""
    from pathlib import Path

    path = mcfg.get("path")
    if not path:
        raise ConfigError(
            "model.path",
            path,
            "model=mrf needs a file with the couplings",
            "pass model.path=FILE.npz holding J [n, n] (and optionally h [n], rho)",
        )
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise ConfigError("model.path", str(path), "no such file", "check the path")
    try:
        z = np.load(p, allow_pickle=False)
        arrays = {k: z[k] for k in z.files} if hasattr(z, "files") else {"J": np.asarray(z)}
    except Exception as exc:
        raise ConfigError(
            "model.path",
            str(path),
            f"cannot read it as .npz/.npy ({type(exc).__name__})",
            "save the couplings with numpy.savez(path, J=..., h=...)",
        ) from None
    if "J" not in arrays:
        raise ConfigError(
            "model.path",
            str(path),
            f"has no array 'J' (found: {', '.join(arrays) or 'none'})",
            "save the coupling matrix under the name J",
        )
    beta = float(mcfg.get("beta", 1.0))
    try:
        model = _mrf.from_dense(
            beta * np.asarray(arrays["J"], dtype=np.float64),
            None if "h" not in arrays else beta * np.asarray(arrays["h"], dtype=np.float64),
        )
    except _mrf.MRFError as exc:
        raise ConfigError("model.path", str(path), f"{exc.what} {exc.problem}", exc.fix) from None
    rho = None
    if "rho" in arrays:
        r = np.asarray(arrays["rho"], dtype=np.float64)
        if r.ndim == 2:  # a symmetric [n, n] matrix of edge probabilities
            if r.shape != (model.n, model.n):
                raise ConfigError(
                    "model.path",
                    str(path),
                    f"rho has shape {r.shape}, the couplings need ({model.n}, {model.n}) or ({model.E},)",
                    "save one probability per edge",
                )
            r = r[model.edges[:, 0], model.edges[:, 1]]
        try:
            trw.check_rho(model, r)
        except _mrf.MRFError as exc:
            raise ConfigError("model.path", str(path), f"rho: {exc.problem}", exc.fix) from None
        rho = r
    return model, rho
