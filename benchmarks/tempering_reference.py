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

Printed per target and reference (mean over seeds; in brackets min .. max):

* Λ: the barrier of the whole chain, ``sum_k r_k`` over its pairs. For stabilized that is its fixed
  leg's plus its variational leg's (the pair joining the legs never rejects); both legs are shown.
  Pigeons.jl reports the two legs apart (``Λ`` for the fixed leg, ``Λ_var`` for the variational one).
* round trips and tempered restarts per 1,000 scans (all scans of the run, every replica), counted
  as Pigeons.jl's ``RoundTripRecorder`` / ``VariationalDEO`` do: a restart is an arrival at a target
  level coming from a reference level, a round trip a return to a reference level after that. One leg:
  the reference is level 0 and the target level N-1. Stabilized: *both* ends of the chain are
  references (the fixed one and the variational one) and the target is either of the two levels at
  b = 1 where the legs join, so a replica may go fixed reference -> target -> variational reference.
  Per leg (stabilized): round trips of the leg alone (its reference -> target -> its reference, a
  replica in the other leg counted as at the target).
* levels per leg (stabilized): ``tempering.stabilized_split=adaptive`` shares the levels in
  proportion to the legs' barriers each round (equal swap rejection along the whole chain; at least
  2 per leg); ``half`` keeps K // 2 in the fixed leg. Mean over seeds of the last round's split.
* the log Z error of the stepping-stone estimate in units of its SE, and the SE.

The variational references use moment matching from round 4 on (``tempering.variational_from_round=4``)
and the full covariance. The 1-minute load average is printed with each row: the machine is shared.
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

TARGETS = {
    "gaussian": [
        "model=gaussian",
        "model.dim=16",
        "model.shift=3.0",
        "model.scale_min=0.05",
        "model.scale_max=0.5",
        "model.correlation=0.5",
        "model.reference_scale=1.0",
    ],
    "mixture": [
        "model=gaussian_mixture",
        "model.dim=10",
        "model.n_components=2",
        "model.separation=4.0",
        "model.sigma=0.5",
        "model.weights=[1.0,2.0]",
        "model.reference_scale=3.0",
    ],
}
#: (label, tempering.reference, tempering.stabilized_split)
REFERENCES = (
    ("fixed", "fixed", "adaptive"),
    ("variational", "variational", "adaptive"),
    ("stabilized", "stabilized", "adaptive"),
    ("stabilized (half split)", "stabilized", "half"),
)


def compose(overrides):
    from hydra import compose as hcompose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = hcompose("config", overrides=list(overrides))
    d = OmegaConf.to_container(cfg, resolve=True)
    d.pop("hydra", None)
    return d


def one_run(target, reference, seed, rounds, replicas, uri, split="adaptive"):
    from pgmflow.core.runner import execute

    ov = TARGETS[target] + [
        f"tempering.reference={reference}",
        f"tempering.stabilized_split={split}",
        f"seed={seed}",
        f"tempering.n_rounds={rounds}",
        f"tempering.n_replicas={replicas}",
        "tempering.n_chains=1",
        "tempering.explorer=hmc",
        "tempering.sweeps_per_scan=2",
        "tempering.n_leapfrog=8",
        "tempering.variational_from_round=4",
        "tempering.variational_family=full",
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
        "restarts": res["restarts"] * per_k,
        "err_se": res["log_z_ss_error_sigmas"],
        "se": res["log_z_ss_se"],
        "err": res["log_z_ss_error"],
        "seconds": res["_seconds"],
    }
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

    return (
        f"| {target} | {label} | {m('barrier')} | {m('barrier_fixed')} | {m('barrier_variational')} | "
        f"{legs('levels', '{:.1f}')} | {m('trips', '{:.1f}')} | {m('restarts', '{:.1f}')} | "
        f"{legs('trips', '{:.1f}')} | {m('err_se', '{:+.2f}')} | {m('se', '{:.4f}')} | "
        f"{np.mean([r['seconds'] for r in rows]):.0f} | {load:.1f} |"
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    rounds, replicas = (8, 12) if a.quick else (11, 16)
    lines = [
        "# Parallel tempering: fixed vs variational vs stabilized reference (benchmarks/tempering_reference.py)",
        "",
        f"Machine: {cpu_name()} (2 cores), shared with other helpers running tests and benchmarks while this "
        "ran (a loaded machine: the 1-minute load average is in the last column; the seconds are indicative "
        "only; the other figures do not depend on load).",
        f"Equal compute per run: {replicas} replicas, {rounds} rounds ({2 ** (rounds + 1) - 2} scans), HMC "
        "(2 trajectories of 8 leapfrog steps per replica per scan); stabilized: the replicas shared between "
        f"its two legs. Mean over {a.seeds} seeds (seed = 1..{a.seeds}); in brackets: min .. max over seeds. "
        "Round trips and restarts as Pigeons.jl counts them (see the script's docstring).",
        "",
        "| target | reference | Λ (whole chain) | Λ fixed leg | Λ variational leg | levels per leg (fixed / var.) | "
        "round trips / 1000 scans | restarts / 1000 scans | leg's own round trips (fixed / var.) | "
        "log Z error / SE | SE | s/run | load |",
        "|" + "---|" * 13,
    ]
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        for target in TARGETS:
            for label, ref, split in REFERENCES:
                rows = [row(one_run(target, ref, s, rounds, replicas, uri, split)) for s in range(1, a.seeds + 1)]
                line = table_line(target, label, rows, os.getloadavg()[0])
                print(line, flush=True)
                lines.append(line)
    emit("\n".join(lines) + "\n", a.out)


if __name__ == "__main__":
    main()
