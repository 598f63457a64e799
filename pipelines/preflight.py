"""Preflight checks: every field of the composed config is validated before anything runs.

Declarative rules (scikit-learn style) with one message format (:class:`ConfigError`): the
field, the value, the problem and the fix. ``preflight_checks(cfg)`` raises on the first problem.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
from pathlib import Path
from typing import Callable

from pipelines.errors import ConfigError

PIPELINES = ("tempering", "svi", "tesla", "bounds", "sparse_gp")
MODELS = ("ising", "gaussian_mixture", "custom")
SVI_MODELS = ("lda",)


# --- rules -------------------------------------------------------------------------------------

def _get(cfg: dict, path: str):
    node = cfg
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(path, "<missing>", "required field is missing",
                              f"add {path}=... or restore the default config")
        node = node[part]
    return node


def integer(lo: int | None = None, hi: int | None = None, even: bool = False, allow: tuple = ()) -> Callable:
    def check(path, v):
        if v in allow and not isinstance(v, bool):
            return
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            alt = f" or one of {', '.join(map(str, allow))}" if allow else ""
            raise ConfigError(path, v, f"must be an integer{alt}", f"set {path} to a whole number")
        if lo is not None and v < lo:
            raise ConfigError(path, v, f"must be >= {lo}", f"set {path}={lo} or larger")
        if hi is not None and v > hi:
            raise ConfigError(path, v, f"must be <= {hi}", f"set {path}={hi} or smaller")
        if even and v % 2:
            raise ConfigError(path, v, "must be even (checkerboard updates on a periodic lattice)",
                              f"set {path}={v + 1}")
    return check


def real(gt: float | None = None, ge: float | None = None, nonzero: bool = False) -> Callable:
    def check(path, v):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise ConfigError(path, v, "must be a number", f"set {path} to a finite number")
        if not math.isfinite(v):
            raise ConfigError(path, v, "must be finite", f"set {path} to a finite number")
        if gt is not None and not v > gt:
            raise ConfigError(path, v, f"must be > {gt}", f"set {path} to a value above {gt}")
        if ge is not None and not v >= ge:
            raise ConfigError(path, v, f"must be >= {ge}", f"set {path}={ge} or larger")
        if nonzero and v == 0:
            raise ConfigError(path, v, "must not be zero", f"set {path} to a non-zero value")
    return check


def choice(*options) -> Callable:
    def check(path, v):
        if v not in options:
            raise ConfigError(path, v, f"unknown value; expected one of {', '.join(map(str, options))}",
                              f"set {path}={options[0]}")
    return check


def boolean(path, v):
    if not isinstance(v, bool):
        raise ConfigError(path, v, "must be true or false", f"set {path}=true or {path}=false")


def optional_str(path, v):
    if v is not None and not isinstance(v, str):
        raise ConfigError(path, v, "must be a string or null", f"set {path}=null or a string")


def _apply(cfg: dict, rules: dict[str, Callable]):
    for path, rule in rules.items():
        rule(path, _get(cfg, path))


def _unknown_keys(cfg: dict, section: str, known):
    node = cfg.get(section) or {}
    for key in node:
        if key not in known:
            import difflib

            near = difflib.get_close_matches(key, list(known), n=1)
            hint = f"did you mean {section}.{near[0]}?" if near else f"known keys: {', '.join(sorted(known))}"
            raise ConfigError(f"{section}.{key}", node[key], "unknown key", hint)


# --- sections ----------------------------------------------------------------------------------

TOP = {
    "seed": integer(lo=0, hi=2**63 - 1),
    "backend": choice("auto", "numpy", "cupy"),
    "progress": boolean,
    "verbose": boolean,
    "resume": optional_str,
    "bounds": boolean,
    "pipeline.name": choice(*PIPELINES),
    "tracking.uri": optional_str,
    "tracking.experiment": optional_str,
}

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
}
TEMPERING_OPTIONAL = {"ladder", "chain_overrides"}
SHAPE_FIELDS = {"ising": ("L",), "gaussian_mixture": ("dim",), "custom": ("dim",)}

MODEL_RULES = {
    "ising": {"L": integer(lo=2, hi=1 << 15, even=True), "T": real(gt=0), "J": real(nonzero=True), "h": real(),
              "couplings": choice("ferromagnetic", "antiferromagnetic", "spin_glass"),
              "disorder_seed": integer(lo=0)},
    "gaussian_mixture": {"dim": integer(lo=1, hi=10_000), "n_components": integer(lo=1, hi=10_000),
                         "separation": real(ge=0), "sigma": real(gt=0), "reference_scale": real(gt=0),
                         "target_seed": integer(lo=0)},
    "custom": {"dim": integer(lo=1, hi=100_000), "reference_scale": real(gt=0)},
}
MODEL_EXTRA = {"ising": set(), "gaussian_mixture": {"weights"}, "custom": {"log_density", "grad_log_density"}}


def check_ladder(ladder, n_replicas):
    path = "tempering.ladder"
    if ladder is None:
        return
    if not isinstance(ladder, (list, tuple)) or len(ladder) < 2:
        raise ConfigError(path, ladder, "must be a list of at least two annealing parameters b in [0, 1]",
                          f"set {path}=null (automatic) or e.g. {path}=[0,0.25,0.5,1]")
    for v in ladder:
        real(ge=0)(path, v)
    if ladder[0] != 0 or ladder[-1] != 1:
        raise ConfigError(path, ladder, "must start at 0 (the reference) and end at 1 (the target)",
                          "make the first entry 0 and the last 1")
    for a, b in zip(ladder, ladder[1:]):
        if not b > a:
            raise ConfigError(path, ladder, f"must be strictly increasing (found {a} then {b}); negative or "
                              "non-increasing temperatures are not allowed",
                              "sort the values and remove duplicates")


def check_chain_overrides(overrides, model: dict, name: str):
    """Several targets farmed at once: a list of model-field overrides, one per target."""
    path = "tempering.chain_overrides"
    if overrides is None:
        return
    if not isinstance(overrides, (list, tuple)) or not overrides or not all(isinstance(o, dict) for o in overrides):
        raise ConfigError(path, overrides, "must be a list of mappings of model fields, one per target",
                          f"e.g. '{path}=[{{T:2.0}},{{T:2.5}}]' or {path}=null")
    known = set(MODEL_RULES[name]) | MODEL_EXTRA[name]
    for i, ov in enumerate(overrides):
        for key, value in ov.items():
            if key not in known:
                raise ConfigError(f"{path}[{i}].{key}", value, f"is not a field of model={name}",
                                  f"use fields of the model: {', '.join(sorted(known))}")
            if key in SHAPE_FIELDS[name] and value != model[key]:
                raise ConfigError(f"{path}[{i}].{key}", value, "would change the shape of the state; every "
                                  "target farmed in one run shares it", f"set model.{key} instead, or sweep it "
                                  f"with pgmflow -m model.{key}=...")
            if key in MODEL_RULES[name]:
                MODEL_RULES[name][key](f"{path}[{i}].{key}", value)


ALLOWED_MODULES_ENV = "PGMFLOW_ALLOWED_MODULES"
ALLOWED_MODULES_BUILTIN = ("tasks",)  # pgmflow's own numerics (the shipped example densities live there)


def allowed_modules() -> tuple[str, ...]:
    """Module prefixes a config may import code from: pgmflow's ``tasks`` plus the comma-separated
    prefixes in the environment variable ``PGMFLOW_ALLOWED_MODULES``. The list comes from the
    environment, never from the config, so a command-line override cannot widen it."""
    extra = os.environ.get(ALLOWED_MODULES_ENV, "")
    return ALLOWED_MODULES_BUILTIN + tuple(p.strip() for p in extra.split(",") if p.strip())


def check_importable(path: str, spec: str):
    """Refuse, before importing anything, a ``package.module:function`` outside the allow-list."""
    mod = spec.partition(":")[0] if ":" in spec else spec.rpartition(".")[0]
    allowed = allowed_modules()
    if not mod or not any(mod == p or mod.startswith(p + ".") for p in allowed):
        top = (mod or spec).split(".")[0]
        raise ConfigError(path, spec, f"module {mod or spec!r} is not on the allow-list of modules a config may "
                          f"import ({', '.join(allowed)}), so that a command-line override cannot run arbitrary "
                          "code", f"export {ALLOWED_MODULES_ENV}={top} (comma-separated module prefixes) in the "
                          "shell that runs pgmflow")


def check_custom_target(model: dict, explorer: str):
    """Import the user's log-density and evaluate it on reference draws: finite values, right shape.
    Only modules on the allow-list (:func:`allowed_modules`) are imported."""
    import numpy as np

    from tasks.tempering import targets

    for field in ("log_density", "grad_log_density"):
        path = f"model.{field}"
        spec = model.get(field)
        if field == "grad_log_density" and not spec:
            if explorer == "hmc":
                raise ConfigError(path, spec, "HMC needs the gradient of the log-density",
                                  "set model.grad_log_density=package.module:function or tempering.explorer=rwm")
            continue
        if not isinstance(spec, str) or not spec:
            raise ConfigError(path, spec, "must name an importable callable",
                              f"set {path}=package.module:function")
        check_importable(path, spec)
        try:
            targets.load_callable(spec)
        except Exception as exc:
            raise ConfigError(path, spec, f"cannot be imported ({type(exc).__name__}: {exc})",
                              "check the module is on PYTHONPATH and the name is 'package.module:function'") from None
    t = build_target(model)
    x = t.reference.sample(np.random.default_rng(0), 16)
    try:
        val = t.log_gamma(x)
    except Exception as exc:
        raise ConfigError("model.log_density", model["log_density"], f"raised {type(exc).__name__}: {exc} "
                          f"on an input of shape {x.shape}", "make it map x [n, d] to log-densities [n]") from None
    if not np.all(np.isfinite(val) | (val == -np.inf)) or np.any(val == np.inf):
        raise ConfigError("model.log_density", model["log_density"],
                          "returned NaN or +inf on draws from the reference", "return finite values (or -inf "
                          "outside the support) for every x")
    if explorer == "hmc":
        g = t.grad_log_gamma(x)
        if not np.all(np.isfinite(g)):
            raise ConfigError("model.grad_log_density", model["grad_log_density"],
                              "returned NaN or inf on draws from the reference", "return finite gradients")


def build_target(model: dict):
    """The task-side target object for a validated model section."""
    from tasks.tempering import targets

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
        return "hmc" if model_name == "gaussian_mixture" else "rwm"
    if explorer not in ("rwm", "hmc"):
        raise ConfigError("tempering.explorer", explorer, "is an Ising spin update, the target is continuous",
                          "set tempering.explorer=rwm or hmc")
    return explorer


def check_tempering(cfg: dict):
    _unknown_keys(cfg, "tempering", set(TEMPERING) | TEMPERING_OPTIONAL)
    _apply(cfg, {f"tempering.{k}": r for k, r in TEMPERING.items()})
    t = cfg["tempering"]
    check_ladder(t.get("ladder"), t["n_replicas"])
    model = cfg["model"]
    name = model.get("name")
    if name not in MODELS:
        raise ConfigError("model.name", name, "unknown target", "use model=ising, model=gaussian_mixture or "
                          "model=custom")
    _unknown_keys(cfg, "model", set(MODEL_RULES[name]) | MODEL_EXTRA[name] | {"name"})
    _apply(cfg, {f"model.{k}": r for k, r in MODEL_RULES[name].items()})
    explorer = resolve_explorer(t["explorer"], name)
    check_chain_overrides(t.get("chain_overrides"), model, name)
    if name == "gaussian_mixture":
        w = model.get("weights")
        if w is not None:
            if not isinstance(w, (list, tuple)) or len(w) != model["n_components"]:
                raise ConfigError("model.weights", w, f"must be a list of {model['n_components']} positive numbers "
                                  "(one per component)", "set model.weights=null for equal weights")
            for v in w:
                real(gt=0)("model.weights", v)
    if name == "custom":
        check_custom_target(model, explorer)


SVI = {
    "batch_size": integer(lo=1),
    "tau0": real(ge=0),
    "n_epochs": integer(lo=1),
    "estep_max_iter": integer(lo=1, hi=100_000),
    "estep_tol": real(gt=0),
    "eval_every": integer(lo=0),
    "checkpoint_every": integer(lo=0),
    "keep_in_memory": boolean,
    "top_words": integer(lo=1, hi=1000),
    "figures": boolean,
}
LDA = {"K": integer(lo=2, hi=100_000)}
PR_KEYS = {"seed_words", "seed_mass", "topic_cap", "max_iter", "tol"}
CORPUS_KEYS = {
    "shipped": {"name"},
    "synthetic": {"n_docs", "n_words", "n_topics", "alpha", "eta", "mean_length", "seed", "docs_per_shard",
                  "cache_dir"},
    "uci": {"docword", "vocab", "docs_per_shard", "cache_dir"},
    "text": {"folder", "pattern", "min_df", "max_df", "max_vocab", "stop_words", "docs_per_shard", "cache_dir"},
    "matrix_market": {"path", "vocab", "transpose", "docs_per_shard", "cache_dir"},
    "npz": {"path", "docs_per_shard", "cache_dir"},
    "sharded": {"path"},
}
SYNTHETIC = {"n_docs": integer(lo=1), "n_words": integer(lo=2), "n_topics": integer(lo=1), "alpha": real(gt=0),
             "eta": real(gt=0), "mean_length": real(gt=0), "seed": integer(lo=0), "docs_per_shard": integer(lo=1)}


def _optional_positive(path, v):
    if v is not None:
        real(gt=0)(path, v)


def check_svi(cfg: dict):
    """Every field of an SVI run, then the corpus itself (converted and checked before any task runs)."""
    _unknown_keys(cfg, "svi", set(SVI) | {"kappa", "max_steps", "heldout_fraction", "max_heldout_docs"})
    _apply(cfg, {f"svi.{k}": r for k, r in SVI.items()})
    s = cfg["svi"]
    kappa = _get(cfg, "svi.kappa")
    real()("svi.kappa", kappa)
    if not 0.5 < float(kappa) <= 1.0:
        raise ConfigError("svi.kappa", kappa, "must lie in (0.5, 1] for the step sizes to satisfy Robbins-Monro "
                          "(sum rho = inf, sum rho^2 < inf)", "use e.g. svi.kappa=0.7")
    if s.get("max_steps") is not None:
        integer(lo=1)("svi.max_steps", s["max_steps"])
    f = _get(cfg, "svi.heldout_fraction")
    real(ge=0)("svi.heldout_fraction", f)
    if f >= 1:
        raise ConfigError("svi.heldout_fraction", f, "must be below 1 (some documents must be left for training)",
                          "use e.g. svi.heldout_fraction=0.05")
    if s.get("max_heldout_docs") is not None:
        integer(lo=1)("svi.max_heldout_docs", s["max_heldout_docs"])
    model = cfg.get("model") or {}
    if model.get("name") not in SVI_MODELS:
        raise ConfigError("model", model.get("name"), "pipeline=svi fits topic models",
                          "use model=lda (or drop the model= override)")
    _unknown_keys(cfg, "model", set(LDA) | {"name", "alpha", "eta"})
    _apply(cfg, {f"model.{k}": r for k, r in LDA.items()})
    _optional_positive("model.alpha", model.get("alpha"))
    _optional_positive("model.eta", model.get("eta"))
    _unknown_keys(cfg, "pr", PR_KEYS)
    pr = cfg.get("pr") or {}
    mass = pr.get("seed_mass", 0.7)
    if not isinstance(mass, dict):  # a dict (per topic) is checked by make_pr_config
        real(gt=0)("pr.seed_mass", mass)
        if mass > 1:
            raise ConfigError("pr.seed_mass", mass, "no distribution over topics can put more than all its mass "
                              "on one topic", "use a mass in (0, 1]")
    if pr.get("topic_cap") is not None:
        real()("pr.topic_cap", pr["topic_cap"])
        if pr["topic_cap"] < 1:
            raise ConfigError("pr.topic_cap", pr["topic_cap"], "no distribution can satisfy it: every token puts "
                              "mass 1 on some topic, so sum_k max_n q_n(k) >= 1", "use pr.topic_cap >= 1 (or null)")
    integer(lo=1)("pr.max_iter", pr.get("max_iter", 200))
    real(gt=0)("pr.tol", pr.get("tol", 1e-6))
    c = cfg.get("corpus")
    if not isinstance(c, dict) or "kind" not in c:
        raise ConfigError("corpus", c, "pipeline=svi needs a corpus", "use corpus=docstrings, corpus=synthetic, "
                          "corpus=uci corpus.docword=... corpus.vocab=..., corpus=text corpus.folder=...")
    from pipelines import corpora

    if c["kind"] not in CORPUS_KEYS:
        raise ConfigError("corpus.kind", c["kind"], "unknown corpus source", f"use one of: {', '.join(CORPUS_KEYS)}")
    _unknown_keys(cfg, "corpus", CORPUS_KEYS[c["kind"]] | {"kind"})
    if c["kind"] == "synthetic":
        _apply(cfg, {f"corpus.{k}": r for k, r in SYNTHETIC.items()})
    elif "docs_per_shard" in c:
        integer(lo=1)("corpus.docs_per_shard", c["docs_per_shard"])
    info = corpora.resolve(cfg)
    corpora.pr_config(cfg, info)  # word lookups and feasibility


TESLA_KEYS = {"methods", "lambda1", "lambda2", "bandwidth", "criterion", "ebic_gamma", "heldout_fraction", "rule",
              "max_iter", "tol", "snapshot_times", "figures"}
TESLA = {
    "criterion": choice("bic", "ebic", "heldout"),
    "ebic_gamma": real(ge=0),
    "rule": choice("and", "or"),
    "max_iter": integer(lo=1),
    "tol": real(gt=0),
    "figures": boolean,
}
TESLA_METHODS = ("tesla", "keller", "static")
NETWORK_SYNTHETIC = {
    "p": integer(lo=2, hi=2000),
    "T": integer(lo=1),
    "samples_per_time": integer(lo=1),
    "rewire_every": integer(lo=1),
    "n_rewire": integer(lo=0),
    "max_degree": integer(lo=1),
    "weight_low": real(ge=0),
    "weight_high": real(gt=0),
    "ramp": integer(lo=0),
    "field": real(),
    "burn_in": integer(lo=1),
}


def _number_list(path, v, *, ge=None, gt=None, nonempty=True):
    if not isinstance(v, (list, tuple)) or (nonempty and len(v) == 0):
        raise ConfigError(path, v, "must be a non-empty list of numbers", f"set {path}=[0.1,0.05] (a list)")
    for x in v:
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x):
            raise ConfigError(path, v, f"{x!r} is not a finite number", f"list only finite numbers in {path}")
        if ge is not None and x < ge:
            raise ConfigError(path, v, f"{x:g} is negative; penalties must be >= {ge}", f"use values >= {ge} in {path}")
        if gt is not None and not x > gt:
            raise ConfigError(path, v, f"{x:g} must be > {gt}", f"use values above {gt} in {path}")
    if len(set(float(x) for x in v)) != len(v):
        raise ConfigError(path, v, "has repeated values", f"list each value of {path} once")


def check_tesla(cfg: dict):
    """Every field of a TESLA run, then the data itself (loaded and checked before any task runs)."""
    _unknown_keys(cfg, "tesla", TESLA_KEYS)
    _apply(cfg, {f"tesla.{k}": r for k, r in TESLA.items()})
    t = cfg["tesla"]
    methods = _get(cfg, "tesla.methods")
    if not isinstance(methods, (list, tuple)) or not methods:
        raise ConfigError("tesla.methods", methods, "must be a non-empty list", "use tesla.methods=[tesla,keller,static]")
    for m in methods:
        if m not in TESLA_METHODS:
            raise ConfigError("tesla.methods", methods, f"unknown method {m!r}",
                              f"use any of {', '.join(TESLA_METHODS)}")
    if len(set(methods)) != len(methods):
        raise ConfigError("tesla.methods", methods, "lists a method twice", "list each method once")
    _number_list("tesla.lambda1", _get(cfg, "tesla.lambda1"), ge=0)
    _number_list("tesla.lambda2", _get(cfg, "tesla.lambda2"), ge=0)
    _number_list("tesla.bandwidth", _get(cfg, "tesla.bandwidth"), gt=0)
    f = _get(cfg, "tesla.heldout_fraction")
    real(gt=0)("tesla.heldout_fraction", f)
    if t["criterion"] == "heldout" and not f < 1:
        raise ConfigError("tesla.heldout_fraction", f, "must be below 1 (samples must be left to fit)",
                          "use e.g. tesla.heldout_fraction=0.2")
    model = cfg.get("model") or {}
    if model.get("name") != "tesla":
        raise ConfigError("model", model.get("name"), "pipeline=tesla estimates time-varying networks",
                          "use model=tesla (or drop the model= override)")
    _unknown_keys(cfg, "model", {"name", "q"})
    choice(1, 2)("model.q", _get(cfg, "model.q"))
    n = cfg.get("network")
    if not isinstance(n, dict) or "kind" not in n:
        raise ConfigError("network", n, "pipeline=tesla needs data", "use network=synthetic, or network=npz "
                          "network.path=FILE.npz, or network=csv network.path=FILE.csv")
    from pipelines import networks

    if n["kind"] not in networks.KINDS:
        raise ConfigError("network.kind", n["kind"], "unknown data source", f"use one of: {', '.join(networks.KINDS)}")
    if n["kind"] == "synthetic":
        _unknown_keys(cfg, "network", set(networks.SYNTHETIC_KEYS) | {"kind"})
        _apply(cfg, {f"network.{k}": r for k, r in NETWORK_SYNTHETIC.items()})
        if n.get("n_edges") is not None:
            integer(lo=0)("network.n_edges", n["n_edges"])
        if n["weight_low"] > n["weight_high"]:
            raise ConfigError("network.weight_low", n["weight_low"], f"is above network.weight_high={n['weight_high']}",
                              "swap them")
    else:
        _unknown_keys(cfg, "network", {"kind", "path", "truth"})
    data = networks.resolve(cfg)
    T = len(data.series.n_per_time)
    if T == 1 and "tesla" in methods and any(float(x) > 0 for x in t["lambda2"]):
        raise ConfigError("tesla.lambda2", t["lambda2"], "the data has a single time point (T=1), so there is "
                          "nothing to smooth over time", "set tesla.lambda2=[0] or give data with several time points")
    snaps = t.get("snapshot_times")
    if snaps is not None:
        if not isinstance(snaps, (list, tuple)) or not snaps:
            raise ConfigError("tesla.snapshot_times", snaps, "must be a non-empty list of time indices or null",
                              "use e.g. tesla.snapshot_times=[0,50,99]")
        for s_ in snaps:
            if isinstance(s_, bool) or not isinstance(s_, numbers.Integral) or not 0 <= s_ < T:
                raise ConfigError("tesla.snapshot_times", snaps, f"{s_!r} is not a time index in [0, {T - 1}]",
                                  f"use indices between 0 and {T - 1}")
    if t["criterion"] == "heldout":
        from tasks.tesla import path_tasks

        N = data.series.X.shape[0]
        held = path_tasks.heldout_rows(N, int(cfg["seed"]), float(f))
        if held.all() or not held.any():
            raise ConfigError("tesla.heldout_fraction", f, f"leaves {int(held.sum())} of {N} samples held out",
                              "choose a fraction that holds out some but not all samples")


VARIATIONAL_KEYS = {"damping", "max_iter", "tol", "mf_restarts", "rho", "n_trees", "temperatures", "marginals",
                    "figures"}
VARIATIONAL = {
    "damping": real(gt=0),
    "max_iter": integer(lo=1),
    "tol": real(gt=0),
    "mf_restarts": integer(lo=0, hi=1000),
    "rho": choice("auto", "uniform", "spanning_trees"),
    "n_trees": integer(lo=1, hi=100_000),
    "marginals": boolean,
    "figures": boolean,
}


def check_variational(cfg: dict):
    _unknown_keys(cfg, "variational", VARIATIONAL_KEYS)
    _apply(cfg, {f"variational.{k}": r for k, r in VARIATIONAL.items()})
    d = cfg["variational"]["damping"]
    if d > 1:
        raise ConfigError("variational.damping", d, "must lie in (0, 1] (1: no damping)", "use e.g. 0.5")
    temps = cfg["variational"].get("temperatures")
    if temps is not None:
        if not isinstance(temps, (list, tuple)) or not temps:
            raise ConfigError("variational.temperatures", temps, "must be a non-empty list of temperatures or null",
                              "use e.g. variational.temperatures=[2.0,2.269,2.5]")
        for t in temps:
            real(gt=0)("variational.temperatures", t)


def check_bounds(cfg: dict):
    """pipeline=bounds: an Ising model (validated as for tempering) or an MRF from a file (loaded and
    checked: square, symmetric, finite couplings; rho from spanning trees)."""
    model = cfg.get("model") or {}
    name = model.get("name")
    if name == "ising":
        _unknown_keys(cfg, "model", set(MODEL_RULES["ising"]) | {"name"})
        _apply(cfg, {f"model.{k}": r for k, r in MODEL_RULES["ising"].items()})
    elif name == "mrf":
        _unknown_keys(cfg, "model", {"name", "path", "beta"})
        real(gt=0)("model.beta", _get(cfg, "model.beta"))
        from pipelines import bounds

        bounds.load_mrf(model)
    else:
        raise ConfigError("model", name, "pipeline=bounds works on binary pairwise models",
                          "use model=ising or model=mrf model.path=FILE.npz")


SPARSE_GP = {
    "method": choice("sgpr", "fitc", "dtc", "svgp", "exact"),
    "kernel": choice("rbf", "matern32", "matern52"),
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
    "test_fraction": real(gt=0),
    "standardize": boolean,
    "svgp_steps": integer(lo=1),
    "svgp_batch_size": integer(lo=1),
    "svgp_rho": real(gt=0),
    "svgp_lr": real(gt=0),
    "svgp_eval_every": integer(lo=1),
    "figures": boolean,
}
GP_SYNTHETIC = {"function": choice("friedman1", "sine_1d"), "n": integer(lo=2), "d": integer(lo=1),
                "noise_std": real(ge=0)}


def check_sparse_gp(cfg: dict):
    """pipeline=sparse_gp: every field, then the data itself (read and checked -- every value finite,
    the target column present -- before any MLflow run starts), then what depends on both."""
    from pipelines import gp_data, sparse_gp

    _unknown_keys(cfg, "sparse_gp", set(SPARSE_GP) | {"lengthscale", "slice_dim"})
    _apply(cfg, {f"sparse_gp.{k}": r for k, r in SPARSE_GP.items()})
    s = cfg["sparse_gp"]
    lo, hi = (math.exp(v) for v in sparse_gp.LOG_BOX)
    for key in ("variance", "noise"):
        if not lo <= s[key] <= hi:
            raise ConfigError(f"sparse_gp.{key}", s[key], f"must lie in [{lo:g}, {hi:g}] (the optimiser's box, "
                              "in standardised units)", f"set sparse_gp.{key} to e.g. {1.0 if key == 'variance' else 0.1}")
    ls = _get(cfg, "sparse_gp.lengthscale")
    for v in (ls if isinstance(ls, (list, tuple)) else [ls]):
        real(gt=0)("sparse_gp.lengthscale", v)
        if not lo <= v <= hi:
            raise ConfigError("sparse_gp.lengthscale", ls, f"{v:g} is outside [{lo:g}, {hi:g}] (the optimiser's box, "
                              "in standardised input units)", "start from e.g. sparse_gp.lengthscale=1.0")
    if isinstance(ls, (list, tuple)) and not ls:
        raise ConfigError("sparse_gp.lengthscale", ls, "is an empty list", "give a number, or one per input")
    if not s["test_fraction"] < 1:
        raise ConfigError("sparse_gp.test_fraction", s["test_fraction"], "must be below 1 (rows must be left to "
                          "train on)", "use e.g. sparse_gp.test_fraction=0.2")
    model = cfg.get("model") or {}
    if set(model) - {"name"} or model.get("name") != s["method"]:
        raise ConfigError("model", model.get("name") if set(model) <= {"name"} else sorted(model), "pipeline=sparse_gp "
                          "takes no model group (the model is sparse_gp.method with sparse_gp.kernel)",
                          "drop the model= override and set sparse_gp.method / sparse_gp.kernel")
    g = cfg.get("gp_data")
    if not isinstance(g, dict) or "kind" not in g:
        raise ConfigError("gp_data", g, "pipeline=sparse_gp needs data", "use gp_data=synthetic, gp_data=diabetes, "
                          "or gp_data=csv|npz|npy gp_data.path=FILE")
    if g["kind"] not in gp_data.KINDS:
        raise ConfigError("gp_data.kind", g["kind"], "unknown data source", f"use one of: {', '.join(gp_data.KINDS)}")
    _unknown_keys(cfg, "gp_data", gp_data.KEYS[g["kind"]])
    if g["kind"] == "synthetic":
        _apply(cfg, {f"gp_data.{k}": r for k, r in GP_SYNTHETIC.items()})
        if g["function"] == "friedman1" and g["d"] < 5:
            raise ConfigError("gp_data.d", g["d"], "Friedman #1 needs at least 5 inputs", "set gp_data.d=5 or more")
    data = gp_data.resolve(cfg)
    if isinstance(ls, (list, tuple)) and len(ls) not in (1, data.d):
        raise ConfigError("sparse_gp.lengthscale", ls, f"has {len(ls)} entries but the data has {data.d} inputs",
                          "give one number, or one per input")
    gp_data.slice_dim(s.get("slice_dim"), data)
    if s["method"] == "exact":
        if data.n_train > sparse_gp.EXACT_MAX_N:
            raise ConfigError("sparse_gp.method", "exact", f"the exact GP factors an n x n matrix and the data has "
                              f"n = {data.n_train} training rows, more than {sparse_gp.EXACT_MAX_N}",
                              "use sparse_gp.method=sgpr (or svgp) for data this large")
    elif s["m"] > data.n_train:
        raise ConfigError("sparse_gp.m", s["m"], f"is more inducing inputs than the {data.n_train} training rows "
                          f"(m > n) of {data.source}", f"use sparse_gp.m={data.n_train} or fewer (usually far fewer)")


def check_backend(cfg: dict):
    if cfg["backend"] == "cupy":
        from tasks import backend

        ok, why = backend.gpu_status()
        if not ok:
            raise ConfigError("backend", "cupy", f"no usable GPU: {why}",
                              "use backend=numpy (or auto), or install pgmflow[gpu] on a machine with a CUDA GPU")


def _package_prefix(rel: Path, text: str) -> str:
    """Where Hydra puts a config file's keys: '' (the top level) or a dotted section."""
    group = ".".join(rel.parent.parts)
    package = "_global_" if not group else "_group_"
    for line in text.splitlines():
        s = line.strip()
        if s and not s.startswith("#"):
            break
        if "@package" in s:
            package = s.split("@package", 1)[1].strip()
    package = package.replace("_group_", group).replace("_global_", "")
    return package.strip(".")


