"""Validation of pipeline=sparse_gp: every field, then the data itself, then what depends on both; the
result is the run's typed plan (:class:`pgmflow.sparse_gp.plan.Plan`), the data read once."""

from __future__ import annotations

import math

from pgmflow.core.errors import ConfigError
from pgmflow.core.validation import apply, boolean, choice, get, integer, real, unknown_keys

SPARSE_GP = {
    "method": choice("sgpr", "fitc", "dtc", "svgp", "exact"),
    "m": integer(lo=1, hi=100_000),
    "variance": real(gt=0),
    "noise": real(gt=0),
    "optimize_inducing": boolean,
    "kmeans_iter": integer(lo=0),
    "kmeans_points": integer(lo=1),
    "chunk_size": integer(lo=1),
    "max_iter": integer(lo=1),
    "jitter": real(gt=0),
    "max_tries": integer(lo=1, hi=30),
    "test_fraction": real(ge=0),
    "standardize": boolean,
    "svgp_steps": integer(lo=1),
    "svgp_batch_size": integer(lo=1),
    "svgp_rho": real(gt=0),
    "svgp_lr": real(gt=0),
    "svgp_eval_every": integer(lo=1),
    "figures": boolean,
    "checkpoint_every": integer(lo=0),
    "in_process": choice("auto", True, False),
    "restarts": integer(lo=0, hi=1000),
}
# optional (a run recorded before the key existed is reproduced with its default: evaluate direct, a checkpoint
# at most every 5 s). Both evaluate values now mean one graph per evaluation (direct calls to the workers are
# gone; they gave the same bits)
SPARSE_GP_OPTIONAL = {
    "evaluate": choice("direct", "graph"),
    "checkpoint_every_seconds": real(ge=0),
    # SVGP's likelihood (pgmflow.tasks.gp.likelihoods); absent in configs recorded before it existed: gaussian
    "likelihood": choice("gaussian", "bernoulli", "poisson", "student_t"),
    "link": choice("probit", "logit"),
    "student_t_dof": real(gt=0),
    "quadrature_points": integer(lo=2, hi=200),
}
GP_SYNTHETIC = {
    "function": choice("friedman1", "sine_1d"),
    "n": integer(lo=2),
    "d": integer(lo=1),
    "noise_std": real(ge=0),
}


