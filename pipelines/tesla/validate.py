"""Validation of pipeline=tesla: the tesla, model and network sections, then the data itself.

The one place the TESLA run reads its config: :func:`check_tesla` returns the run's
:class:`~pgmflow.tesla.plan.TeslaPlan` (typed settings and the data, loaded once here).
"""

from __future__ import annotations

import numbers

import numpy as np

from pgmflow.core.errors import ConfigError
from pgmflow.core.validation import apply, boolean, choice, get, integer, number_list, real, unknown_keys
from pgmflow.tesla import networks
from pgmflow.tesla.plan import Estimation, Grid, ReportSettings, Selection, SolverSettings, TeslaPlan

TESLA_KEYS = {
    "methods",
    "lambda1",
    "keller_lambda1",
    "static_lambda1",
    "lambda2",
    "bandwidth",
    "criterion",
    "ebic_gamma",
    "heldout_fraction",
    "rule",
    "max_iter",
    "tol",
    "active_sets",
    "solver",
    "snapshot_times",
    "figures",
    "checkpoint_seconds",
}
TESLA = {
    "criterion": choice("bic", "ebic", "heldout"),
    "ebic_gamma": real(ge=0),
    "rule": choice("and", "or"),
    "max_iter": integer(lo=1),
    "tol": real(gt=0),
    "active_sets": boolean,
    "solver": choice("auto", "fista"),
    "figures": boolean,
    "checkpoint_seconds": real(ge=0),
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


def check_tesla(cfg: dict) -> TeslaPlan:
    """Every field of a TESLA run, then the data itself (loaded and checked before any task runs, once
    per run); returns the run's plan."""
    unknown_keys(cfg, "tesla", TESLA_KEYS)
    apply(cfg, {f"tesla.{k}": r for k, r in TESLA.items()})
    t = cfg["tesla"]
    methods = get(cfg, "tesla.methods")
    if not isinstance(methods, (list, tuple)) or not methods:
        raise ConfigError(
            "tesla.methods", methods, "must be a non-empty list", "use tesla.methods=[tesla,keller,static]"
        )
    for m in methods:
        if m not in TESLA_METHODS:
            raise ConfigError(
                "tesla.methods", methods, f"unknown method {m!r}", f"use any of {', '.join(TESLA_METHODS)}"
            )
    if len(set(methods)) != len(methods):
        raise ConfigError("tesla.methods", methods, "lists a method twice", "list each method once")
    number_list("tesla.lambda1", get(cfg, "tesla.lambda1"), ge=0)
    for key in ("keller_lambda1", "static_lambda1"):  # optional: null is the shared tesla.lambda1
        if t.get(key) is not None:
            number_list(f"tesla.{key}", t[key], ge=0)
    number_list("tesla.lambda2", get(cfg, "tesla.lambda2"), ge=0)
    number_list("tesla.bandwidth", get(cfg, "tesla.bandwidth"), gt=0)
    f = get(cfg, "tesla.heldout_fraction")
    real(gt=0)("tesla.heldout_fraction", f)
    if t["criterion"] == "heldout" and not f < 1:
        raise ConfigError(
            "tesla.heldout_fraction",
            f,
            "must be below 1 (samples must be left to fit)",
            "use e.g. tesla.heldout_fraction=0.2",
        )
    model = cfg.get("model") or {}
    if model.get("name") != "tesla":
        raise ConfigError(
            "model",
            model.get("name"),
            "pipeline=tesla estimates time-varying networks",
            "use model=tesla (or drop the model= override)",
        )
    unknown_keys(cfg, "model", {"name", "q"})
    choice(1, 2)("model.q", get(cfg, "model.q"))
    source = _network_source(cfg)
    seed = int(cfg["seed"])
    data = networks.resolve(source, seed)
    T = len(data.series.n_per_time)
    if T == 1 and "tesla" in methods and any(float(x) > 0 for x in t["lambda2"]):
        raise ConfigError(
            "tesla.lambda2",
            t["lambda2"],
            "the data has a single time point (T=1), so there is nothing to smooth over time",
            "set tesla.lambda2=[0] or give data with several time points",
        )
    snaps = t.get("snapshot_times")
    if snaps is not None:
        if not isinstance(snaps, (list, tuple)) or not snaps:
            raise ConfigError(
                "tesla.snapshot_times",
                snaps,
                "must be a non-empty list of time indices or null",
                "use e.g. tesla.snapshot_times=[0,50,99]",
            )
        for s_ in snaps:
            if isinstance(s_, bool) or not isinstance(s_, numbers.Integral) or not 0 <= s_ < T:
                raise ConfigError(
                    "tesla.snapshot_times",
                    snaps,
                    f"{s_!r} is not a time index in [0, {T - 1}]",
                    f"use indices between 0 and {T - 1}",
                )
    N = data.series.X.shape[0]
    held = np.zeros(N, bool)
    if t["criterion"] == "heldout":
        from pgmflow.tasks.tesla import path_tasks

        held = path_tasks.heldout_rows(N, seed, float(f))
        if held.all() or not held.any():
            raise ConfigError(
                "tesla.heldout_fraction",
                f,
                f"leaves {int(held.sum())} of {N} samples held out",
                "choose a fraction that holds out some but not all samples",
            )
    if snaps:
        snapshot_times = tuple(int(s_) for s_ in snaps)
    else:  # four evenly spaced time points
        snapshot_times = tuple(int(s_) for s_ in sorted(set(np.linspace(0, T - 1, min(4, T)).round().astype(int))))
    grid = Grid(
        lambda1=_floats(t["lambda1"]),
        lambda2=_floats(t["lambda2"]),
        bandwidths=_floats(t["bandwidth"]),
        keller_lambda1=None if t.get("keller_lambda1") is None else _floats(t["keller_lambda1"]),
        static_lambda1=None if t.get("static_lambda1") is None else _floats(t["static_lambda1"]),
    )
    solver = SolverSettings(
        q=int(cfg["model"]["q"]),
        max_iter=int(t["max_iter"]),
        tol=float(t["tol"]),
        active_sets=bool(t["active_sets"]),
        algorithm=str(t.get("solver", "auto")),
    )
    selection = Selection(
        criterion=str(t["criterion"]), ebic_gamma=float(t["ebic_gamma"]), heldout_fraction=float(f), heldout=held
    )
    return TeslaPlan(
        seed=seed,
        network=source,
        data=data,
        estimation=Estimation(methods=tuple(str(m) for m in methods), grid=grid, solver=solver, selection=selection),
        report=ReportSettings(rule=str(t["rule"]), snapshot_times=snapshot_times, figures=bool(t["figures"])),
        checkpoint_seconds=float(t["checkpoint_seconds"]),
    )


def _floats(values) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


def _network_source(cfg: dict) -> networks.SyntheticNetwork | networks.NetworkFile | networks.RollCallSource:
    """The ``network`` section, checked and typed: the generator's settings, or the file to read."""
    n = cfg.get("network")
    if not isinstance(n, dict) or "kind" not in n:
        raise ConfigError(
            "network",
            n,
            "pipeline=tesla needs data",
            "use network=synthetic, network=npz network.path=FILE.npz, network=csv network.path=FILE.csv, "
            "or network=rollcall",
        )
    if n["kind"] not in networks.KINDS:
        raise ConfigError("network.kind", n["kind"], "unknown data source", f"use one of: {', '.join(networks.KINDS)}")
    if n["kind"] == "rollcall":
        return _rollcall(cfg, n)
    if n["kind"] != "synthetic":
        unknown_keys(cfg, "network", {"kind", "path", "truth"})
        return _network_file(n)
    unknown_keys(cfg, "network", set(networks.SYNTHETIC_KEYS) | {"kind"})
    apply(cfg, {f"network.{k}": r for k, r in NETWORK_SYNTHETIC.items()})
    if n.get("n_edges") is not None:
        integer(lo=0)("network.n_edges", n["n_edges"])
    if n["weight_low"] > n["weight_high"]:
        raise ConfigError(
            "network.weight_low", n["weight_low"], f"is above network.weight_high={n['weight_high']}", "swap them"
        )
    return _synthetic(n)


def _rollcall(cfg: dict, n: dict) -> networks.RollCallSource:
    """``network=rollcall``: the source (pscl or voteview) and the choices of time axis, missing votes and
    partial terms (``pgmflow.tasks.tesla.rollcall``)."""
    from pgmflow.tasks.tesla import rollcall

    unknown_keys(cfg, "network", set(networks.ROLLCALL_KEYS) | {"kind"})
    rules = {
        "source": choice("pscl", "voteview"),
        "time_axis": choice(*rollcall.TIME_AXES),
        "window_days": integer(lo=1),
        "missing": choice(*rollcall.MISSING),
        "partial": choice(*rollcall.PARTIAL),
    }
    apply(cfg, {f"network.{k}": r for k, r in rules.items()})
    if n["source"] == "voteview" and not n.get("path"):
        raise ConfigError(
            "network.path", None, "network.source=voteview needs the folder of the CSV files", "add network.path=DIR"
        )
    return networks.RollCallSource(
        source=str(n["source"]),
        path=str(n["path"]) if n.get("path") else None,
        prefix=str(n.get("prefix") or "S109"),
        object=str(n.get("object") or "s109"),
        time_axis=str(n["time_axis"]),
        window_days=int(n["window_days"]),
        missing=str(n["missing"]),
        partial=str(n["partial"]),
    )


def _synthetic(n: dict) -> networks.SyntheticNetwork:
    """The generator's settings of ``network=synthetic`` (checked by the rules above), typed."""
    n_edges = n.get("n_edges")
    return networks.SyntheticNetwork(
        p=int(n["p"]),
        T=int(n["T"]),
        samples_per_time=int(n["samples_per_time"]),
        n_edges=None if n_edges is None else int(n_edges),
        rewire_every=int(n["rewire_every"]),
        n_rewire=int(n["n_rewire"]),
        max_degree=int(n["max_degree"]),
        weight_low=float(n["weight_low"]),
        weight_high=float(n["weight_high"]),
        ramp=int(n["ramp"]),
        field=float(n["field"]),
        burn_in=int(n["burn_in"]),
    )


def _network_file(n: dict) -> networks.NetworkFile:
    """``network=npz`` or ``network=csv``: the file (required) and the optional truth file."""
    kind, path = n["kind"], n.get("path")
    if not path:
        raise ConfigError("network.path", path, f"network={kind} needs a file", f"add network.path=FILE.{kind}")
    truth = n.get("truth")
    return networks.NetworkFile(kind=str(kind), path=str(path), truth=str(truth) if truth else None)
