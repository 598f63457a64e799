"""``pipeline=network_mrf``: validation (the plan) and the run. The work is small (p x p per time point), so it
runs on the driver; the outputs are ``mrf/t<index>.npz`` (J, h, time), one per exported time point."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pgmflow.core import artifacts, datasets
from pgmflow.core.errors import ConfigError
from pgmflow.core.validation import apply, choice, get, integer, unknown_keys
from pgmflow.tasks.bounds import from_network

KNOWN = ("estimates", "method", "times", "every")
RULES = {
    "network_mrf.every": integer(lo=1),
    "network_mrf.method": choice("tesla", "keller", "static"),
}


@dataclass(frozen=True)
class Plan:
    """Couplings: ``thetas`` [p, T, p] (estimates) or ``truth_J`` [T, p, p] with ``truth_h`` [T, p]; the time
    indices to export; where the network came from (for the dataset record)."""

    times: tuple[int, ...]
    source: str
    thetas: np.ndarray | None = None
    truth_J: np.ndarray | None = None
    truth_h: np.ndarray | None = None

    def mrf(self, t: int):
        if self.thetas is not None:
            return from_network.mrf_at(self.thetas, t)
        return from_network.mrf_from_truth(self.truth_J[t], self.truth_h[t])


def _estimates(path: str, method: str) -> np.ndarray:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError("network_mrf.estimates", path, "no such file", "pass a TESLA run's estimates.npz")
    try:
        with np.load(p, allow_pickle=False) as z:
            key = f"theta_{method}"
            if key not in z.files:
                raise ConfigError(
                    "network_mrf.estimates", path, f"has no {key}", f"pick network_mrf.method among {z.files}"
                )
            th = np.asarray(z[key], dtype=np.float64)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            "network_mrf.estimates",
            path,
            f"cannot read it as .npz ({type(exc).__name__})",
            "pass a TESLA estimates.npz",
        ) from None
    if th.ndim != 3 or th.shape[0] != th.shape[2] or not np.all(np.isfinite(th)):
        raise ConfigError(
            "network_mrf.estimates",
            path,
            f"theta has shape {th.shape}, not [p, T, p] finite",
            "pass a TESLA estimates.npz",
        )
    return th


def _truth(cfg: dict):
    from pgmflow.tasks.tesla import synthetic

    net = cfg.get("network") or {}
    if net.get("kind") != "synthetic":
        raise ConfigError(
            "network_mrf.estimates",
            None,
            "no estimates and no synthetic network to take the truth of",
            "pass network_mrf.estimates=FILE or network=synthetic",
        )
    keys = ("p", "T", "n_edges", "rewire_every", "n_rewire", "max_degree", "weight_low", "weight_high", "ramp")
    try:
        g = synthetic.ground_truth(
            int(cfg["seed"]), **{k: net[k] for k in keys if k in net}, field=net.get("field", 0.0)
        )
    except ValueError as exc:
        raise ConfigError("network", net.get("kind"), str(exc), "fix the network settings") from None
    return g.J, g.h


def check_network_mrf(cfg: dict) -> Plan:
    apply(cfg, RULES)
    unknown_keys(cfg, "network_mrf", KNOWN)
    c = get(cfg, "network_mrf")
    if c.get("estimates"):
        th, J, h, source = _estimates(str(c["estimates"]), c["method"]), None, None, str(c["estimates"])
        T = th.shape[1]
    else:
        (J, h), th, source = _truth(cfg), None, "synthetic truth"
        T = J.shape[0]
    times = from_network.time_points(T, c.get("times"), c["every"])
    bad = [t for t in times if not 0 <= t < T]
    if bad or not times:
        raise ConfigError(
            "network_mrf.times", c.get("times"), f"time indices must lie in [0, {T})", f"pick among 0..{T - 1}"
        )
    return Plan(tuple(times), source, th, J, h)


def work_seconds(plan: Plan) -> float:
    """Rough single-core seconds (``pgmflow.core.smallwork``): the conversion is a few array operations
    per time point; 1 ms each is generous."""
    return 1e-3 * len(plan.times)


def run(ctx, plan: Plan) -> dict:
    tracker = ctx.tracker
    edges = []
    for t in plan.times:
        J, h = plan.mrf(t)
        arrays = {"J": J, "h": h, "time": np.int64(t)}
        artifacts.log_npz(tracker, f"t{t:05d}.npz", arrays, artifact_path="mrf")
        edges.append(int(np.count_nonzero(np.triu(J, 1))))
    source = plan.thetas if plan.thetas is not None else plan.truth_J
    datasets.log_input(
        tracker,
        "network",
        {"couplings": source},
        path=plan.source if plan.thetas is not None else None,
        generator="pgmflow.tasks.tesla.synthetic.ground_truth",
    )
    result = {
        "objective": float(np.mean(edges)),
        "objective_name": "edges per time point",
        "time_points": len(plan.times),
        "edges": edges,
    }
    artifacts.log_results(tracker, result)
    ctx.say(
        f"network_mrf: {len(plan.times)} MRFs from {plan.source}, {np.mean(edges):.1f} edges per time point",
        summary=True,
    )
    return result
