"""MRF per-colour sweeps (tempering ``model=mrf``): our numba kernel against a plain NumPy per-colour sweep, in
the same run; and the mean-field reference against the uniform one on a strongly coupled 100-node model.

    .venv/bin/python benchmarks/tempering_mrf.py [--out benchmarks/results/tempering_mrf.md] [--quick]

Speed: spin updates (accepted or not) per wall-clock ns, after a warm-up call that compiles, heat bath at b = 1,
best of several repeats, on

* a random 4-regular graph of 10,000 nodes (networkx.random_regular_graph, seed 0; couplings N(0, 0.5^2),
  fields N(0, 0.1^2)), 16 replicas and 64 (the pipeline's default ``tempering.n_replicas``; PT's barrier on this
  graph is Lambda = 33.5 with the uniform reference, so a ladder needs about 2 Lambda = 67 levels and 16 cannot
  carry replicas between the ends), and
* a dense network of 100 nodes (all pairs, couplings N(0, 1/100): a Sherrington-Kirkpatrick model at
  beta = 1), 64 replicas;

peer: ``numpy_colour_sweep`` (per colour one sparse product for the local fields of all replicas, one
``rng.random`` per node, a logistic, ``np.where``; one thread, as NumPy and SciPy run it); ours: ``mrf_sweep`` at 4
sweeps per call (what the pipeline does between swaps) and in one long call, on all ``numba.get_num_threads()``
threads, as ``benchmarks/tempering.py`` runs the lattice kernel (threads over blocks of replicas, or sharing each
colour's nodes when the replicas would give a thread fewer than 64 lanes; ``--cpu-time`` with
``NUMBA_NUM_THREADS=1`` gives the figure per core). The kernel draws one Philox4x32-10 block per 4 node updates, so it
can never update faster than 4 x (Philox blocks per ns); the script times the Ising benchmark's counter loop
(``benchmarks/tempering.py:philox_blocks_per_ns``, the same generator on the same threads) and prints that
ceiling and the fraction of it each figure reaches. Target (issue 34): >= 20x the peer.

Reference: PT through the pipeline (synchronous scheduler, 16 replicas, 10 rounds, one chain) on a 100-node
ferromagnet in a field with couplings strong enough to order it (G(100, 0.1), couplings |N(0, 0.6^2)|, fields
N(0.3, 0.1^2)) with ``tempering.reference=fixed`` (uniform spins) and ``variational`` (the mean-field
product): the barrier Lambda (last round), round trips per 1,000 scans (the whole run), log Z and its SE.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402
from _machine import cpu_name  # noqa: E402
from tempering import best_time, philox_blocks_per_ns  # noqa: E402

from pgmflow.tasks import backend  # noqa: E402
from pgmflow.tasks.bounds import mrf as M  # noqa: E402
from pgmflow.tasks.tempering import mrf_kernels as K  # noqa: E402
from pgmflow.tasks.tempering import mrf_target as T  # noqa: E402

KEY = np.array([0x1234ABCD, 0x9E3779B9], dtype=np.uint32)
TARGET_RATIO = 20.0


def regular_graph(n=10_000, d=4):
    import networkx as nx

    g = nx.random_regular_graph(d, n, seed=0)
    edges = np.array(sorted(tuple(sorted(e)) for e in g.edges()), dtype=np.int64)
    rng = np.random.default_rng(0)
    return M.make_mrf(rng.normal(0.0, 0.1, n), edges, rng.normal(0.0, 0.5, len(edges)))


def dense_network(n=100):
    rng = np.random.default_rng(1)
    J = np.triu(rng.normal(0.0, 1.0 / np.sqrt(n), (n, n)), 1)
    return M.from_dense(J + J.T, rng.normal(0.0, 0.1, n))


def settle_plan(target, x0, b, rid, per_call=4):
    """Calls on a copy of x0 until the kernel's measured plan (>= 4 threads, or PGMFLOW_MRF_PLAN=tune) is chosen,
    so that the timings that follow are of that plan, not of the candidates it tried."""
    x = x0.copy()
    threads = backend.numba().get_num_threads()
    for s in range(K.TUNE_SAMPLES * len(K._candidates(x.shape[0], threads, target.n_sites, target.n_colours)) + 1):
        K.mrf_sweep(x, target, b, KEY, rid, 0, 10**6 + per_call * s, per_call, "heatbath")


def bench(name, model, R, repeats, long_sweeps, clock=time.perf_counter):
    target = T.make_mrf_target(model)
    n = target.n_sites
    rng = np.random.default_rng(2)
    x = np.where(rng.random((R, n)) < 0.5, 1, -1).astype(np.int8)
    b = np.ones(R)
    rid = np.arange(R)
    rows = K.colour_rows_of(target)
    K.numpy_colour_sweep(x.copy(), target, 1.0, rng, 1, rows)
    xp = x.copy()
    peer_sweeps = max(1, long_sweeps // 8)
    t_peer = best_time(lambda: K.numpy_colour_sweep(xp, target, 1.0, rng, peer_sweeps, rows), repeats, clock)
    K.mrf_sweep(x, target, b, KEY, rid, 0, 0, 1, "heatbath")  # compile
    settle_plan(target, x, b, rid)
    state = {"s": 1}

    def ours(sweeps, per_call):
        def go():
            for _ in range(sweeps // per_call):
                K.mrf_sweep(x, target, b, KEY, rid, 0, state["s"], per_call, "heatbath")
                state["s"] += per_call

        return go

    t4 = best_time(ours(long_sweeps, 4), repeats, clock)
    t_long = best_time(ours(long_sweeps, long_sweeps), repeats, clock)
    per_ns = lambda sweeps, t: R * n * sweeps / (t * 1e9)  # noqa: E731
    return {
        "name": name,
        "n": n,
        "E": int(target.edges.shape[0]),
        "colours": target.n_colours,
        "R": R,
        "peer": per_ns(peer_sweeps, t_peer),
        "ours4": per_ns(long_sweeps, t4),
        "ours_long": per_ns(long_sweeps, t_long),
    }


def reference_rows(rounds):
    """PT with the uniform and the mean-field reference on one strongly coupled 100-node model."""
    from pgmflow.core.api import run

    rng = np.random.default_rng(3)
    n = 100
    J = np.triu(np.abs(rng.normal(0.0, 0.6, (n, n))) * (rng.random((n, n)) < 0.1), 1)
    out = []
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ferro.npz"
        np.savez(path, J=J + J.T, h=rng.normal(0.3, 0.1, n))
        for ref in ("fixed", "variational"):
            res = run(
                "model=mrf",
                f"model.path={path}",
                f"tempering.reference={ref}",
                "tempering.n_replicas=16",
                f"tempering.n_rounds={rounds}",
                "tempering.n_chains=1",
                "tempering.sweeps_per_scan=2",
                "tempering.figures=false",
                cluster="synchronous",
                tracking_uri=f"sqlite:///{d}/mlflow.db",
                progress=False,
                stream=open("/dev/null", "w"),
            ).result
            out.append(
                {
                    "reference": ref,
                    "barrier": res["barrier"],
                    "round_trips_per_1000_scans": 1000.0 * res["round_trips"] / res["scans_total"],
                    "log_z": res["log_z_ss"],
                    "se": res["log_z_ss_se"],
                }
            )
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time by the process's CPU time (updates per CPU-ns; robust on a shared machine) instead of the wall",
    )
    args = ap.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    import numba

    reps = 2 if args.quick else 5
    blocks = philox_blocks_per_ns(reps)
    ceiling = 4 * blocks
    rows = [
        bench("random 4-regular, 10,000 nodes", regular_graph(), 16, reps, 16 if args.quick else 64, clock),
        bench("random 4-regular, 10,000 nodes", regular_graph(), 64, reps, 16 if args.quick else 64, clock),
        bench("dense (all pairs), 100 nodes", dense_network(), 64, reps, 16 if args.quick else 64, clock),
    ]
    lines = [
        f"# MRF per-colour sweeps and the mean-field reference ({cpu_name()}, {numba.get_num_threads()} numba threads)",
        "",
        f"Philox4x32-10: {blocks:.3f} blocks/ns on all threads -> ceiling {ceiling:.2f} updates/ns (4 per block).",
        "",
        f"Timed by {'CPU time (updates per CPU-ns)' if args.cpu_time else 'the wall clock (updates per ns)'}.",
        "",
        "| graph | n | edges | colours | replicas | NumPy peer (updates/ns) | ours, 4 sweeps/call | ours, one call |"
        " ratio (4/call) | ratio (one call) | of the Philox ceiling |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        best = max(r["ours4"], r["ours_long"])
        lines.append(
            f"| {r['name']} | {r['n']} | {r['E']} | {r['colours']} | {r['R']} | {r['peer']:.4f} | {r['ours4']:.3f} | "
            f"{r['ours_long']:.3f} | {r['ours4'] / r['peer']:.1f}x | {r['ours_long'] / r['peer']:.1f}x | "
            f"{100 * best / ceiling:.0f}% |"
        )
    lines += ["", f"Target: >= {TARGET_RATIO:.0f}x the peer."]
    t0 = time.monotonic()
    ref = reference_rows(7 if args.quick else 10)
    lines += [
        "",
        f"Reference on a strongly coupled 100-node ferromagnet in a field ({time.monotonic() - t0:.0f} s):",
        "",
        "| reference | barrier Lambda | round trips / 1,000 scans | log Z | SE |",
        "|---|---|---|---|---|",
    ]
    for r in ref:
        lines.append(
            f"| {r['reference']} | {r['barrier']:.3f} | {r['round_trips_per_1000_scans']:.1f} | "
            f"{r['log_z']:.4f} | {r['se']:.4f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