@functools.lru_cache(maxsize=4)
def conf_keys(conf: str) -> tuple[frozenset, dict]:
    """Every top-level key that some composition of the configs under ``conf`` can produce, and for
    each section the keys any config file sets in it. Read from the files, so a new pipeline or
    experiment needs no change here."""
    import yaml

    top, sections = set(), {}
    root = Path(conf)
    for f in sorted(root.rglob("*.yaml")):
        text = f.read_text()
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            continue  # Hydra reports it when the file is used
        if not isinstance(data, dict):
            continue
        data.pop("defaults", None)
        prefix = _package_prefix(f.relative_to(root), text)
        if not prefix:
            top |= set(data)
            for k, v in data.items():
                if isinstance(v, dict):
                    sections.setdefault(k, set()).update(v)
        else:
            head, _, rest = prefix.partition(".")
            top.add(head)
            if not rest:
                sections.setdefault(head, set()).update(data)
    return frozenset(top), {k: frozenset(v) for k, v in sections.items()}


# A key that looks like a way to widen the allow-list of importable modules gets that answer.
_ALLOW_LIST_LIKE = ("allowed_modules", "allow_list", "allowlist")


def check_unknown_top_level(cfg: dict):
    """Refuse keys that no config defines (``+foo=1``, a typo): pgmflow would ignore them silently."""
    from pipelines.cli import conf_dir

    try:
        top, sections = conf_keys(conf_dir())
    except RuntimeError:  # no conf/ to read the known keys from (pgmflow could not have composed cfg either)
        return
    for key in cfg:
        if key in top:
            continue
        if any(w in str(key).lower() for w in _ALLOW_LIST_LIKE):
            raise ConfigError(str(key), cfg[key], "unknown key: the allow-list of modules a config may import "
                              "is never read from the config", f"drop it and export {ALLOWED_MODULES_ENV}=module "
                              "in the shell that runs pgmflow")
        import difflib

        near = difflib.get_close_matches(str(key), sorted(top), n=1)
        hint = f"did you mean {near[0]}?" if near else f"known top-level keys: {', '.join(sorted(top - {'hydra'}))}"
        raise ConfigError(str(key), cfg[key], "unknown top-level key (no config defines it, so nothing would read "
                          "it)", f"{hint} (pgmflow --cfg job shows every key)")
    for section in ("cluster", "tracking"):  # sections that are wholly defined by their config group
        if isinstance(cfg.get(section), dict) and section in sections:
            _unknown_keys(cfg, section, sections[section])


