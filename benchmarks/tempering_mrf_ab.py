"""The MRF CPU sweep kernel of this tree against the one of an earlier commit, in one process, on the same data.

    .venv/bin/python benchmarks/tempering_mrf_ab.py --ref 061f1b1 [--threads 1] [--sweeps 32] [--repeats 7]
        [--out benchmarks/results/tempering_mrf-ab.md]

The reference's ``tasks/tempering/mrf_kernels.py`` and ``mrf_lanes.py`` are read with ``git show REF:...`` into
modules of their own (their numba cache beside them in a temporary directory), so both kernels run in this
process, on the same spins, levels and keys, timed in turns (best of ``--repeats``; a shared VM drifts by 10%
or more between runs, so only ratios from one run mean much). Every configuration is checked first to give the
same spins and change counts in both. Rows: the benchmark graphs of ``benchmarks/tempering_mrf.py`` (random
4-regular graph of 10,000 nodes at 16, 32 and 64 replicas; dense 100-node network at 64), heat bath and
Metropolis, levels spread over [0.3, 1]; ``--threads 1``: one block on one thread (``_sweeps_serial``),
``--threads k > 1``: the colours' nodes shared by k threads (``_sweep_nodes``).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import numpy as np  # noqa: E402
from _machine import cpu_name  # noqa: E402
from tempering_mrf import KEY, dense_network, regular_graph  # noqa: E402

from pgmflow.tasks.tempering import mrf_kernels as K  # noqa: E402
from pgmflow.tasks.tempering import mrf_target as T  # noqa: E402

LANES = "from pgmflow.tasks.tempering import mrf_lanes"


def reference_kernels(ref: str, where: Path) -> dict:
    """The compiled kernels of ``ref``'s mrf_kernels/mrf_lanes, loaded as modules ``ref_mrf_kernels`` and
    ``ref_mrf_lanes`` from files in ``where``."""

    def show(path):
        return subprocess.run(
            ["git", "-C", str(REPO), "show", f"{ref}:{path}"], check=True, capture_output=True, text=True
        ).stdout

    kernels = show("tasks/tempering/mrf_kernels.py")
    if LANES not in kernels:
        raise SystemExit(f"{ref}: mrf_kernels.py does not import mrf_lanes as this script expects")
    (where / "ref_mrf_lanes.py").write_text(show("tasks/tempering/mrf_lanes.py"))
    (where / "ref_mrf_kernels.py").write_text(kernels.replace(LANES, "import ref_mrf_lanes as mrf_lanes"))
    sys.path.insert(0, str(where))
    mods = {}
    for name in ("ref_mrf_lanes", "ref_mrf_kernels"):
        spec = importlib.util.spec_from_file_location(name, where / f"{name}.py")
        mods[name] = importlib.util.module_from_spec(spec)
        sys.modules[name] = mods[name]
        spec.loader.exec_module(mods[name])
    return mods["ref_mrf_kernels"]._kernels()


class Case:
    """One configuration's arguments, made once; ``run`` sweeps a fresh copy of the start."""

    def __init__(self, target, R, metro, sweeps, threads):
        n = target.n_sites
        rng = np.random.default_rng(2)
        self.x0 = np.where(rng.random((R, n)) < 0.5, 1, -1).astype(np.int8)
        b, key, rid = K._check(self.x0, np.linspace(0.3, 1.0, R), KEY, np.arange(R), 100, sweeps, "heatbath", n)
        a, lg = K.reference_rows(target, R, None, None)
        self.b, self.R, self.threads = b, R, threads
        self.out = np.zeros(R, dtype=np.int64)
        self.nfb = np.zeros(R, dtype=np.int64)
        t = target
        keys = (np.uint64(int(key[0])), np.uint64(int(key[1])))
        run = (np.uint64(0), np.int64(100), np.int64(sweeps))
        self.args = (t.h, a, lg, t.indptr, t.nbr, t.Jn, t.colptr, t.sites, keys, rid, run, metro, float(K.MARGIN))
        self.updates = R * n * sweeps

    def run(self, k):
        x = self.x0.copy()
        self.out[:] = 0
        self.nfb[:] = 0
        t0 = time.perf_counter()
        if self.threads == 1:
            k["_sweeps_serial"](x, self.b, *self.args, self.out, self.nfb, np.int64(self.R))
        else:
            k["_sweep_nodes"](x, 0, self.R, self.b, *self.args, self.out, self.nfb, np.int64(self.threads))
        return time.perf_counter() - t0, x, self.out.copy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", required=True, help="the commit to compare against (git rev)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sweeps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out")
    args = ap.parse_args()
    ours = K._kernels()
    with tempfile.TemporaryDirectory() as d:
        theirs = reference_kernels(args.ref, Path(d))
        lines = [
            f"# MRF CPU sweep: this tree against {args.ref} ({cpu_name()}, {args.threads} thread(s))",
            "",
            f"`benchmarks/tempering_mrf_ab.py --ref {args.ref} --threads {args.threads} --sweeps {args.sweeps} "
            f"--repeats {args.repeats}`: spin updates per ns, best of {args.repeats}, the two kernels timed in turns; "
            "every row gave the same spins and change counts in both.",
            "",
            f"| graph | replicas | method | {args.ref} | this tree | time ratio (this / {args.ref}) |",
            "|---|---|---|---|---|---|",
        ]
        print("\n".join(lines), flush=True)  # then each row as it is measured
        graphs = [
            ("random 4-regular, 10,000 nodes", regular_graph(), (16, 32, 64)),
            ("dense, 100 nodes", dense_network(), (64,)),
        ]
        for name, model, Rs in graphs:
            target = T.make_mrf_target(model)
            for R in Rs:
                for metro in (False, True):
                    case = Case(target, R, metro, args.sweeps, args.threads)
                    _, xa, ca = case.run(theirs)
                    _, xb, cb = case.run(ours)
                    if not (np.array_equal(xa, xb) and np.array_equal(ca, cb)):
                        raise SystemExit(f"{name}, {R} replicas, metropolis={metro}: the kernels' bits differ")
                    ta, tb = [], []
                    for _ in range(args.repeats):
                        ta.append(case.run(theirs)[0])
                        tb.append(case.run(ours)[0])
                    a, b = min(ta), min(tb)
                    row = (
                        f"| {name} | {R} | {'Metropolis' if metro else 'heat bath'} | {case.updates / a / 1e9:.3f} | "
                        f"{case.updates / b / 1e9:.3f} | {b / a:.2f} |"
                    )
                    print(row, flush=True)
                    lines.append(row)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
