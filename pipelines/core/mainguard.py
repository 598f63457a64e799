"""A script that calls ``pgmflow.run`` at its top level, outside ``if __name__ == "__main__":``, and would start
local worker processes: stopped before anything starts, with one line that says what to add.

Dask's local workers are started by multiprocessing's *spawn*, which imports the main script again in each new
process (as ``__mp_main__``); an unguarded ``pgmflow.run(...)`` there starts a cluster from inside a starting
process, and Python stops it with "An attempt has been made to start a new process before the current process
has finished its bootstrapping phase", which Dask reports as "Nanny failed to start". Started another way
(fork), the workers would inherit the driver's threads and locks. So the script needs the guard, and pgmflow says
so before it starts anything. Notebooks and ``python -c`` have no script file and need no guard.
"""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

FIX = 'put the pgmflow calls under  if __name__ == "__main__":  (docs/python_api.md)'


def _is_main_test(node: ast.expr) -> bool:
    if not isinstance(node, ast.Compare) or len(node.ops) != 1 or not isinstance(node.ops[0], ast.Eq):
        return False
    sides = [node.left, *node.comparators]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1


def guarded(source: str, lineno: int) -> bool:
    """Whether line ``lineno`` of a module's source lies inside a top-level ``if __name__ == "__main__":``."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and _is_main_test(node.test):
            if node.body[0].lineno <= lineno <= (node.end_lineno or lineno):
                return True
    return False


def unguarded_call_site() -> str | None:
    """``script.py:LINE`` when the first caller outside pgmflow is the top level of the main script and is not
    under the guard; None otherwise (a function, a notebook, ``python -c``, an unreadable file)."""
    frame = inspect.currentframe()
    while frame is not None and frame.f_globals.get("__name__", "").startswith("pgmflow"):
        frame = frame.f_back
    if frame is None or frame.f_code.co_name != "<module>":
        return None
    if frame.f_globals.get("__name__") not in ("__main__", "__mp_main__"):
        return None
    path = Path(frame.f_code.co_filename)
    try:
        source = path.read_text(encoding="utf-8")
        return None if guarded(source, frame.f_lineno) else f"{path.name}:{frame.f_lineno}"
    except (OSError, SyntaxError, ValueError):
        return None


def starts_local_processes(cfg: dict) -> bool:
    from pgmflow.core import cluster

    try:
        prof = cluster.check_cluster_config(cfg.get("cluster") or {})
    except Exception:
        return False  # the run refuses the cluster itself, with its own line
    return prof.get("type") in ("local", "local_cuda") and prof.get("processes", True) is not False


def check(cfg: dict):
    """Exit with one line (status 2) when an unguarded top-level script call would start local processes."""
    site = unguarded_call_site()
    if site is None or not starts_local_processes(cfg):
        return
    print(
        f"pgmflow: error: pgmflow.run at {site} is at the top level of the script: the local cluster's worker "
        f"processes import the script again and would run it again; fix: {FIX}",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(2)
