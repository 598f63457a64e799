"""Fixed, variational (mean-field) and stabilized references of parallel tempering on frustrated MRFs,
at equal replicas.

    .venv/bin/python benchmarks/tempering_mrf_reference.py [--out benchmarks/results/....md] [--quick] [--seeds N]

Each reference runs the same pipeline (``pgmflow pipeline=tempering model=mrf``, synchronous scheduler, a
throw-away MLflow store) with the same number of replicas, rounds, scans and sweeps, so the compute is the
same; ``stabilized`` shares its replicas between its two legs (uniform spins, and the product of independent
spins: the mean-field fixed point in rounds 1-3, then fitted to the previous round's target-end spin means).
``variational`` is the mean-field product built into the target (one leg). Targets (one model per seed,
written to a temporary ``.npz``):

* ``spin glass, 20 nodes``: an Erdős-Rényi graph, mean degree 4, couplings N(0, 1), no field, at
  ``model.beta=1.5`` (low temperature: frustrated, with the Z2 symmetry x -> -x, two mirror modes); exact
  log Z by enumeration, so the error of each estimate in SEs is shown.
* ``spin glass, 100 nodes``: the same on 100 nodes (no exact value: the references' estimates are compared).
* ``spin glass + field, 100 nodes``: with fields N(0, 0.5^2) (the symmetry broken).

Printed per target and reference (mean over seeds; in brackets min .. max): Λ, the barrier of the whole chain
(stabilized: the fixed leg's plus the variational leg's; both shown); round trips per 1,000 scans (all scans
of the run, every replica; stabilized: as Pigeons.jl's VariationalDEO counts them, either reference end ->
target -> either reference end, and each leg's own); the levels of each leg in the last round; log Z and its
SE per seed, and the error in SEs where enumeration gives the exact value.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from _machine import cpu_name, emit  # noqa: E402

TARGETS = {  # (nodes, field SD)
    "spin glass, 20 nodes": (20, 0.0),
    "spin glass, 100 nodes": (100, 0.0),
    "spin glass + field, 100 nodes": (100, 0.5),
}
MEAN_DEGREE, BETA = 4.0, 1.5
REFERENCES = (("fixed", "fixed"), ("variational", "variational"), ("stabilized", "stabilized"))


def write_spin_glass(path: Path, seed: int, n: int, field_sd: float):
    g = np.random.default_rng(1000 + seed)
    upper = np.triu(g.random((n, n)) < MEAN_DEGREE / (n - 1), 1)
    J = np.where(upper, g.normal(0.0, 1.0, (n, n)), 0.0)
    np.savez(path, J=J + J.T, h=g.normal(0.0, field_sd, n) if field_sd > 0 else np.zeros(n))


def compose(overrides):
    from hydra import compose as hcompose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = hcompose("config", overrides=list(overrides))
    d = OmegaConf.to_container(cfg, resolve=True)
    d.pop("hydra", None)
    return d


def one_run(model_path, reference, seed, rounds, replicas, uri):
    from pgmflow.core.runner import execute

    ov = [
        "pipeline=tempering",
        "model=mrf",
        f"model.path={model_path}",
        f"model.beta={BETA}",
        f"tempering.reference={reference}",
        f"seed={seed}",
        f"tempering.n_rounds={rounds}",
        f"tempering.n_replicas={replicas}",
        "tempering.n_chains=1",
        "tempering.explorer=heatbath",
        "tempering.sweeps_per_scan=2",
        "tempering.figures=false",
        "progress=false",
        "cluster.profile=synchronous",
        f"tracking.uri={uri}",
    ]
    t0 = time.perf_counter()
    res = execute(compose(ov), stream=io.StringIO())
    res["_seconds"] = time.perf_counter() - t0
    return res


def row(res):
    per_k = 1000.0 / res["scans_total"]
    out = {
        "barrier": res["barrier"],
        "trips": res["round_trips"] * per_k,
        "log_z": res["log_z_ss"],
        "se": res["log_z_ss_se"],
        "seconds": res["_seconds"],
    }
    if "log_z_ss_error_sigmas" in res:
        out["err_se"] = res["log_z_ss_error_sigmas"]
    for leg in ("fixed", "variational"):
        if f"barrier_{leg}" in res:
            out[f"barrier_{leg}"] = res[f"barrier_{leg}"]
            out[f"trips_{leg}"] = res[f"round_trips_{leg}"] * per_k
            out[f"levels_{leg}"] = res[f"n_levels_{leg}"]
    return out


def table_line(target, label, rows, load):
    def m(k, fmt="{:.2f}"):
        v = [r[k] for r in rows if k in r]
        return "-" if not v else fmt.format(np.mean(v)) + f" [{fmt.format(min(v))} .. {fmt.format(max(v))}]"

    def legs(k, fmt):
        if f"{k}_fixed" not in rows[0]:
            return "-"
        return " / ".join(fmt.format(np.mean([r[f"{k}_{leg}"] for r in rows])) for leg in ("fixed", "variational"))

    logz = "; ".join(f"{r['log_z']:.2f} ± {r['se']:.2f}" for r in rows)
    return (
        f"| {target} | {label} | {m('barrier')} | {m('barrier_fixed')} | {m('barrier_variational')} | "
        f"{legs('levels', '{:.1f}')} | {m('trips', '{:.1f}')} | {legs('trips', '{:.1f}')} | {logz} | "
        f"{m('err_se', '{:+.2f}')} | "
        f"{np.mean([r['seconds'] for r in rows]):.0f} | {load:.1f} |"
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    rounds, replicas = (7, 12) if a.quick else (10, 16)
    lines = [
        "# Parallel tempering on frustrated MRFs: fixed vs variational vs stabilized reference "
        "(benchmarks/tempering_mrf_reference.py)",
        "",
        f"Machine: {cpu_name()} (2 cores, shared: the 1-minute load average is in the last column; the seconds "
        "are indicative only, the other figures do not depend on load).",
        f"Equal replicas per run: {replicas} replicas, {rounds} rounds ({2 ** (rounds + 1) - 2} scans), 2 heat-bath "
        f"sweeps per scan; Erdős-Rényi spin glasses, mean degree {MEAN_DEGREE:g}, J ~ N(0, 1), "
        f"model.beta={BETA:g}; stabilized: the replicas shared between its two legs (adaptive split). Mean over "
        f"{a.seeds} seeds (seed = 1..{a.seeds}, each its own model); in brackets: min .. max over seeds; log Z per "
        "seed.",
        "",
        "| target | reference | Λ (whole chain) | Λ fixed leg | Λ variational leg | levels per leg (fixed / var.) | "
        "round trips / 1000 scans | leg's own round trips (fixed / var.) | log Z ± SE (per seed) | "
        "error / SE (exact known) | s/run | load |",
        "|" + "---|" * 12,
    ]
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        for i, (target, (n, field_sd)) in enumerate(TARGETS.items()):
            paths = {}
            for s in range(1, a.seeds + 1):
                paths[s] = Path(tmp) / f"target{i}_seed{s}.npz"
                write_spin_glass(paths[s], s, n, field_sd)
            for label, ref in REFERENCES:
                rows = [row(one_run(paths[s], ref, s, rounds, replicas, uri)) for s in range(1, a.seeds + 1)]
                line = table_line(target, label, rows, os.getloadavg()[0])
                print(line, flush=True)
                lines.append(line)
    emit("\n".join(lines) + "\n", a.out)


if __name__ == "__main__":
    main()
