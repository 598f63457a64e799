"""One pgmflow CLI run split into its phases (issue 38), for ``benchmarks/startup.py --phases``.

Run as ``python benchmarks/startup_phases.py OVERRIDES...``: it wraps the functions that bound each phase with
wall-clock timers (no profiler: the figures are the run's own), runs ``pgmflow OVERRIDES`` in this process and
prints one JSON object on stderr's last line: ``{phase: seconds}`` in the order the run meets them. The phases:

* ``python + CLI imports``: from the interpreter's start to the CLI's first step (``time.perf_counter`` is
  read against the process start time, so the interpreter's own start is included);
* ``config``: the pre-check's composition of the config and Hydra's own composition and job set-up;
* ``preflight``: the plan and its checks;
* ``tracker (MLflow import, store)``: importing MLflow and opening the store (a new folder: copying the empty
  store too);
* ``run tags``: the versions, git and machine tags;
* ``work``: the workload's run, less its figures and model: the kernels (numba's from its cache), the work and
  the metric logging;
* ``figures``: rendering and logging the figures (matplotlib's import included where the run meets it first);
* ``model``: the pyfunc model saved and logged;
* ``end``: the run's end and the store's last writes;
* ``exit``: from the end of the run to the process's exit (interpreter shutdown, atexit hooks).
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import os
import sys
import time


def _process_start() -> float:
    """This process's start on the ``time.perf_counter`` clock (Linux: /proc/self/stat field 22)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.perf_counter() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter()


T0 = _process_start()
spans: dict[str, float] = {}
inner: dict[str, float] = {}


def _wrap(module: str, attr: str, phase: str):
    obj = importlib.import_module(module)
    *path, name = attr.split(".")
    for p in path:
        obj = getattr(obj, p)
    f = getattr(obj, name)

    @functools.wraps(f)
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spans[phase] = spans.get(phase, 0.0) + time.perf_counter() - t

    setattr(obj, name, timed)


def main():
    first = time.perf_counter()
    for module, attr, phase in [
        ("pgmflow.core.preflight", "preflight_checks", "preflight"),
        ("pgmflow.core.runner", "_tracker", "tracker (MLflow import, store)"),
        ("pgmflow.core.tracking", "versions", "run tags"),
        ("pgmflow.core.tracking", "git_info", "run tags"),
        ("pgmflow.core.runner", "_run_reconnecting", "run"),
        ("pgmflow.core.artifacts", "log_figures", "figures"),
        ("pgmflow.core.models", "log_pyfunc", "model"),
        ("pgmflow.core.tracking", "Tracker.end", "end"),
        ("pgmflow.core.runner", "execute", "execute"),
    ]:
        _wrap(module, attr, phase)
    instrument = time.perf_counter() - first
    end = {}

    @atexit.register
    def _report():  # registered first: runs after every other atexit hook (LIFO) but the interpreter's own
        total = time.perf_counter() - T0
        run = spans.pop("run", 0.0)
        execute = spans.pop("execute", 0.0)
        out = {"python + CLI imports": first - T0}
        out["config"] = end["cli_done"] - first - instrument - execute if "cli_done" in end else 0.0
        for k in ("preflight", "tracker (MLflow import, store)", "run tags"):
            out[k] = spans.get(k, 0.0)
        out["work"] = run - spans.get("figures", 0.0) - spans.get("model", 0.0)
        out["figures"] = spans.get("figures", 0.0)
        out["model"] = spans.get("model", 0.0)
        out["end"] = spans.get("end", 0.0)
        other = execute - sum(out[k] for k in ("preflight", "tracker (MLflow import, store)", "run tags", "end")) - run
        out["other (cluster choice, workload imports, store)"] = other
        out["exit"] = total - (end.get("cli_done", total) - T0)
        out["(pgmflow core imports, before the CLI here)"] = instrument
        out["total"] = total
        print(json.dumps({k: round(v, 3) for k, v in out.items()}), file=sys.stderr, flush=True)

    from pgmflow.core import cli

    sys.argv = ["pgmflow", *sys.argv[1:]]
    try:
        cli.main()
    except SystemExit as e:
        end["cli_done"] = time.perf_counter()
        if e.code:
            raise
    else:
        end["cli_done"] = time.perf_counter()


if __name__ == "__main__":
    main()
