"""TESLA grid results of two commits side by side: objectives, zero patterns and BIC-selected edges.

    # results of this checkout (the fast solver: --screen 1) and of an older commit through a shim
    # package first on PYTHONPATH (recipe: benchmarks/README.md, "tesla.py"):
    .venv/bin/python benchmarks/tesla_against.py dump benchmarks 1 /tmp/new.npz
    cd /tmp/b/c && PYTHONPATH=/tmp/b/shim <this checkout>/.venv/bin/python \\
        <this checkout>/benchmarks/tesla_against.py dump /tmp/b/c/benchmarks 0 /tmp/old.npz
    .venv/bin/python benchmarks/tesla_against.py compare /tmp/old.npz /tmp/new.npz

``dump`` imports the ``benchmarks/tesla.py`` found in the given folder (so the solver and the graph are
that commit's) and runs, on a LocalCluster of 2 workers, the pipeline's TESLA and static graphs and the
grid check graph (F and the zero pattern at all 2,500 grid points) with ``screen`` 0 (full-update
solver) or 1 (active sets); it saves them with the wall times. ``compare`` prints the relative F
difference, the zero-pattern bits that differ and the selected edges (AND and OR rules) in one only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def dump(bench: str, screen: bool, path: str) -> None:
    sys.path.insert(0, bench)
    import tesla as bench_tesla  # that commit's benchmarks/tesla.py

    a = argparse.Namespace(seed=0, p=100, T=100, n=10)
    _, series = bench_tesla.make_data(a)
    out = bench_tesla.run_pgmflow(series, 2, ["tesla", "static"], a, screen=screen, grid=True)
    np.savez(
        path,
        obj=out["grid"][1],
        nz=out["grid"][2],
        tesla=out["tesla"][1],
        static=out["static"][1],
        secs=[out["tesla"][0], out["static"][0], out["grid"][0]],
    )
    print(
        f"saved {path}: TESLA graph {out['tesla'][0]:.1f} s, static {out['static'][0]:.1f} s, grid check "
        f"{out['grid'][0]:.1f} s on 2 workers"
    )


def compare(old_path: str, new_path: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from pgmflow.tasks.tesla import evaluate

    old, new = np.load(old_path), np.load(new_path)
    rel = (new["obj"] - old["obj"]) / np.abs(old["obj"])
    print(f"F at {rel.size} grid points, (new - old) / |old|: max {rel.max():+.2e}, min {rel.min():+.2e}")
    print(
        f"zero-pattern entries that differ: {int(np.unpackbits(old['nz'] ^ new['nz']).sum())} of "
        f"{old['obj'].size * old['tesla'].shape[1] * old['tesla'].shape[2]}"
    )
    for m in ("tesla", "static"):
        for r in ("and", "or"):
            e_old, e_new = evaluate.edge_sets(old[m], r), evaluate.edge_sets(new[m], r)
            print(
                f"{m}, {r} rule: selected edges old {int(e_old.sum()) // 2}, new {int(e_new.sum()) // 2}, "
                f"in one only {int((e_old ^ e_new).sum()) // 2}"
            )
    o, n = old["secs"], new["secs"]
    print(
        f"wall seconds on 2 workers, old -> new: TESLA graph {o[0]:.1f} -> {n[0]:.1f} ({o[0] / n[0]:.2f}x), static "
        f"{o[1]:.1f} -> {n[1]:.1f} ({o[1] / n[1]:.2f}x), grid check {o[2]:.1f} -> {n[2]:.1f} ({o[2] / n[2]:.2f}x)"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("bench_dir")
    d.add_argument("screen", choices=("0", "1"))
    d.add_argument("path")
    c = sub.add_parser("compare")
    c.add_argument("old")
    c.add_argument("new")
    a = ap.parse_args()
    if a.cmd == "dump":
        dump(a.bench_dir, a.screen == "1", a.path)
    else:
        compare(a.old, a.new)


if __name__ == "__main__":
    main()
