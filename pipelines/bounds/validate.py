"""Validation of pipeline=bounds (and of the variational section that bounds=true uses in tempering): the
only reads of the config dict in the bounds workload; returns the typed plan."""

from __future__ import annotations

from pgmflow.bounds.plan import BoundsPlan
from pgmflow.bounds.settings import VariationalSettings
from pgmflow.core.errors import ConfigError
from pgmflow.core.validation import apply, boolean, choice, get, integer, real, unknown_keys

# The Ising model (model=ising) is a binary pairwise model: its rules live here, and tempering, which
# samples it, takes them from here (tempering -> bounds is the one workload-to-workload import).
ISING_RULES = {
    "L": integer(lo=2, hi=1 << 15, even=True),
    "T": real(gt=0),
    "J": real(nonzero=True),
    "h": real(),
    "couplings": choice("ferromagnetic", "antiferromagnetic", "spin_glass"),
    "disorder_seed": integer(lo=0),
}

VARIATIONAL_KEYS = {
    "damping",
    "max_iter",
    "tol",
    "mf_restarts",
    "rho",
    "n_trees",
    "temperatures",
    "marginals",
    "figures",
    "checkpoint_seconds",
}
VARIATIONAL = {
    "damping": real(gt=0),
    "max_iter": integer(lo=1),
    "tol": real(gt=0),
    "mf_restarts": integer(lo=0, hi=1000),
    "rho": choice("auto", "uniform", "spanning_trees"),
    "n_trees": integer(lo=1, hi=100_000),
    "marginals": boolean,
    "figures": boolean,
    "checkpoint_seconds": real(ge=0),
}


def check_variational(cfg: dict) -> VariationalSettings:
    """The ``variational`` section (pipeline=bounds, and bounds=true in tempering), typed."""
    unknown_keys(cfg, "variational", VARIATIONAL_KEYS)
    apply(cfg, {f"variational.{k}": r for k, r in VARIATIONAL.items()})
    d = cfg["variational"]["damping"]
    if d > 1:
        raise ConfigError("variational.damping", d, "must lie in (0, 1] (1: no damping)", "use e.g. 0.5")
    temps = cfg["variational"].get("temperatures")
    if temps is not None:
        if not isinstance(temps, (list, tuple)) or not temps:
            raise ConfigError(
                "variational.temperatures",
                temps,
                "must be a non-empty list of temperatures or null",
                "use e.g. variational.temperatures=[2.0,2.269,2.5]",
            )
        for t in temps:
            real(gt=0)("variational.temperatures", t)
    v = cfg["variational"]
    return VariationalSettings(
        damping=float(v["damping"]),
        max_iter=int(v["max_iter"]),
        tol=float(v["tol"]),
        mf_restarts=int(v["mf_restarts"]),
        rho=str(v.get("rho", "auto")),
        n_trees=int(v["n_trees"]),
        temperatures=None if temps is None else tuple(float(t) for t in temps),
        marginals=bool(v.get("marginals")),
        figures=bool(v.get("figures", True)),
        checkpoint_seconds=float(v.get("checkpoint_seconds", 10.0)),
    )


def check_bounds(cfg: dict) -> tuple | None:
    """pipeline=bounds: an Ising model (validated as for tempering) or an MRF from a file (loaded and
    checked: square, symmetric, finite couplings). Returns what :func:`load_mrf` read (None for Ising)."""
    model = cfg.get("model") or {}
    name = model.get("name")
    if name == "ising":
        unknown_keys(cfg, "model", set(ISING_RULES) | {"name"})
        apply(cfg, {f"model.{k}": r for k, r in ISING_RULES.items()})
        return None
    if name == "mrf":
        unknown_keys(cfg, "model", {"name", "path", "beta"})
        real(gt=0)("model.beta", get(cfg, "model.beta"))
        from pgmflow.bounds.models import load_mrf

        return load_mrf(model)
    raise ConfigError(
        "model",
        name,
        "pipeline=bounds works on binary pairwise models",
        "use model=ising or model=mrf model.path=FILE.npz",
    )


def check_bounds_pipeline(cfg: dict) -> BoundsPlan:
    """Everything pipeline=bounds reads: the model, then the variational section. Returns the plan, its
    model built once (a model file read once per run)."""
    from pgmflow.bounds import models

    loaded = check_bounds(cfg)
    settings = check_variational(cfg)
    seed = int(cfg["seed"])
    model = (
        models.ising_lattices(cfg["model"], settings)
        if loaded is None
        else models.file_mrf(cfg["model"], loaded, settings, seed)
    )
    return BoundsPlan(seed=seed, variational=settings, model=model)
