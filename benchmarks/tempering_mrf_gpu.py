"""MRF per-colour sweeps (tempering ``model=mrf``) on the GPU: the CUDA kernel through CuPy against the NumPy peer
of ``benchmarks/tempering_mrf.py`` (one thread) and the numba kernel on all of the machine's CPU cores, in the same
run on the same data, and whether the GPU and the CPU kernel give the same bits (they must: one spec,
``tasks/tempering/mrf_kernels.py``).

    python benchmarks/tempering_mrf_gpu.py [--quick] [--out results.md]   # on a machine with CUDA and CuPy
    python benchmarks/tempering_mrf_gpu.py --quick --rehearse             # no GPU: the CPU columns only

Graphs as in ``benchmarks/tempering_mrf.py`` (a random 4-regular graph of 10,000 nodes; a dense 100-node
network). Heat bath at b = 1; spin updates (accepted or not) per wall-clock ns, best of 3, after a warm-up call
that compiles; the GPU timed up to a device synchronisation. Two call patterns for ours: 4 sweeps per call (what
the pipeline does between swaps) and one long call. Target (issue 34, done-mean 3): >= 20x the peer.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402
from _machine import cpu_name  # noqa: E402
from tempering import best_time  # noqa: E402
from tempering_mrf import KEY, TARGET_RATIO, dense_network, regular_graph, settle_plan  # noqa: E402

from pgmflow.tasks import backend  # noqa: E402
from pgmflow.tasks.bounds import mrf as M  # noqa: E402
from pgmflow.tasks.tempering import mrf_kernels as K  # noqa: E402
from pgmflow.tasks.tempering import mrf_target as T  # noqa: E402


def erdos_renyi(n=1000, degree=20):
    """G(n, degree / n), couplings N(0, 1/degree), fields N(0, 0.1^2): colours of tens of nodes."""
    rng = np.random.default_rng(3)
    iu = np.triu_indices(n, 1)
    keep = rng.random(iu[0].size) < degree / n
    edges = np.stack([iu[0][keep], iu[1][keep]], axis=1).astype(np.int64)
    return M.make_mrf(rng.normal(0.0, 0.1, n), edges, rng.normal(0.0, 1.0 / np.sqrt(degree), len(edges)))


def case(name, model, R, sweeps, reps, cp, peer_sweeps=1):
    """One row: peer, CPU kernel and (``cp`` not None) both GPU kernels on the same start, in the same run."""
    t = T.make_mrf_target(model)
    n = t.n_sites
    rng = np.random.default_rng(2)
    x0 = np.where(rng.random((R, n)) < 0.5, 1, -1).astype(np.int8)
    b = np.ones(R)
    rid = np.arange(R)
    per_ns = lambda s, sec: R * n * s / (sec * 1e9)  # noqa: E731

    rows = K.colour_rows_of(t)
    xp_ = x0.copy()
    K.numpy_colour_sweep(xp_, t, 1.0, rng, 1, rows)
    peer = per_ns(peer_sweeps, best_time(lambda: K.numpy_colour_sweep(xp_, t, 1.0, rng, peer_sweeps, rows), 2))

    def timed(x, sync, sweep):
        state = {"s": 1}

        def calls(per_call):
            def go():
                for _ in range(sweeps // per_call):
                    sweep(x, t, b, KEY, rid, 0, state["s"], per_call, "heatbath")
                    state["s"] += per_call
                sync()

            return go

        sweep(x, t, b, KEY, rid, 0, 0, 1, "heatbath")  # warm-up: compile
        sync()
        return per_ns(sweeps, best_time(calls(4), reps)), per_ns(sweeps, best_time(calls(sweeps), reps)), state

    xc = x0.copy()
    settle_plan(t, x0, b, rid)
    cpu4, cpu_long, sc = timed(xc, lambda: None, K.mrf_sweep)
    row = {"graph": name, "n": n, "colours": t.n_colours, "R": R, "peer": peer, "cpu4": cpu4, "cpu_long": cpu_long}
    if cp is not None:
        from pgmflow.tasks.tempering import mrf_cuda

        row["block"] = mrf_cuda.sweeps_block(t)
        same = []
        for kernel in ("colour", "sweeps"):
            xg = cp.asarray(x0)
            g4, g_long, sg = timed(
                xg, cp.cuda.Device().synchronize, lambda *a, k=kernel: mrf_cuda.sweep_cupy(*a, kernel=k)
            )
            assert sg["s"] == sc["s"], (sg, sc)  # the same sweeps on both: the GPU's spins must equal the CPU's
            row[f"{kernel}4"], row[f"{kernel}_long"] = g4, g_long
            same.append(bool(np.array_equal(cp.asnumpy(xg), xc)))
        row["same"] = all(same)
    return row


def verdict(r, gpu: bool) -> str:
    """One done-mean-3 row: the best path's updates per ns against the peer, and whether it meets the target."""
    paths = {"CPU kernel": max(r["cpu4"], r["cpu_long"])}
    if gpu:
        paths["GPU per colour"] = max(r["colour4"], r["colour_long"])
        paths["GPU one launch"] = max(r["sweeps4"], r["sweeps_long"])
    best = max(paths, key=paths.get)
    ratio = paths[best] / r["peer"]
    met = "met" if ratio >= TARGET_RATIO else "**not met**"
    return f"- {r['graph']}, {r['R']} replicas: {best}, {paths[best]:.3f} updates/ns = {ratio:.1f}x the peer: {met}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer replica counts and sweeps")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    ap.add_argument("--rehearse", action="store_true", help="without a GPU: run the CPU columns only")
    a = ap.parse_args(argv)
    ok, desc = backend.gpu_status()
    if not ok and not a.rehearse:
        print(f"no GPU: {desc} (--rehearse runs the CPU columns)")
        return 1
    cp = backend.cupy() if ok else None
    import numba

    reps = 3
    cases = [
        ("random 4-regular, 10,000 nodes", regular_graph(), (16, 64, 256) if a.quick else (16, 64, 256, 2048), 20),
        ("G(1000, 0.02), 1,000 nodes", erdos_renyi(), (64, 1024), 20),
        ("dense (all pairs), 100 nodes", dense_network(), (64, 1024) if a.quick else (64, 1024, 8192), 20),
    ]
    print(f"GPU: {desc}", flush=True)
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical CPUs, numba threads = {numba.get_num_threads()}", flush=True)
    results = []
    for name, model, Rs, sweeps in cases:
        for R in Rs:
            r = case(name, model, R, sweeps, reps, cp)
            results.append(r)
            print(f"  {name}, R={R}: " + ", ".join(f"{k} {v:.4g}" for k, v in r.items() if isinstance(v, float)))
    g = cp is not None
    head = "| graph | colours | replicas | NumPy peer, 1 thread | CPU kernel, 4/call | CPU kernel, one call |" + (
        " GPU per colour, 4/call | one call | GPU one launch per call, 4/call | one call | threads per replica |"
        " GPU best / peer | GPU best / CPU best | same bits |"
        if g
        else " CPU / peer |"
    )
    lines = [
        f"GPU: {desc}; CPU: {cpu_name()}, {numba.get_num_threads()} numba threads. Spin updates per ns (wall clock,"
        " best of 3), heat bath at b = 1, 20 sweeps per timing. GPU kernels: `pgm_mrf_colour` (one launch per"
        " colour of each sweep) and `pgm_mrf_sweeps` (one launch per call, a block of threads per replica).",
        "",
        head,
        "|---|---:|---:|---:|---:|---:|" + ("---:|" * 7 + "---|" if g else "---:|"),
    ]
    for r in results:
        cpu_best = max(r["cpu4"], r["cpu_long"])
        cells = [r["graph"], str(r["colours"]), str(r["R"]), f"{r['peer']:.4f}", f"{r['cpu4']:.3f}"]
        cells.append(f"{r['cpu_long']:.3f}")
        if g:
            gpu_best = max(r["colour4"], r["colour_long"], r["sweeps4"], r["sweeps_long"])
            cells += [f"{r[k]:.3f}" for k in ("colour4", "colour_long", "sweeps4", "sweeps_long")]
            cells += [str(r["block"]), f"{gpu_best / r['peer']:.1f}x", f"{gpu_best / cpu_best:.2f}x"]
            cells.append("yes" if r["same"] else "**NO**")
        else:
            cells.append(f"{cpu_best / r['peer']:.1f}x")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Target (issue 34): >= {TARGET_RATIO:.0f}x the peer; ratios use the better call pattern."]
    lines += [
        "",
        "Done-mean 3's rows on this machine (the best path of the CPU kernel and, with a GPU, both CUDA kernels):",
        "",
    ]
    lines += [verdict(r, g) for r in results if (r["graph"].startswith("random 4-regular") and r["R"] in (16, 64))]
    lines += [verdict(r, g) for r in results if r["graph"].startswith("dense") and r["R"] == 64]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0 if all(r.get("same", True) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