def check_sparse_gp(cfg: dict):
    """pipeline=sparse_gp: every field, then the data itself (read and checked -- every value finite,
    the target column present -- before any MLflow run starts), then what depends on both. Returns the
    run's :class:`~pgmflow.sparse_gp.plan.Plan`."""
    from pgmflow.sparse_gp import data as gp_data
    from pgmflow.sparse_gp.fit import EXACT_MAX_N, LOG_BOX
    from pgmflow.sparse_gp.plan import FitSettings, Plan, Start, SVGPSettings

    known = set(SPARSE_GP) | set(SPARSE_GP_OPTIONAL) | {"lengthscale", "slice_dim", "kernel", "kernel_params"}
    unknown_keys(cfg, "sparse_gp", known)
    apply(cfg, {f"sparse_gp.{k}": r for k, r in SPARSE_GP.items()})
    s = cfg["sparse_gp"]
    apply(cfg, {f"sparse_gp.{k}": r for k, r in SPARSE_GP_OPTIONAL.items() if k in s})
    lo, hi = (math.exp(v) for v in LOG_BOX)
    for key in ("variance", "noise"):
        if not lo <= s[key] <= hi:
            raise ConfigError(
                f"sparse_gp.{key}",
                s[key],
                f"must lie in [{lo:g}, {hi:g}] (the optimiser's box, in standardised units)",
                f"set sparse_gp.{key} to e.g. {1.0 if key == 'variance' else 0.1}",
            )
    ls = get(cfg, "sparse_gp.lengthscale")
    for v in ls if isinstance(ls, (list, tuple)) else [ls]:
        real(gt=0)("sparse_gp.lengthscale", v)
        if not lo <= v <= hi:
            raise ConfigError(
                "sparse_gp.lengthscale",
                ls,
                f"{v:g} is outside [{lo:g}, {hi:g}] (the optimiser's box, in standardised input units)",
                "start from e.g. sparse_gp.lengthscale=1.0",
            )
    if isinstance(ls, (list, tuple)) and not ls:
        raise ConfigError("sparse_gp.lengthscale", ls, "is an empty list", "give a number, or one per input")
    if not s["test_fraction"] < 1:
        raise ConfigError(
            "sparse_gp.test_fraction",
            s["test_fraction"],
            "must be below 1 (rows must be left to train on)",
            "use e.g. sparse_gp.test_fraction=0.2",
        )
    model = cfg.get("model") or {}
    if set(model) - {"name"} or model.get("name") != s["method"]:
        raise ConfigError(
            "model",
            model.get("name") if set(model) <= {"name"} else sorted(model),
            "pipeline=sparse_gp takes no model group (the model is sparse_gp.method with sparse_gp.kernel)",
            "drop the model= override and set sparse_gp.method / sparse_gp.kernel",
        )
    g = cfg.get("gp_data")
    if not isinstance(g, dict) or "kind" not in g:
        raise ConfigError(
            "gp_data",
            g,
            "pipeline=sparse_gp needs data",
            "use gp_data=synthetic, gp_data=diabetes, gp_data=co2, or gp_data=csv|npz|npy gp_data.path=FILE",
        )
    if g["kind"] not in gp_data.KINDS:
        raise ConfigError("gp_data.kind", g["kind"], "unknown data source", f"use one of: {', '.join(gp_data.KINDS)}")
    unknown_keys(cfg, "gp_data", gp_data.KEYS[g["kind"]])
    if g["kind"] == "synthetic":
        apply(cfg, {f"gp_data.{k}": r for k, r in GP_SYNTHETIC.items()})
        if g["function"] == "friedman1" and g["d"] < 5:
            raise ConfigError("gp_data.d", g["d"], "Friedman #1 needs at least 5 inputs", "set gp_data.d=5 or more")
    data = gp_data.resolve(cfg)
    if isinstance(ls, (list, tuple)) and len(ls) not in (1, data.d):
        raise ConfigError(
            "sparse_gp.lengthscale",
            ls,
            f"has {len(ls)} entries but the data has {data.d} inputs",
            "give one number, or one per input",
        )
    kernel, kernel_setup = _kernel(s, data.d)
    j_slice = gp_data.slice_dim(s.get("slice_dim"), data)
    if g.get("test_path") and s["method"] == "exact":
        raise ConfigError(
            "gp_data.test_path",
            g["test_path"],
            "is not scored by the exact GP yet",
            "use sparse_gp.method=sgpr (or hold rows out with sparse_gp.test_fraction)",
        )
    if g.get("forecast_from") is not None and s["method"] == "exact":
        raise ConfigError(
            "gp_data.forecast_from",
            g["forecast_from"],
            "is not scored by the exact GP yet",
            "use sparse_gp.method=sgpr with a large sparse_gp.m",
        )
    test_rows = gp_data.read_test_file(cfg, data)  # read and checked before any run starts
    likelihood, data = _likelihood(s, data, test_rows)
    if s["method"] == "exact":
        if data.n_train > EXACT_MAX_N:
            raise ConfigError(
                "sparse_gp.method",
                "exact",
                f"the exact GP factors an n x n matrix and the data has "
                f"n = {data.n_train} training rows, more than {EXACT_MAX_N}",
                "use sparse_gp.method=sgpr (or svgp) for data this large",
            )
    elif s["m"] > data.n_train:
        raise ConfigError(
            "sparse_gp.m",
            s["m"],
            f"is more inducing inputs than the {data.n_train} training rows (m > n) of {data.source}",
            f"use sparse_gp.m={data.n_train} or fewer (usually far fewer)",
        )
    return Plan(
        seed=int(cfg["seed"]),
        method=str(s["method"]),
        kernel=kernel,
        kernel_setup=kernel_setup,
        m=int(s["m"]),
        chunk_size=int(s["chunk_size"]),
        test_fraction=float(s["test_fraction"]),
        kmeans_iter=int(s["kmeans_iter"]),
        kmeans_points=int(s["kmeans_points"]),
        in_process=s["in_process"],
        figures=bool(s["figures"]),
        slice_dim=j_slice,
        start=Start(
            tuple(float(v) for v in ls) if isinstance(ls, (list, tuple)) else float(ls),
            float(s["variance"]),
            float(s["noise"]),
        ),
        fit=FitSettings(
            max_iter=int(s["max_iter"]),
            jitter=float(s["jitter"]),
            max_tries=int(s["max_tries"]),
            optimize_inducing=bool(s["optimize_inducing"]),
            checkpoint_every=int(s["checkpoint_every"]),
            restarts=int(s["restarts"]),
            evaluate=str(s.get("evaluate", "direct")),
            checkpoint_every_seconds=float(s.get("checkpoint_every_seconds", 5.0)),
        ),
        svgp=SVGPSettings(
            steps=int(s["svgp_steps"]),
            batch_size=int(s["svgp_batch_size"]),
            rho=float(s["svgp_rho"]),
            lr=float(s["svgp_lr"]),
            eval_every=int(s["svgp_eval_every"]),
        ),
        data=data,
        test_rows=test_rows,
        likelihood=likelihood,
    )


