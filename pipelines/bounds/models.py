"""The models the bounds run on, from a validated config: the Ising target (as a tasks-side object
and as an MRF), an MRF from a file, TRW's edge appearance probabilities, and the solver settings."""

from __future__ import annotations

import numpy as np

from pgmflow.pipelines.core.errors import ConfigError
from pgmflow.tasks.bounds import mrf as _mrf
from pgmflow.tasks.bounds import trw
from pgmflow.tasks.bounds.per_temperature import ising_model


def ising_target(mcfg: dict, T: float):
    """The Ising target of ``model=ising`` at temperature ``T`` (the tempering target, level b = 1)."""
    from pgmflow.tasks.tempering import targets

    return targets.make_ising(mcfg["L"], T, mcfg["J"], mcfg["h"], mcfg["couplings"], mcfg["disorder_seed"])


def ising_rho(target, model: _mrf.PairwiseMRF, vcfg: dict):
    """TRW's rho for the periodic lattice: "uniform", (n-1)/E, for sides >= 3 (see trw.lattice_rho),
    else from random spanning trees."""
    if target.L >= 3 and vcfg.get("rho", "auto") in ("auto", "uniform"):
        return "uniform"
    return trw.spanning_tree_rho(model, n_trees=int(vcfg["n_trees"]), seed=0)


def settings(vcfg: dict, backend: str = "numpy") -> dict:
    """The keyword arguments of ``pgmflow.tasks.bounds.summary.compute_bounds`` from the variational section."""
    return dict(damping=float(vcfg["damping"]), max_iter=int(vcfg["max_iter"]), tol=float(vcfg["tol"]),
                mf_restarts=int(vcfg["mf_restarts"]), backend=backend)


__all__ = ["ising_model", "ising_rho", "ising_target", "load_mrf", "settings"]


def load_mrf(mcfg: dict) -> tuple[_mrf.PairwiseMRF, np.ndarray | None]:
    """``model=mrf``: the model and TRW's rho from ``model.path`` (ConfigError on any problem)."""
    from pathlib import Path

    path = mcfg.get("path")
    if not path:
        raise ConfigError("model.path", path, "model=mrf needs a file with the couplings",
                          "pass model.path=FILE.npz holding J [n, n] (and optionally h [n], rho)")
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise ConfigError("model.path", str(path), "no such file", "check the path")
    try:
        z = np.load(p, allow_pickle=False)
        arrays = {k: z[k] for k in z.files} if hasattr(z, "files") else {"J": np.asarray(z)}
    except Exception as exc:
        raise ConfigError("model.path", str(path), f"cannot read it as .npz/.npy ({type(exc).__name__})",
                          "save the couplings with numpy.savez(path, J=..., h=...)") from None
    if "J" not in arrays:
        raise ConfigError("model.path", str(path), f"has no array 'J' (found: {', '.join(arrays) or 'none'})",
                          "save the coupling matrix under the name J")
    beta = float(mcfg.get("beta", 1.0))
    try:
        model = _mrf.from_dense(beta * np.asarray(arrays["J"], dtype=np.float64),
                                None if "h" not in arrays else beta * np.asarray(arrays["h"], dtype=np.float64))
    except _mrf.MRFError as exc:
        raise ConfigError("model.path", str(path), f"{exc.what} {exc.problem}", exc.fix) from None
    rho = None
    if "rho" in arrays:
        r = np.asarray(arrays["rho"], dtype=np.float64)
        if r.ndim == 2:  # a symmetric [n, n] matrix of edge probabilities
            if r.shape != (model.n, model.n):
                raise ConfigError("model.path", str(path), f"rho has shape {r.shape}, the couplings need "
                                  f"({model.n}, {model.n}) or ({model.E},)", "save one probability per edge")
            r = r[model.edges[:, 0], model.edges[:, 1]]
        try:
            trw.check_rho(model, r)
        except _mrf.MRFError as exc:
            raise ConfigError("model.path", str(path), f"rho: {exc.problem}", exc.fix) from None
        rho = r
    return model, rho
