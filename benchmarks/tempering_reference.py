"""Fixed, variational and stabilized references of parallel tempering, at equal compute.

    .venv/bin/python benchmarks/tempering_reference.py [--out benchmarks/results/....md] [--quick] [--seeds N]

Each reference runs the same pipeline (``pgmflow pipeline=tempering``, synchronous scheduler, a
throw-away MLflow store) with the same number of replicas, rounds, scans and local moves, so the
compute is the same; ``stabilized`` splits its replicas between its two legs. Targets:

* ``gaussian``: d = 16, every mean coordinate 3 (the mass is 12 reference SDs from the origin),
  SDs from 0.05 to 0.5, equicorrelation 0.5, fixed reference N(0, I); exact log Z known.
* ``mixture``: two components in d = 10, 4 from the origin, SD 0.5, weights 1 and 2, reference
  N(0, 3^2 I); exact log Z known. Bimodal: a Gaussian fitted to the target end covers the modes only
  if both are sampled there.

Printed per target and reference (mean over seeds): the barrier Λ (for stabilized: its fixed leg +
its variational leg, and the variational leg alone), round trips per 1,000 scans (all scans of the
run, every replica; for stabilized the whole index 0 -> N-1 -> 0 and per leg), and the log Z error
of the stepping-stone estimate in units of its SE, with the SE. The variational references use
moment matching from round 4 on (``tempering.variational_from_round=4``) and the full covariance.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from _machine import cpu_name, emit  # noqa: E402

TARGETS = {
    "gaussian": ["model=gaussian", "model.dim=16", "model.shift=3.0", "model.scale_min=0.05", "model.scale_max=0.5",
                 "model.correlation=0.5", "model.reference_scale=1.0"],
    "mixture": ["model=gaussian_mixture", "model.dim=10", "model.n_components=2", "model.separation=4.0",
                "model.sigma=0.5", "model.weights=[1.0,2.0]", "model.reference_scale=3.0"],
}
REFERENCES = ("fixed", "variational", "stabilized")


def compose(overrides):
    from hydra import compose as hcompose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = hcompose("config", overrides=list(overrides))
    d = OmegaConf.to_container(cfg, resolve=True)
    d.pop("hydra", None)
    return d


def one_run(target, reference, seed, rounds, replicas, uri):
    from pgmflow.pipelines.core.runner import execute

    ov = TARGETS[target] + [f"tempering.reference={reference}", f"seed={seed}", f"tempering.n_rounds={rounds}",
                            f"tempering.n_replicas={replicas}", "tempering.n_chains=1", "tempering.explorer=hmc",
                            "tempering.sweeps_per_scan=2", "tempering.n_leapfrog=8", "tempering.variational_from_round=4",
                            "tempering.variational_family=full", "tempering.figures=false", "progress=false",
                            "cluster.profile=synchronous", f"tracking.uri={uri}"]
    t0 = time.perf_counter()
    res = execute(compose(ov), stream=io.StringIO())
    res["_seconds"] = time.perf_counter() - t0
    return res


def row(res):
    per_k = 1000.0 / res["scans_total"]
    out = {"barrier": res["barrier"], "trips": res["round_trips"] * per_k,
           "err_se": res["log_z_ss_error_sigmas"], "se": res["log_z_ss_se"], "err": res["log_z_ss_error"],
           "seconds": res["_seconds"]}
    for leg in ("fixed", "variational"):
        if f"barrier_{leg}" in res:
            out[f"barrier_{leg}"] = res[f"barrier_{leg}"]
            out[f"trips_{leg}"] = res[f"round_trips_{leg}"] * per_k
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    rounds, replicas = (8, 12) if a.quick else (11, 16)
    lines = [f"# Parallel tempering: fixed vs variational vs stabilized reference (benchmarks/tempering_reference.py)",
             "", f"Machine: {cpu_name()} (2 cores), shared with other engineers running tests while this ran "
             "(a loaded machine: the seconds are indicative only; the other figures do not depend on load).",
             f"Equal compute per run: {replicas} replicas, {rounds} rounds ({2 ** (rounds + 1) - 2} scans), HMC "
             "(2 trajectories of 8 leapfrog steps per replica per scan); stabilized: half the replicas per leg. "
             f"Mean over {a.seeds} seeds (seed = 1..{a.seeds}); in brackets: min .. max over seeds.", "",
             "| target | reference | Λ | Λ fixed leg | Λ variational leg | round trips / 1000 scans | "
             "per leg (fixed / var.) | log Z error / SE | SE | s/run |", "|" + "---|" * 10]
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        for target in TARGETS:
            for ref in REFERENCES:
                rows = [row(one_run(target, ref, s, rounds, replicas, uri)) for s in range(1, a.seeds + 1)]

                def m(k, fmt="{:.2f}"):
                    v = [r[k] for r in rows if k in r]
                    return "-" if not v else fmt.format(np.mean(v)) + f" [{fmt.format(min(v))} .. {fmt.format(max(v))}]"

                legs = "-" if "trips_fixed" not in rows[0] else (
                    f"{np.mean([r['trips_fixed'] for r in rows]):.1f} / {np.mean([r['trips_variational'] for r in rows]):.1f}")
                line = (f"| {target} | {ref} | {m('barrier')} | {m('barrier_fixed')} | {m('barrier_variational')} | "
                        f"{m('trips', '{:.1f}')} | {legs} | {m('err_se', '{:+.2f}')} | {m('se', '{:.3f}')} | "
                        f"{np.mean([r['seconds'] for r in rows]):.0f} |")
                print(line, flush=True)
                lines.append(line)
    emit("\n".join(lines) + "\n", a.out)


if __name__ == "__main__":
    main()
