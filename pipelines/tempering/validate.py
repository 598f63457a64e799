"""Validation of pipeline=tempering: the tempering section, the target (model) and its options. The only
reads of the config dict in the tempering workload; returns the typed plan, its targets built once."""

from __future__ import annotations

from pgmflow.bounds.validate import ISING_RULES
from pgmflow.core.errors import ConfigError
from pgmflow.core.validation import apply, boolean, check_importable, choice, integer, real, unknown_keys
from pgmflow.tempering.plan import TemperingPlan, TemperingSettings
from pgmflow.tempering.targets import MODELS, TARGETS, Target, build_target

TEMPERING = {
    "n_replicas": integer(lo=2, hi=4096),
    "n_rounds": integer(lo=1, hi=24),
    "n_chains": integer(lo=1, hi=4096),
    "explorer": choice("auto", "metropolis", "heatbath", "rwm", "hmc"),
    "sweeps_per_scan": integer(lo=1),
    "n_leapfrog": integer(lo=1, hi=10_000),
    "step_size": real(gt=0),
    "swap": choice("deo", "seo"),
    "adapt_schedule": boolean,
    "initial_schedule": choice("linear", "power"),
    "schedule_power": real(gt=0),
    "n_blocks": integer(lo=1, allow=("auto",)),
    "layout": choice("auto", "chain", "blocks"),
    "scans_per_task": integer(lo=1, allow=("auto",)),
    "checkpoint_every": integer(lo=0),
    "figures": boolean,
    "reference": choice("fixed", "variational", "stabilized"),
    "variational_family": choice("diagonal", "full"),
    "variational_from_round": integer(lo=2, hi=24),
    "stabilized_split": choice("adaptive", "half"),
}
TEMPERING_OPTIONAL = {"ladder", "chain_overrides"}
SHAPE_FIELDS = {
    "ising": ("L",),
    "gaussian_mixture": ("dim",),
    "custom": ("dim",),
    "gaussian": ("dim",),
    "bayes": ("prior", "data"),
    "mrf": ("path",),
}

MODEL_RULES = {
    "ising": ISING_RULES,
    "gaussian_mixture": {
        "dim": integer(lo=1, hi=10_000),
        "n_components": integer(lo=1, hi=10_000),
        "separation": real(ge=0),
        "sigma": real(gt=0),
        "reference_scale": real(gt=0),
        "target_seed": integer(lo=0),
    },
    "custom": {"dim": integer(lo=1, hi=100_000), "reference_scale": real(gt=0)},
    "gaussian": {
        "dim": integer(lo=1, hi=1_000),
        "shift": real(),
        "scale_min": real(gt=0),
        "scale_max": real(gt=0),
        "correlation": real(),
        "reference_scale": real(gt=0),
    },
    "bayes": {},
    "mrf": {"beta": real(gt=0)},
}
MODEL_EXTRA = {
    "ising": set(),
    "gaussian_mixture": {"weights"},
    "custom": {"log_density", "grad_log_density"},
    "gaussian": set(),
    "bayes": {"prior", "data", "log_likelihood", "grad_log_likelihood", "likelihood_options"},
    "mrf": {"path"},
}


def check_ladder(ladder, n_replicas):
    path = "tempering.ladder"
    if ladder is None:
        return
    if not isinstance(ladder, (list, tuple)) or len(ladder) < 2:
        raise ConfigError(
            path,
            ladder,
            "must be a list of at least two annealing parameters b in [0, 1]",
            f"set {path}=null (automatic) or e.g. {path}=[0,0.25,0.5,1]",
        )
    for v in ladder:
        real(ge=0)(path, v)
    if ladder[0] != 0 or ladder[-1] != 1:
        raise ConfigError(
            path,
            ladder,
            "must start at 0 (the reference) and end at 1 (the target)",
            "make the first entry 0 and the last 1",
        )
    for a, b in zip(ladder, ladder[1:]):
        if not b > a:
            raise ConfigError(
                path,
                ladder,
                f"must be strictly increasing (found {a} then {b}); negative or "
                "non-increasing temperatures are not allowed",
                "sort the values and remove duplicates",
            )


