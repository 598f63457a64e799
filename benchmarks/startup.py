"""Start-up cost of small runs (issue 38): a debug-size run of each pipeline, timed from process start to exit,
split into what the measurements can separate, each in a fresh process as a user meets it:

* ``python -c "import pgmflow.__main__"``: Python and pgmflow's command path (any layout);
* ``pgmflow --cfg job``: plus Hydra's composition (what every command pays before any work);
* a debug run on the synchronous scheduler in a folder whose store exists (no cluster, no new store);
* the same on the default local profile (``cluster.in_process=auto``: a debug run's small work runs in the
  driver, pgmflow.core.smallwork), and with ``cluster.in_process=false`` (2 worker processes started);
* the same in a new folder (a new SQLite store: pgmflow copies an empty one, pgmflow.core.store);
* ``python -c "import mlflow"``, ``import dask.distributed``: the two largest imports, for scale;
* ``--warm``: each debug run through a warm server (``pgmflow warm start``, pgmflow.core.warm) against the same
  run in its own process, alternating.

Prints the table (median of ``--repeat`` runs) and the targets: at most 3 s with an existing store, 6 s in a
new folder. The peer: the issue's measurement before (a debug svi run 6.8 s, 5.3 s synchronous, quiet
2-core machine), printed beside ours with the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PIPELINES = ["tempering", "svi", "tesla", "bounds", "sparse_gp"]
BEFORE_SVI = {"local": 6.8, "synchronous": 5.3}  # issue 38, quiet 2-core machine, before


def timed(args, cwd) -> float:
    t = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "PGMFLOW_IN_PROCESS"}  # the key's own default: auto
    r = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit(f"failed: {' '.join(map(str, args))}\n{r.stderr[-3000:]}")
    return time.perf_counter() - t


def median(f, n):
    return statistics.median(f() for _ in range(n))


def phases(repeat: int):
    """The phase table: one column per pipeline, medians of ``repeat`` runs of ``startup_phases.py``."""
    import json

    script = Path(__file__).with_name("startup_phases.py")
    env = {k: v for k, v in os.environ.items() if k != "PGMFLOW_IN_PROCESS"}
    cols = {}
    with tempfile.TemporaryDirectory() as d:
        for name in PIPELINES:
            args = [sys.executable, str(script), f"pipeline={name}", "debug=default", "progress=false"]
            subprocess.run(args, cwd=d, capture_output=True, env=env)  # the store exists from here on
            runs = []
            for _ in range(repeat):
                r = subprocess.run(args, cwd=d, capture_output=True, text=True, env=env)
                if r.returncode:
                    sys.exit(f"failed: {' '.join(args)}\n{r.stderr[-3000:]}")
                runs.append(json.loads(r.stderr.strip().splitlines()[-1]))
            cols[name] = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
    print(f"debug runs in the driver, existing store, seconds (medians of {repeat}; benchmarks/startup_phases.py)")
    print(f"{'phase':48s}" + "".join(f"{n:>11s}" for n in PIPELINES))
    for k in cols[PIPELINES[0]]:
        print(f"{k:48s}" + "".join(f"{cols[n][k]:11.2f}" for n in PIPELINES))
    if os.cpu_count():
        print(f"({os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} at the end)")


def warm_table(repeat: int):
    """The ``warm`` column: one warm server (``pgmflow warm start``, in a private temporary XDG_RUNTIME_DIR so that
    no other command meets it), then each pipeline's debug run through it, alternating with the same run in its
    own process (``PGMFLOW_WARM=0``), in a folder whose store exists, and through it in a new folder (the run makes
    its store); medians of ``repeat``."""
    py = sys.executable
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "xdg").mkdir(mode=0o700)
        (d / "store").mkdir()
        env = {k: v for k, v in os.environ.items() if k not in ("PGMFLOW_IN_PROCESS", "PGMFLOW_WARM")}
        env["XDG_RUNTIME_DIR"] = str(d / "xdg")
        cold_env = {**env, "PGMFLOW_WARM": "0"}

        restarts = []

        fresh = [0]

        def run(args, e, new_folder=False) -> float:
            for _ in range(3):
                cwd = d / "store"
                if new_folder:  # a folder of its own: the run makes its store (pgmflow.core.store)
                    fresh[0] += 1
                    cwd = d / f"new{fresh[0]}"
                    cwd.mkdir()
                t = time.perf_counter()
                r = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=e)
                took = time.perf_counter() - t
                if e is env and "warm server not used" in r.stderr:  # a source file edited meanwhile: restart it
                    restarts.append(r.stderr.split("warm server not used: ")[1].split(";")[0])
                    subprocess.run([py, "-m", "pgmflow", "warm", "start"], capture_output=True, env=env)
                    continue
                if r.returncode:
                    sys.exit(f"failed: {' '.join(map(str, args))}\n{r.stderr[-3000:]}")
                return took
            sys.exit(f"the warm server went stale three times in a row: {restarts[-1]}")

        t = time.perf_counter()
        start = subprocess.run([py, "-m", "pgmflow", "warm", "start"], capture_output=True, text=True, env=env)
        if start.returncode:
            sys.exit(f"pgmflow warm start failed:\n{start.stdout}{start.stderr}")
        start_s = time.perf_counter() - t
        load = [os.getloadavg()[0]]
        print(f"pgmflow warm start: {start_s:.2f} s (once)")
        print(
            f"{'pipeline (debug=default)':26s} {'cold, store':>12s} {'warm, store':>12s} {'ratio':>6s}  target <= 3 s"
            f"  {'warm, new folder':>16s}  target <= 6 s"
        )
        try:
            for name in PIPELINES:
                base = [py, "-m", "pgmflow", f"pipeline={name}", "debug=default", "progress=false"]
                run(base, cold_env)  # the store and this pipeline's numba cache exist from here on
                cold, warm, new = [], [], []
                for _ in range(repeat):  # back to back, alternating
                    cold.append(run(base, cold_env))
                    warm.append(run(base, env))
                    new.append(run(base, env, new_folder=True))
                    load.append(os.getloadavg()[0])
                c, w, n = statistics.median(cold), statistics.median(warm), statistics.median(new)
                print(
                    f"{name:26s} {c:12.2f} {w:12.2f} {c / w:5.2f}x  {'met' if w <= 3 else 'NOT met':13s}"
                    f"  {n:16.2f}  {'met' if n <= 6 else 'NOT met'}"
                )
        finally:
            subprocess.run([py, "-m", "pgmflow", "warm", "stop"], capture_output=True, env=env)
    for why in restarts:
        print(f"(the server was restarted once and that run repeated: {why})")
    print(f"({os.cpu_count()} CPUs; load average {min(load):.1f}-{max(load):.1f} during the runs)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--phases",
        action="store_true",
        help="only the phase table: each pipeline's debug run in the driver, with an existing store, split into "
        "its phases by benchmarks/startup_phases.py (medians of --repeat)",
    )
    ap.add_argument(
        "--warm",
        action="store_true",
        help="only the warm-start table: each pipeline's debug run through one `pgmflow warm start` server against "
        "the same run in its own process, alternating, with an existing store (medians of --repeat)",
    )
    a = ap.parse_args()
    if a.phases:
        return phases(a.repeat)
    if a.warm:
        return warm_table(a.repeat)
    py = sys.executable
    rows = []
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "store").mkdir()
        rows.append(
            (
                "import pgmflow.__main__ (the CLI)",
                median(lambda: timed([py, "-c", "import pgmflow.__main__"], d), a.repeat),
            )
        )
        rows.append(("import mlflow", median(lambda: timed([py, "-c", "import mlflow"], d), a.repeat)))
        rows.append(
            ("import dask.distributed", median(lambda: timed([py, "-c", "import dask.distributed"], d), a.repeat))
        )
        rows.append(("pgmflow --cfg job", median(lambda: timed([py, "-m", "pgmflow", "--cfg", "job"], d), a.repeat)))
        print(f"{'what':42s} {'seconds':>8s}")
        for what, s in rows:
            print(f"{what:42s} {s:8.2f}")
        print(
            f"\n{'pipeline (debug=default)':26s} {'sync, store':>12s} {'local, store':>13s} {'local, new folder':>18s}"
            f" {'workers, store':>15s}"
        )
        worst_existing, worst_new = 0.0, 0.0
        for name in PIPELINES:
            base = [py, "-m", "pgmflow", f"pipeline={name}", "debug=default", "progress=false"]
            timed([*base, "cluster.profile=synchronous"], d / "store")  # the store exists from here on
            sync = median(lambda: timed([*base, "cluster.profile=synchronous"], d / "store"), a.repeat)
            local = median(lambda: timed(base, d / "store"), a.repeat)

            def fresh():
                with tempfile.TemporaryDirectory(dir=d) as f:
                    return timed(base, f)

            new = median(fresh, a.repeat)
            workers = median(lambda: timed([*base, "cluster.in_process=false"], d / "store"), a.repeat)
            worst_existing, worst_new = max(worst_existing, min(sync, local)), max(worst_new, new)
            print(f"{name:26s} {sync:12.2f} {local:13.2f} {new:18.2f} {workers:15.2f}")
            if name == "svi":
                svi = (sync, local)
    print(
        f"\nsvi debug run, before (issue 38): {BEFORE_SVI['local']} s local, {BEFORE_SVI['synchronous']} s synchronous; "
        f"now {svi[1]:.2f} s and {svi[0]:.2f} s (ratio {BEFORE_SVI['local'] / svi[1]:.2f}x, {BEFORE_SVI['synchronous'] / svi[0]:.2f}x)"
    )
    print(
        f"slowest pipeline with an existing store (best profile): {worst_existing:.2f} s; target <= 3 s: {'met' if worst_existing <= 3 else 'NOT met'}"
    )
    print(
        f"slowest pipeline in a new folder: {worst_new:.2f} s; target <= 6 s: {'met' if worst_new <= 6 else 'NOT met'}"
    )
    if os.cpu_count():
        print(f"({os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} at the end)")


if __name__ == "__main__":
    main()