def preflight_checks(cfg: dict) -> None:
    """Validate a resolved config (plain dict). Raises ConfigError on the first problem."""
    check_unknown_top_level(cfg)
    _apply(cfg, TOP)
    from pipelines import cluster

    cluster.check_cluster_config(cfg.get("cluster") or {})
    if cfg["pipeline"]["name"] == "tempering":
        check_tempering(cfg)
    elif cfg["pipeline"]["name"] == "svi":
        check_svi(cfg)
    elif cfg["pipeline"]["name"] == "tesla":
        check_tesla(cfg)
    elif cfg["pipeline"]["name"] == "bounds":
        check_bounds(cfg)
    elif cfg["pipeline"]["name"] == "sparse_gp":
        check_sparse_gp(cfg)
    if cfg.get("bounds") or cfg["pipeline"]["name"] == "bounds":
        check_variational(cfg)
    if cfg.get("bounds") and cfg["pipeline"]["name"] != "tempering":
        raise ConfigError("bounds", True, f"adds variational bounds to pipeline=tempering, not pipeline="
                          f"{cfg['pipeline']['name']}", "drop bounds=true, or use pipeline=bounds for the bounds alone")
    if cfg.get("bounds") and (cfg.get("model") or {}).get("name") != "ising":
        raise ConfigError("bounds", True, f"variational bounds need a binary pairwise model, not model="
                          f"{(cfg.get('model') or {}).get('name')}", "use model=ising with bounds=true")
    check_backend(cfg)
