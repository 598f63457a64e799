"""Ising checkerboard sweeps: our kernels against the plain NumPy sweep, in the same run.

    .venv/bin/python benchmarks/tempering.py [--out benchmarks/results/tempering.md|.json] [--quick]

Measures spin flips per nanosecond -- site updates (accepted or not) per wall-clock nanosecond,
after a warm-up call that compiles -- of

* peer: ``numpy_checkerboard_sweep`` (Metropolis written the obvious NumPy way: np.roll
  neighbour sums, one rng.random per site, exp acceptance, np.where; one thread), and
* ours: ``ising_sweep`` (numba kernel on all ``numba.get_num_threads()`` threads), Metropolis,
  same ferromagnet, beta = 0.4407 (critical), in two call patterns: ``sweeps/call = 4`` (what the
  tempering pipeline does between swaps, so per-call costs count) and one long call (plus, for
  context, one long call on a single thread),

on the same lattices, and, when CuPy sees a GPU, the CUDA kernel on a batch of 1024 x 1024
lattices. Each figure is the best of several repeats (the machine may be shared). Targets on the
CPU: >= 0.5 flips/ns and >= 15x the NumPy peer; on the GPU: >= 100 flips/ns.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from _machine import cpu_name  # noqa: E402
from pgmflow.tasks import backend  # noqa: E402
from pgmflow.tasks.tempering import ising_kernels as K  # noqa: E402

BETA_C = 0.4407
METHOD = "metropolis"
TARGET_FLIPS_PER_NS = 0.5
TARGET_RATIO = 15.0
TARGET_GPU_FLIPS_PER_NS = 100.0
KEY = np.array([0x243F6A88, 0x85A308D3], dtype=np.uint32)


def best_time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_peer(R, L, sweeps, repeats, rng):
    spins = rng.choice(np.array([-1, 1], dtype=np.int8), size=(R, L, L))
    K.numpy_checkerboard_sweep(spins, 1.0, 0.0, BETA_C, rng, 1)  # warm-up
    t = best_time(lambda: K.numpy_checkerboard_sweep(spins, 1.0, 0.0, BETA_C, rng, sweeps), repeats)
    return R * L * L * sweeps / (t * 1e9)


def bench_ours(R, L, sweeps, per_call, repeats, rng):
    """Flips/ns of ``sweeps`` sweeps made in calls of ``per_call`` sweeps."""
    spins = rng.choice(np.array([-1, 1], dtype=np.int8), size=(R, L, L))
    ones = np.ones((L, L), dtype=np.int8)
    thr = K.ising_thresholds(np.full(R, BETA_C), 1.0, 0.0, METHOD)
    rids = np.arange(R, dtype=np.int64)
    K.ising_sweep(spins, ones, ones, thr, KEY, rids, 0, 0, 1)  # warm-up: compile / load the cache
    state = {"t": 1}

    def run():
        for _ in range(sweeps // per_call):
            K.ising_sweep(spins, ones, ones, thr, KEY, rids, 0, state["t"], per_call)
            state["t"] += per_call

    t = best_time(run, repeats)
    return R * L * L * (sweeps // per_call) * per_call / (t * 1e9)


def bench_gpu(R, L, sweeps, repeats):
    cp = backend.cupy()
    rng = np.random.default_rng(0)
    spins = cp.asarray(rng.choice(np.array([-1, 1], dtype=np.int8), size=(R, L, L)))
    ones = cp.ones((L, L), dtype=cp.int8)
    thr = K.ising_thresholds(np.full(R, BETA_C), 1.0, 0.0, METHOD)
    rids = np.arange(R, dtype=np.int64)
    K.ising_sweep(spins, ones, ones, thr, KEY, rids, 0, 0, 1)  # warm-up: compile
    cp.cuda.Device().synchronize()

    def run():
        K.ising_sweep(spins, ones, ones, thr, KEY, rids, 0, 1, sweeps)  # returns host counts: synchronises
        cp.cuda.Device().synchronize()

    t = best_time(run, repeats)
    return R * L * L * sweeps / (t * 1e9)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write the table to this .md or .json file")
    ap.add_argument("--quick", action="store_true", help="fewer sweeps and repeats (a smoke run)")
    args = ap.parse_args(argv)

    import numba

    threads = numba.get_num_threads()
    rng = np.random.default_rng(12345)
    scale = 0.25 if args.quick else 1.0
    reps = 3 if args.quick else 25
    # (R, L, peer sweeps, our sweeps): a peer repeat runs ~0.5 s, one of ours ~10-50 ms. Ours
    # takes the best of many short repeats: a parallel region waits for its slowest thread, so on
    # a shared machine a repeat that overlaps another job's time slice is an outlier.
    cases = [(64, 64, 20, 80), (16, 256, 12, 24), (1, 1024, 16, 24)]
    device = f"{cpu_name()}, {os.cpu_count()} logical CPUs, numba threads = {threads}"
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print(f"device: {device}; 1-min load average at start: {load:.2f}")
    print(f"model: 2D Ising ferromagnet, {METHOD}, beta = {BETA_C}; figures are spin flips (site updates) per ns")
    rows = []
    for R, L, ps, os_ in cases:
        ps_, os_ = max(2, int(ps * scale)), max(8, int(os_ * scale))
        peer = bench_peer(R, L, ps_, 2 if args.quick else 3, rng)
        ours4 = bench_ours(R, L, os_, 4, reps, rng)
        ours_long = bench_ours(R, L, os_, os_, reps, rng)
        numba.set_num_threads(1)
        try:
            ours_1t = bench_ours(R, L, os_, os_, max(2, reps // 3), rng)
        finally:
            numba.set_num_threads(threads)
        rows.append({"lattice": f"{R} x {L}x{L}", "R": R, "L": L, "peer_numpy": peer,
                     "ours_4_per_call": ours4, "ours_one_call": ours_long, "ours_one_thread": ours_1t,
                     "ratio_4_per_call": ours4 / peer, "ratio_one_call": ours_long / peer})
    gpu_ok, gpu_desc = backend.gpu_status()
    gpu = None
    if gpu_ok:
        R, L = (4, 1024) if args.quick else (16, 1024)
        gpu = {"lattice": f"{R} x {L}x{L}", "device": gpu_desc,
               "flips_per_ns": bench_gpu(R, L, 20 if args.quick else 100, reps)}

    head = ("| lattice | peer NumPy (1 thread) | ours, 4 sweeps/call | ours, one call | "
            "ratio (4/call) | ratio (one call) | ours, 1 thread, one call |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['lattice']} | {r['peer_numpy']:.4f} | {r['ours_4_per_call']:.3f} | "
                     f"{r['ours_one_call']:.3f} | {r['ratio_4_per_call']:.1f}x | {r['ratio_one_call']:.1f}x | "
                     f"{r['ours_one_thread']:.3f} |")
    # the targets are for all cores; the 1-thread column is context (immune to time slicing)
    worst = min(min(r["ours_4_per_call"], r["ours_one_call"]) for r in rows)
    worst_ratio = min(min(r["ratio_4_per_call"], r["ratio_one_call"]) for r in rows)
    verdict = (f"CPU targets: >= {TARGET_FLIPS_PER_NS} flips/ns (worst here {worst:.3f}: "
               f"{'met' if worst >= TARGET_FLIPS_PER_NS else 'NOT met'}), >= {TARGET_RATIO:.0f}x NumPy "
               f"(worst here {worst_ratio:.1f}x: {'met' if worst_ratio >= TARGET_RATIO else 'NOT met'})")
    if gpu is not None:
        gpu_line = (f"GPU ({gpu['device']}), CuPy kernel, {gpu['lattice']}: {gpu['flips_per_ns']:.1f} flips/ns "
                    f"(target >= {TARGET_GPU_FLIPS_PER_NS:.0f}: "
                    f"{'met' if gpu['flips_per_ns'] >= TARGET_GPU_FLIPS_PER_NS else 'NOT met'})")
    else:
        gpu_line = f"GPU: not measured ({gpu_desc})"
    print("\n".join(lines))
    print(verdict)
    print(gpu_line)

    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"benchmark": "ising checkerboard sweep", "device": device, "load_average_1min": load,
                "method": METHOD, "beta": BETA_C, "unit": "spin flips (site updates) per ns",
                "date": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": bool(args.quick)}
        if args.out.suffix == ".json":
            args.out.write_text(json.dumps({**meta, "cpu": rows, "gpu": gpu}, indent=2) + "\n")
        else:
            text = [f"# Ising checkerboard sweep ({meta['date']})", "",
                    f"Device: {device}; 1-min load average at start: {load:.2f}. "
                    f"2D Ising ferromagnet, {METHOD}, beta = {BETA_C}; spin flips (site updates) per ns.",
                    "", *lines, "", verdict, "", gpu_line, ""]
            args.out.write_text("\n".join(text))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