def _kernel(s: dict, d: int):
    """``(kernel, KernelSetup or None)``: a named kernel of earlier versions as its string (the old path, the
    old bits), anything else as an object (``pipelines/sparse_gp/kernel_config.py``)."""
    from pgmflow.sparse_gp import kernel_config

    text, kp = s.get("kernel"), s.get("kernel_params")
    if kp is not None and not isinstance(kp, dict):
        raise ConfigError("sparse_gp.kernel_params", kp, "must be a mapping", "e.g. {rbf: {lengthscale: 2.0}}")
    if kernel_config.is_named(text, kp):
        return text.strip(), None
    ks = kernel_config.setup(text, kp, d, get({"sparse_gp": s}, "sparse_gp.lengthscale"))
    if s["restarts"]:
        raise ConfigError(
            "sparse_gp.restarts",
            s["restarts"],
            "restarts draw ARD lengthscales per input; a composed kernel takes its starting point from "
            "sparse_gp.kernel_params",
            "set sparse_gp.restarts=0 (or use kernel rbf / matern32 / matern52)",
        )
    return ks.kernel, ks


def _likelihood(s: dict, data, test_rows):
    """``(Likelihood, data)``: SVGP's likelihood (``sparse_gp.likelihood``, ``link``, ``student_t_dof``,
    ``quadrature_points``), refused with a method that assumes a Gaussian one or with targets it cannot
    take (labels outside {0, 1}, counts that are not integers >= 0). Bernoulli and Poisson targets are
    never standardised (labels and counts stay as they are); the inputs are, with ``sparse_gp.standardize``."""
    import numpy as np

    from pgmflow.tasks.gp.likelihoods import Likelihood, check_targets

    name = s.get("likelihood", "gaussian")
    lik = Likelihood(
        name,
        str(s.get("link", "probit")),
        float(s.get("student_t_dof", 4.0)),
        int(s.get("quadrature_points", 20)),
    )
    if name == "gaussian":
        return lik, data
    if s["method"] != "svgp":
        raise ConfigError(
            "sparse_gp.likelihood",
            name,
            f"is not taken by sparse_gp.method={s['method']} (sgpr, dtc, fitc and exact assume a Gaussian "
            "likelihood; only svgp fits others)",
            "use sparse_gp.method=svgp, or sparse_gp.likelihood=gaussian",
        )
    y = data.y if data.y is not None else np.asarray(data.rows[:, data.target_col], dtype=np.float64)
    for where, values in (("", y), (" (gp_data.test_path)", None if test_rows is None else test_rows.y)):
        why = None if values is None else check_targets(lik, values)
        if why:
            fix = (
                "give the classes as 0 and 1 (or use sparse_gp.likelihood=gaussian)"
                if name == "bernoulli"
                else "give counts as integers >= 0 (or use sparse_gp.likelihood=gaussian)"
            )
            raise ConfigError(
                "sparse_gp.likelihood", name, f"the target '{data.target_name}' of {data.source}{where}: {why}", fix
            )
    if name in ("bernoulli", "poisson"):  # labels and counts are modelled as they are
        data = data._replace(standardizer=data.standardizer._replace(y_mean=0.0, y_std=1.0))
    return lik, data