def check_chain_overrides(overrides, model: dict, name: str):
    """Several targets farmed at once: a list of model-field overrides, one per target."""
    path = "tempering.chain_overrides"
    if overrides is None:
        return
    if not isinstance(overrides, (list, tuple)) or not overrides or not all(isinstance(o, dict) for o in overrides):
        raise ConfigError(
            path,
            overrides,
            "must be a list of mappings of model fields, one per target",
            f"e.g. '{path}=[{{T:2.0}},{{T:2.5}}]' or {path}=null",
        )
    known = set(MODEL_RULES[name]) | MODEL_EXTRA[name]
    for i, ov in enumerate(overrides):
        for key, value in ov.items():
            if key not in known:
                raise ConfigError(
                    f"{path}[{i}].{key}",
                    value,
                    f"is not a field of model={name}",
                    f"use fields of the model: {', '.join(sorted(known))}",
                )
            if key in SHAPE_FIELDS[name] and value != model[key]:
                raise ConfigError(
                    f"{path}[{i}].{key}",
                    value,
                    "would change the shape of the state; every target farmed in one run shares it",
                    f"set model.{key} instead, or sweep it with pgmflow -m model.{key}=...",
                )
            if key in MODEL_RULES[name]:
                MODEL_RULES[name][key](f"{path}[{i}].{key}", value)


def check_custom_target(model: dict, explorer: str) -> Target:
    """Import the user's log-density and evaluate it on reference draws: finite values, right shape.
    Only modules on the allow-list (:func:`allowed_modules`) are imported. Returns the target it checked."""
    import numpy as np

    from pgmflow.tasks.tempering import targets

    for field in ("log_density", "grad_log_density"):
        path = f"model.{field}"
        spec = model.get(field)
        if field == "grad_log_density" and not spec:
            if explorer == "hmc":
                raise ConfigError(
                    path,
                    spec,
                    "HMC needs the gradient of the log-density",
                    "set model.grad_log_density=package.module:function or tempering.explorer=rwm",
                )
            continue
        if not isinstance(spec, str) or not spec:
            raise ConfigError(path, spec, "must name an importable callable", f"set {path}=package.module:function")
        check_importable(path, spec)
        try:
            targets.load_callable(spec)
        except Exception as exc:
            raise ConfigError(
                path,
                spec,
                f"cannot be imported ({type(exc).__name__}: {exc})",
                "check the module is on PYTHONPATH and the name is 'package.module:function'",
            ) from None
    target = build_target(model)
    t = target.task
    x = t.reference.sample(np.random.default_rng(0), 16)
    try:
        val = t.log_gamma(x)
    except Exception as exc:
        raise ConfigError(
            "model.log_density",
            model["log_density"],
            f"raised {type(exc).__name__}: {exc} on an input of shape {x.shape}",
            "make it map x [n, d] to log-densities [n]",
        ) from None
    if not np.all(np.isfinite(val) | (val == -np.inf)) or np.any(val == np.inf):
        raise ConfigError(
            "model.log_density",
            model["log_density"],
            "returned NaN or +inf on draws from the reference",
            "return finite values (or -inf outside the support) for every x",
        )
    if explorer == "hmc":
        g = t.grad_log_gamma(x)
        if not np.all(np.isfinite(g)):
            raise ConfigError(
                "model.grad_log_density",
                model["grad_log_density"],
                "returned NaN or inf on draws from the reference",
                "return finite gradients",
            )
    return target


def check_reference(t: dict, name: str):
    """tempering.reference=variational|stabilized: continuous targets and MRFs (products of independent
    spins); stabilized needs >= 2 levels per leg and the automatic ladder."""
    ref = t.get("reference", "fixed")
    if ref == "fixed":
        return
    if name == "mrf" and ref == "variational":  # the mean-field product built in: pgmflow.tempering.mrf
        return
    if not TARGETS[name].continuous and name != "mrf":  # stabilized on an MRF: uniform and product legs
        raise ConfigError(
            "tempering.reference",
            ref,
            "fits a Gaussian reference, which needs a continuous target",
            f"use tempering.reference=fixed with model={name}",
        )
    if ref == "stabilized" and t["n_replicas"] < 4:
        raise ConfigError(
            "tempering.n_replicas",
            t["n_replicas"],
            "is split between the two legs of reference=stabilized, which need at least 2 levels each",
            "set tempering.n_replicas>=4",
        )
    if ref == "stabilized" and t.get("ladder") is not None:
        raise ConfigError(
            "tempering.ladder",
            t["ladder"],
            "is one ladder; reference=stabilized has two legs",
            "set tempering.ladder=null (each leg starts from tempering.initial_schedule)",
        )


