"""The task-side target of a validated model section, and the explorer that suits it."""

from __future__ import annotations

from pgmflow.pipelines.core.errors import ConfigError

MODELS = ("ising", "gaussian_mixture", "custom", "gaussian", "bayes")


def build_target(model: dict):
    """The task-side target object for a validated model section."""
    from pgmflow.tasks.tempering import targets

    name = model["name"]
    if name == "ising":
        return targets.make_ising(model["L"], model["T"], model["J"], model["h"], model["couplings"],
                                  model["disorder_seed"])
    if name == "gaussian_mixture":
        return targets.make_gaussian_mixture(model["dim"], model["n_components"], model["separation"],
                                             model["sigma"], model["reference_scale"], model["target_seed"],
                                             model.get("weights"))
    if name == "custom":
        return targets.CustomTarget(log_density=model["log_density"],
                                    grad_log_density=model.get("grad_log_density") or "",
                                    reference=targets.GaussianReference(model["dim"], float(model["reference_scale"])))
    if name == "gaussian":
        from pgmflow.tasks.tempering.gaussian_target import make_correlated_gaussian

        return make_correlated_gaussian(model["dim"], model["shift"], model["scale_min"], model["scale_max"],
                                        model["correlation"], model["reference_scale"])
    if name == "bayes":
        from pgmflow.pipelines.tempering.bayes import build_bayes

        return build_bayes(model)
    raise ConfigError("model.name", name, "unknown target", f"use one of {', '.join(MODELS)}")


def resolve_explorer(explorer: str, model_name: str) -> str:
    if model_name == "ising":
        if explorer == "auto":
            return "heatbath"
        if explorer not in ("metropolis", "heatbath"):
            raise ConfigError("tempering.explorer", explorer, "is for continuous targets, the Ising model needs "
                              "spin updates", "set tempering.explorer=heatbath or metropolis")
        return explorer
    if explorer == "auto":
        return "hmc" if model_name in ("gaussian_mixture", "gaussian") else "rwm"
    if explorer not in ("rwm", "hmc"):
        raise ConfigError("tempering.explorer", explorer, "is an Ising spin update, the target is continuous",
                          "set tempering.explorer=rwm or hmc")
    return explorer

