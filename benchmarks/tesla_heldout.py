"""TESLA's learned networks scored by their true likelihood (issue 34): held-out log-likelihood per time point of
TESLA, KELLER, static neighbourhood selection and the true model, with SEs and the guaranteed brackets.

    .venv/bin/python benchmarks/tesla_heldout.py [--out FILE.md] [--figure FILE.png] [--samples N] [--cluster C]

1. Runs the study ``experiment=tesla_heldout_study`` (conf/experiment/tesla_heldout_study.yaml) through the
   Python API: a synthetic time-varying network (p = 10, T = 60, two samples per time point); TESLA, KELLER and
   static fits of its samples; the fits and the truth as one pairwise MRF per exported time point (every 6th:
   10 time points); log Z of each MRF by parallel tempering with the mean-field and TRW bounds along the ladder
   (``bounds=true``). The stage cache makes a second run of the script cost only the scoring.
2. Draws ``--samples`` held-out samples at each time point from the TRUE network, exactly (p = 10: the 1,024
   states enumerated), seeded; none of them was seen by the fits.
3. Scores each model on them (``pgmflow.tasks.bounds.heldout``): ``mean_n log-potential(x_n) - log Z`` with PT's
   log Z, PT's SE and the samples' SE, the bracket ``[mean - TRW, mean - MF]`` that holds whatever PT says, and
   the sandwich check (PT's log Z inside ``[MF - 3 SE, TRW + 3 SE]``). p = 10 also allows log Z by enumeration,
   so the table states PT's error in SEs; the check is PT's, not a substitute for it.

Prints a table (and writes it with ``--out``), draws the curves with their bands (``--figure``), and exits 1 if
a sandwich check fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402
from _machine import cpu_name, emit  # noqa: E402

MODELS = (("truth", "truth", "pt_truth"), ("tesla", "mrf_tesla", "pt_tesla"), ("keller", "mrf_keller", "pt_keller"))
MODELS += (("static", "mrf_static", "pt_static"),)


def exact_samples(mrf, n: int, rng) -> np.ndarray:
    """``n`` independent draws of +-1 spins from the MRF, by enumerating its 2**p states (p <= 16)."""
    from pgmflow.tasks.bounds import mrf as M

    p = mrf.n
    if p > 16:
        raise ValueError(f"exact sampling enumerates 2**p states; p = {p} is too many")
    codes = np.arange(2**p)
    X = np.where((codes[:, None] >> np.arange(p)) & 1, 1, -1).astype(np.int8)
    logw = M.energy_terms(mrf, X)
    w = np.exp(logw - logw.max())
    return X[rng.choice(codes.size, size=n, p=w / w.sum())]


def run_study(cluster: str, uri: str, log) -> list[dict]:
    import pgmflow

    res = pgmflow.run("experiment=tesla_heldout_study", cluster=cluster, tracking_uri=uri, progress=False, stream=log)
    return res.result["stages"]


def stage_files(client, run_id: str, folder: str, dst: Path) -> list[Path]:
    local = Path(client.download_artifacts(run_id, folder, str(dst)))
    return sorted(local.glob("*.npz"))


def score(rows: list[dict], uri: str, n_samples: int, seed: int) -> list[dict]:
    import json

    from mlflow.tracking import MlflowClient

    from pgmflow.tasks.bounds import exact, heldout
    from pgmflow.tasks.bounds import mrf as M

    client = MlflowClient(uri)
    by = {}
    for r in rows:
        by.setdefault(r["stage"], {})[r["unit"]] = r["source"]
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        mrfs = {}
        for name, mrf_stage, _ in MODELS:
            files = stage_files(client, by[mrf_stage][""], "mrf", Path(tmp) / name)
            mrfs[name] = []
            for f in files:
                with np.load(f) as z:
                    mrfs[name].append((int(z["time"]), M.from_dense(z["J"], z["h"])))
        times = [t for t, _ in mrfs["truth"]]
        for name, _, _ in MODELS:
            if [t for t, _ in mrfs[name]] != times:
                raise SystemExit(f"{name}'s time points {[t for t, _ in mrfs[name]]} differ from the truth's {times}")
        rng = np.random.default_rng(seed)
        samples = [exact_samples(m, n_samples, rng) for _, m in mrfs["truth"]]
        for name, _, pt_stage in MODELS:
            for unit, (t, model) in enumerate(mrfs[name]):
                run_id = by[pt_stage][unit]
                res = json.loads(Path(client.download_artifacts(run_id, "results.json", tmp)).read_text())
                n = model.n
                h = heldout.heldout_log_likelihood(
                    model,
                    samples[unit],
                    res["log_z_ss"],
                    res["log_z_ss_se"],
                    res["bounds_mf_per_site"] * n,
                    res["bounds_trw_per_site"] * n,
                )
                log_z_exact = float(exact.log_z_enumeration(model))
                out.append(
                    {
                        "time": t,
                        "model": name,
                        "edges": int(np.count_nonzero(model.J)),
                        "log_lik": h.log_lik,
                        "se_log_z": h.se_log_z,
                        "se_samples": h.se_samples,
                        "lower": h.lower,
                        "upper": h.upper,
                        "sandwich_ok": h.sandwich_ok,
                        "pt_error_se": (res["log_z_ss"] - log_z_exact) / res["log_z_ss_se"],
                        "run_id": run_id,
                    }
                )
    return out


def table(out: list[dict], n_samples: int) -> str:
    names = [m for m, _, _ in MODELS]
    times = sorted({r["time"] for r in out})
    cell = {(r["time"], r["model"]): r for r in out}
    head = "| t | " + " | ".join(f"{m}: log-lik ± SE (PT, samples) [bracket], edges" for m in names) + " |"
    lines = [head, "|---|" + "---|" * len(names)]
    for t in times:
        parts = []
        for m in names:
            r = cell[(t, m)]
            parts.append(
                f"{r['log_lik']:.3f} ± {r['se_log_z']:.3f}, {r['se_samples']:.3f} [{r['lower']:.2f}, {r['upper']:.2f}],"
                f" {r['edges']}"
            )
        lines.append(f"| {t} | " + " | ".join(parts) + " |")
    mean = {m: np.mean([cell[(t, m)]["log_lik"] for t in times]) for m in names}
    lines.append("| mean | " + " | ".join(f"{mean[m]:.3f}" for m in names) + " |")
    worst = max(abs(r["pt_error_se"]) for r in out)
    ok = sum(r["sandwich_ok"] for r in out)
    lines += [
        "",
        f"Held-out samples: {n_samples} per time point, drawn exactly from the true network. Sandwich checks passed:"
        f" {ok} of {len(out)}. PT's log Z against enumeration: largest |error| {worst:.2f} SE over {len(out)} runs.",
    ]
    return "\n".join(lines)


def figure(out: list[dict], path: Path) -> None:
    """Left: every model; right: the truth, TESLA and KELLER at a scale that shows their bands and brackets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    colours = {"truth": "black", "tesla": "tab:blue", "keller": "tab:orange", "static": "tab:green"}
    for ax, names in zip(axes, ([m for m, _, _ in MODELS], ["truth", "tesla", "keller"]), strict=True):
        for m in names:
            rs = sorted((r for r in out if r["model"] == m), key=lambda r: r["time"])
            t = np.array([r["time"] for r in rs], dtype=float)
            y = np.array([r["log_lik"] for r in rs])
            se = np.hypot([r["se_log_z"] for r in rs], [r["se_samples"] for r in rs])
            ax.plot(t, y, "o-", color=colours[m], label=m, lw=1.5, ms=4)
            ax.fill_between(t, y - 2 * se, y + 2 * se, color=colours[m], alpha=0.3, lw=0)
            off = {"truth": -0.6, "tesla": 0.0, "keller": 0.6, "static": 1.2}[m]
            ax.vlines(t + off, [r["lower"] for r in rs], [r["upper"] for r in rs], color=colours[m], alpha=0.4, lw=3)
        ax.set_xlabel("time point")
        ax.legend(frameon=False, ncol=4, fontsize=9)
    axes[0].set_ylabel("held-out log-likelihood per sample (nats)")
    axes[0].set_title("every model (static: one fit per time point, unsmoothed)", fontsize=10)
    axes[1].set_title("truth, TESLA, KELLER (band: ±2 SE; bars: MF/TRW bracket)", fontsize=10)
    fig.suptitle("Held-out log-likelihood of samples from the true network, per time point")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write the report (markdown) here")
    ap.add_argument("--figure", type=Path, default=None, help="write the figure (png) here")
    ap.add_argument("--samples", type=int, default=2000, help="held-out samples per time point")
    ap.add_argument("--seed", type=int, default=1, help="seed of the held-out samples")
    ap.add_argument("--cluster", default="synchronous", help="cluster profile or address for the study")
    ap.add_argument("--store", default=None, help="MLflow store of the study (default: a temporary one)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        uri = a.store or f"sqlite:///{tmp}/mlflow.db"
        with open(Path(tmp) / "study.log", "w") as log:
            rows = run_study(a.cluster, uri, log)
        out = score(rows, uri, a.samples, a.seed)
    report = (
        f"# Held-out log-likelihood per time point: TESLA, KELLER, static and the truth ({cpu_name()})\n\n"
        f"Command: `.venv/bin/python benchmarks/tesla_heldout.py"
        f"{' --out ' + str(a.out) if a.out else ''}{' --figure ' + str(a.figure) if a.figure else ''}`\n\n"
        + table(out, a.samples)
    )
    emit(report, a.out)
    if a.figure:
        figure(out, a.figure)
    return 0 if all(r["sandwich_ok"] for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
