"""Preflight checks: every field of the composed config is validated before anything runs.

The core checks what every run shares (top-level keys and types, the cluster section, the backend);
the workload named by ``pipeline.name`` checks its own sections (its ``validate``). Raises
:class:`ConfigError` on the first problem.
"""

from __future__ import annotations

from pgmflow.core import registry
from pgmflow.core.config import conf_dir, conf_keys
from pgmflow.core.errors import ConfigError
from pgmflow.core.validation import (
    ALLOWED_MODULES_ENV,
    apply,
    boolean,
    choice,
    get,
    integer,
    optional_str,
    real,
    unknown_keys,
)


def registered_model_name(path, v):
    """``tracking.register_model``: null, or the non-empty name of a registered model."""
    if v is None:
        return
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(
            path,
            v,
            "must be the name of a registered model (a non-empty string) or null",
            f"set {path}=my_model, or {path}=null to log the model without registering it",
        )
    if v != v.strip() or "/" in v or ":" in v:
        raise ConfigError(
            path,
            v,
            "a registered model's name has no '/', ':' or surrounding spaces (models:/NAME/VERSION would not resolve)",
            f"set {path} to a plain name like my_model",
        )


TOP = {
    "seed": integer(lo=0, hi=2**63 - 1),
    "backend": choice("auto", "numpy", "cupy"),
    "progress": boolean,
    "verbose": boolean,
    "resume": optional_str,
    "tracking.uri": optional_str,
    "tracking.experiment": optional_str,
    "tracking.register_model": registered_model_name,
    "cache.mode": choice("auto", "off", "refresh", "readonly"),
    "cache.env": choice("normal", "strict"),
    "cache.verify": lambda path, v: _fraction(path, v),
}


def _fraction(path, v):
    real(ge=0.0)(path, v)
    if v > 1:
        raise ConfigError(path, v, "must be a fraction in [0, 1]", f"set {path}=0.1 (a tenth of the hits) or 0")


def check_backend(cfg: dict):
    if cfg["backend"] == "cupy":
        from pgmflow.tasks import backend

        ok, why = backend.gpu_status()
        if not ok:
            raise ConfigError(
                "backend",
                "cupy",
                f"no usable GPU: {why}",
                "use backend=numpy (or auto), or install pgmflow[gpu] on a machine with a CUDA GPU",
            )


# A key that looks like a way to widen the allow-list of importable modules gets that answer.
_ALLOW_LIST_LIKE = ("allowed_modules", "allow_list", "allowlist")


def check_unknown_top_level(cfg: dict):
    """Refuse keys that no config defines (``+foo=1``, a typo): pgmflow would ignore them silently."""
    try:
        top, sections = conf_keys(conf_dir(), *registry.extra_conf_dirs())
    except RuntimeError:  # no conf/ to read the known keys from (pgmflow could not have composed cfg either)
        return
    for key in cfg:
        if key in top:
            continue
        if any(w in str(key).lower() for w in _ALLOW_LIST_LIKE):
            raise ConfigError(
                str(key),
                cfg[key],
                "unknown key: the allow-list of modules a config may import is never read from the config",
                f"drop it and export {ALLOWED_MODULES_ENV}=module in the shell that runs pgmflow",
            )
        import difflib

        near = difflib.get_close_matches(str(key), sorted(top), n=1)
        hint = f"did you mean {near[0]}?" if near else f"known top-level keys: {', '.join(sorted(top - {'hydra'}))}"
        raise ConfigError(
            str(key),
            cfg[key],
            "unknown top-level key (no config defines it, so nothing would read it)",
            f"{hint} (pgmflow --cfg job shows every key)",
        )
    for section in ("cluster", "tracking"):  # sections that are wholly defined by their config group
        if isinstance(cfg.get(section), dict) and section in sections:
            unknown_keys(cfg, section, sections[section])


def _flag_types(cfg: dict):
    """Flags that workloads add (``bounds=true`` of tempering) are booleans, checked with the other
    top-level keys, whatever the pipeline."""
    for wl in registry.workloads():
        for flag in wl.flags:
            if flag in cfg:
                boolean(flag, cfg[flag])


def check_flags(cfg: dict, name: str):
    """A flag set true only under a workload that declares it; elsewhere its own sentence and fix."""
    for wl in registry.workloads():
        for flag, (what, fix) in wl.flags.items():
            if cfg.get(flag) and flag not in registry.get(name).flags:
                raise ConfigError(flag, True, f"{what}, not pipeline={name}", fix)


def preflight_checks(cfg: dict):
    """Validate a resolved config (plain dict) and return the workload's plan: what its ``validate``
    returns, a frozen typed value that ``run(ctx, plan)`` works from (the settings with their types and
    the inputs resolved once). Raises ConfigError on the first problem."""
    check_unknown_top_level(cfg)
    apply(cfg, TOP)
    _flag_types(cfg)
    name = get(cfg, "pipeline.name")
    workload = registry.get(name)  # an unknown pipeline.name: one line listing the workloads found
    from pgmflow.core import cluster

    cluster.check_cluster_config(cfg.get("cluster") or {})
    plan = workload.load_validate()(cfg)
    check_flags(cfg, name)
    check_backend(cfg)
    return plan
