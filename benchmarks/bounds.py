"""Loopy BP and TRW message passing on a 256 x 256 lattice: pgmflow's numba kernel against a
straightforward NumPy implementation of the same updates, in the same run.

    .venv/bin/python benchmarks/bounds.py [--out benchmarks/results/bounds.md] [--L 256] [--iters 200]

The model: a periodic L x L Ising lattice at beta = 0.4 (J = 1) with small random fields
(uniform in [-0.2, 0.2], seed 0; without fields the messages sit at their symmetric fixed point
from the first iteration). Both implementations run the same damped (0.5) synchronous schedule
from zero messages, for a fixed number of iterations (tol = 0, so neither stops early):

* **peer**: ``pgmflow.tasks.bounds.messages.lattice_messages_xp`` on NumPy arrays, the update written the
  obvious way, vectorised per edge direction (four message arrays, neighbour sums by ``roll``);
  the same function is pgmflow's CuPy path on a GPU;
* **ours**: ``pgmflow.tasks.bounds.lattice_kernel.lattice_messages_numba``, what the pipeline runs on
  lattices: the same iterates kept as ``w = exp(2u)``, so a message costs two divisions and a
  square root and no exp or log (TRW adds one exp and one log per site), in contiguous row loops
  that the compiler vectorises, parallel over rows; on 1 thread and on every core. Also timed:
  ``messages.run_messages``, the log-domain numba kernel for any graph (CSR adjacency).

Loopy BP is the rho = 1 case; TRW uses the uniform edge appearance probability (n - 1) / E of the
periodic lattice. Each figure is the best of ``--repeats`` runs. The script checks that both
implementations reach the same log Z (bound or Bethe value) after running to convergence.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from _machine import cpu_name, emit, stream_bandwidth  # noqa: E402

from pgmflow.tasks import backend  # noqa: E402
from pgmflow.tasks.bounds import lattice_kernel, messages, mrf  # noqa: E402


def best(f, repeats):
    out, times = None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t0)
    return min(times), out


# float64 arrays streamed per site and iteration by lattice_kernel._iterate, each pass counted once: the
# product pass reads the 4 messages and exp(2h) and writes B (6), the send pass reads B, the 4 messages
# and the 4 bond arrays p, q (right and down) and writes the 4 new messages (13), the copy pass reads
# the 4 new and writes the 4 current messages (8).
WORDS_PER_SITE = 6 + 13 + 8


def traffic_section(rows, n_sites, iters, n_threads):
    """The lattice kernel's memory traffic against STREAM-like bandwidth measured now, as markdown."""
    bw1, bwn = stream_bandwidth(1), stream_bandwidth(n_threads)
    gb = 8.0 * WORDS_PER_SITE * n_sites * iters / 1e9
    lines = [
        "",
        f"Machine limit (load average {os.getloadavg()[0]:.1f}; the machine is shared with other work): "
        f"traffic = {WORDS_PER_SITE} x 8 bytes per site per iteration ({gb:.2f} GB for {iters} iterations; "
        "each array pass counted once, see WORDS_PER_SITE) against STREAM-like bandwidth measured in the "
        f"same run on arrays of 64 MiB: 1 thread copy {bw1['copy']:.1f} / triad {bw1['triad']:.1f} GB/s, "
        f"{n_threads} threads copy {bwn['copy']:.1f} / triad {bwn['triad']:.1f} GB/s. The lattice kernel's "
        f"working set (14 arrays of {n_sites} doubles) may sit in the last-level cache, so more than 100 % "
        "is possible.",
        "",
        "| method | ours 1 thread: GB/s | % of 1-thread triad | ours all threads: GB/s | % of all-thread triad |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, _, t1, tn, *_ in rows:
        lines.append(
            f"| {name} | {gb / t1:.1f} | {100 * gb / t1 / bw1['triad']:.0f} % | {gb / tn:.1f} | "
            f"{100 * gb / tn / bwn['triad']:.0f} % |"
        )
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--L", type=int, default=256)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--beta", type=float, default=0.4)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    nb = backend.numba()
    n_threads = nb.config.NUMBA_NUM_THREADS
    L = a.L
    rng = np.random.default_rng(0)
    h = rng.uniform(-0.2, 0.2, (L, L))
    model = mrf.ising_lattice(L, J=1.0, beta=a.beta)
    model = model._replace(h=h.reshape(-1).copy())
    t0 = time.perf_counter()
    adj = mrf.adjacency(model)
    adj_s = time.perf_counter() - t0
    hL, Jr, Jd, rr, rd = messages.lattice_arrays(model, L, L, True)
    rho_trw = np.full(model.E, (model.n - 1) / model.E)
    rows = []
    for name, rho in (("loopy BP", np.ones(model.E)), ("TRW", rho_trw)):
        _, _, _, rr, rd = messages.lattice_arrays(model, L, L, True, rho=rho)
        args = (hL, Jr, Jd, rr, rd, True, 0.5)
        lattice_kernel.lattice_messages_numba(*args, 2, 0.0)  # compile / load the kernels
        messages.run_messages(model, rho, 0.5, 2, 0.0, adj=adj)
        nb.set_num_threads(1)
        t1, _ = best(lambda: lattice_kernel.lattice_messages_numba(*args, a.iters, 0.0), a.repeats)
        tc1, _ = best(lambda: messages.run_messages(model, rho, 0.5, a.iters, 0.0, adj=adj), a.repeats)
        nb.set_num_threads(n_threads)
        tn, _ = best(lambda: lattice_kernel.lattice_messages_numba(*args, a.iters, 0.0), a.repeats)
        tp, _ = best(lambda: messages.lattice_messages_xp(*args, a.iters, 0.0), a.repeats)
        # both to convergence: the same value of log Z
        ours = messages.lattice_beliefs_xp(
            hL, Jr, Jd, rr, rd, True, lattice_kernel.lattice_messages_numba(*args, 100_000, 1e-10)
        )
        peer = messages.lattice_run_xp(*args, 100_000, 1e-10)
        rows.append((name, tp, t1, tn, tc1, float(ours.log_z), float(peer.log_z), ours.n_iter, peer.n_iter))
        print(
            f"{name}: NumPy {tp:.3f} s, numba lattice 1 thread {t1:.3f} s, {n_threads} threads {tn:.3f} s; "
            f"numba CSR 1 thread {tc1:.3f} s",
            flush=True,
        )
    out = io.StringIO()
    out.write(f"# Message passing on a {L} x {L} periodic Ising lattice (beta {a.beta}), {a.iters} iterations\n\n")
    out.write(
        f"Machine: {cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, numba "
        f"{nb.__version__}; command: `.venv/bin/python benchmarks/bounds.py`\n\n"
    )
    out.write(
        "| method | NumPy per direction (peer), s | ours 1 thread, s | ratio | "
        f"ours {n_threads} threads, s | ratio | any-graph CSR kernel 1 thread, s | ratio |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    for name, tp, t1, tn, tc1, *_ in rows:
        out.write(
            f"| {name} | {tp:.3f} | {t1:.3f} | {tp / t1:.2f}x | {tn:.3f} | {tp / tn:.2f}x | {tc1:.3f} | "
            f"{tp / tc1:.2f}x |\n"
        )
    out.write(
        "\nRun to convergence (tol 1e-10), both implementations:\n\n| method | log Z per site, numba | "
        "log Z per site, NumPy | difference | iterations (numba / NumPy) |\n| --- | --- | --- | --- | --- |\n"
    )
    for name, _, _, _, _, vo, vp, io_, ip in rows:
        out.write(f"| {name} | {vo / model.n:.12f} | {vp / model.n:.12f} | {abs(vo - vp):.1e} | {io_} / {ip} |\n")
    out.write(f"\nThe CSR adjacency (built once per model, any graph) took {adj_s:.3f} s.\n")
    out.write(traffic_section(rows, model.n, a.iters, n_threads))
    text = out.getvalue()
    emit(text, a.out)


if __name__ == "__main__":
    main()