def tempering_settings(t: dict, explorer: str) -> TemperingSettings:
    """The validated ``tempering`` section, typed (``explorer``: resolved for the target)."""
    ladder = t.get("ladder")
    return TemperingSettings(
        n_replicas=int(t["n_replicas"]),
        n_rounds=int(t["n_rounds"]),
        n_chains=int(t["n_chains"]),
        explorer=explorer,
        explorer_requested=str(t["explorer"]),
        sweeps_per_scan=int(t["sweeps_per_scan"]),
        n_leapfrog=int(t["n_leapfrog"]),
        step_size=float(t["step_size"]),
        swap=str(t["swap"]),
        adapt_schedule=bool(t["adapt_schedule"]),
        initial_schedule=str(t["initial_schedule"]),
        schedule_power=float(t["schedule_power"]),
        n_blocks=None if t["n_blocks"] == "auto" else int(t["n_blocks"]),
        layout=str(t["layout"]),
        scans_per_task=None if t["scans_per_task"] == "auto" else int(t["scans_per_task"]),
        checkpoint_every=int(t["checkpoint_every"]),
        figures=bool(t["figures"]),
        reference=str(t.get("reference", "fixed")),
        variational_family=str(t.get("variational_family", "diagonal")),
        variational_from_round=int(t.get("variational_from_round", 0)),
        stabilized_split=str(t.get("stabilized_split", "adaptive")),
        ladder=None if not ladder else tuple(float(x) for x in ladder),
    )


def check_model(model: dict, name: str, explorer: str, reference: str = "fixed") -> Target:
    """The model section's own rules beyond the field types; returns the target, built once
    (``reference``: ``tempering.reference``, which an MRF target builds in)."""
    if name == "mrf":
        from pgmflow.tempering import mrf

        mrf.check_reference({"reference": reference})
        return TARGETS[name].build({**model, "reference": mrf.REFERENCES[reference]})
    if name == "gaussian_mixture":
        w = model.get("weights")
        if w is not None:
            if not isinstance(w, (list, tuple)) or len(w) != model["n_components"]:
                raise ConfigError(
                    "model.weights",
                    w,
                    f"must be a list of {model['n_components']} positive numbers (one per component)",
                    "set model.weights=null for equal weights",
                )
            for v in w:
                real(gt=0)("model.weights", v)
    if name == "custom":
        return check_custom_target(model, explorer)
    if name == "gaussian":
        d, rho = model["dim"], model["correlation"]
        if not -1.0 / max(d - 1, 1) < rho < 1.0:
            raise ConfigError(
                "model.correlation",
                rho,
                f"makes the covariance singular or indefinite for d={d}",
                f"use a value in ({-1.0 / max(d - 1, 1):.4g}, 1)",
            )
    if name == "bayes":
        from pgmflow.tempering.bayes import check_bayes

        return TARGETS[name].build(model, check_bayes(model, explorer))
    return build_target(model)


def check_tempering(cfg: dict) -> TemperingPlan:
    unknown_keys(cfg, "tempering", set(TEMPERING) | TEMPERING_OPTIONAL)
    apply(cfg, {f"tempering.{k}": r for k, r in TEMPERING.items()})
    t = cfg["tempering"]
    check_ladder(t.get("ladder"), t["n_replicas"])
    model = cfg["model"]
    name = model.get("name")
    if name not in MODELS:
        raise ConfigError(
            "model.name", name, "unknown target", "use model=ising, model=gaussian_mixture or model=custom"
        )
    unknown_keys(cfg, "model", set(MODEL_RULES[name]) | MODEL_EXTRA[name] | {"name"})
    apply(cfg, {f"model.{k}": r for k, r in MODEL_RULES[name].items()})
    explorer = TARGETS[name].resolve_explorer(t["explorer"])
    check_chain_overrides(t.get("chain_overrides"), model, name)
    target = check_model(model, name, explorer, t.get("reference", "fixed"))
    check_reference(t, name)

    bounds = None
    if cfg.get("bounds"):  # bounds=true: the variational bounds along the ladder (pgmflow.bounds)
        from pgmflow.bounds.validate import check_variational

        bounds = check_variational(cfg)
        if not target.supports_bounds:
            raise ConfigError(
                "bounds",
                True,
                f"variational bounds need a binary pairwise model, not model={name}",
                "use model=ising with bounds=true",
            )
    overrides = tuple(dict(ov) for ov in (t.get("chain_overrides") or [{}]))
    return TemperingPlan(
        seed=int(cfg["seed"]),
        tempering=tempering_settings(t, explorer),
        targets=tuple(target.variant(ov) for ov in overrides),
        overrides=overrides,
        bounds=bounds,
    )
