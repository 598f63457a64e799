"""pgmflow uses the public APIs of dask, distributed, scipy, hydra, omegaconf and mlflow; what it still needs of
their internals lives in one module, ``pipelines/core/internals.py`` (the quarantine), pinned to the versions
it was checked with. Read with ``ast`` (imports inside functions included), every other module of
``pipelines/``, ``tasks/`` and ``hydra_plugins/``:

* imports no private module or name of those libraries (``from scipy.optimize import _lbfgsb``,
  ``import dask._task_spec``, ``from x import _name``), and none of the internal modules listed below;
* reads no private attribute of a module of theirs (``scipy.optimize._lbfgsb``);
* reads no private attribute (``obj._name``) that pgmflow does not define itself: an attribute of one of
  their objects (``JobReturn._return_value``) is theirs.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
from pathlib import Path

import pytest

from tests.conftest import REPO

LIBS = ("scipy", "dask", "distributed", "hydra", "omegaconf", "mlflow")
QUARANTINE = REPO / "pipelines" / "core" / "internals.py"
# Internal modules without a leading underscore: reached only through the quarantine.
INTERNAL_MODULES = (
    "distributed.utils_comm",
    "distributed.core",
    "distributed.protocol",
    "distributed.comm",
    "hydra.core.plugins",
    "hydra._internal",
    "mlflow.store",
    "mlflow.utils",
)
# Private-looking names that are public APIs: the namedtuple protocol, the interpreter's.
PUBLIC_UNDERSCORED = {
    "_replace",
    "_asdict",
    "_fields",
    "_make",
    "_field_defaults",
    "_exit",
    "_getframe",
    "_current_frames",
    "_debugmallocstats",
    "_xoptions",
    "_name_",
}


def _sources() -> list[Path]:
    out = []
    for folder in ("pipelines", "tasks", "hydra_plugins"):
        out += sorted((REPO / folder).rglob("*.py"))
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_lib(module: str) -> bool:
    return module.split(".")[0] in LIBS


def _own_private_names(trees) -> set[str]:
    """Every ``_name`` that pgmflow itself defines: functions, classes, assigned attributes and names, arguments."""
    own = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.arg):
                own.add(node.arg)
            elif isinstance(node, ast.alias):
                own.add(node.asname or node.name.split(".")[0])
            elif isinstance(node, ast.keyword) and node.arg:
                own.add(node.arg)  # setattr-free dataclass fields and NamedTuple(...) fields
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                own.add(node.target.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                own.add(node.value)  # getattr(obj, "_name", ...) of an attribute pgmflow set
    return {n for n in own if _private(n)}


def _violations(path: Path, tree: ast.AST, own: set[str]) -> list[str]:
    rel = path.relative_to(REPO)
    out = []
    lib_aliases = {}  # local name -> library module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _is_lib(a.name):
                    lib_aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                    if any(_private(part) for part in a.name.split(".")) or a.name.startswith(INTERNAL_MODULES):
                        out.append(f"{rel}:{node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and _is_lib(node.module):
            if any(_private(part) for part in node.module.split(".")) or node.module.startswith(INTERNAL_MODULES):
                out.append(f"{rel}:{node.lineno}: from {node.module} import ...")
                continue
            for a in node.names:
                if _private(a.name):
                    out.append(f"{rel}:{node.lineno}: from {node.module} import {a.name}")
                elif f"{node.module}.{a.name}".startswith(INTERNAL_MODULES):
                    out.append(f"{rel}:{node.lineno}: from {node.module} import {a.name}")
                else:
                    lib_aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in PUBLIC_UNDERSCORED:
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in lib_aliases:
                out.append(
                    f"{rel}:{node.lineno}: {base.id}...{node.attr} (a private attribute of {lib_aliases[base.id]})"
                )
            elif node.attr not in own:
                out.append(f"{rel}:{node.lineno}: .{node.attr} (a private attribute pgmflow does not define)")
    return out


def test_no_private_or_internal_api_outside_the_quarantine():
    trees = {p: ast.parse(p.read_text(encoding="utf-8"), filename=str(p)) for p in _sources()}
    own = _own_private_names(trees)
    bad = [v for p, t in trees.items() if p != QUARANTINE for v in _violations(p, t, own)]
    assert not bad, "private or internal APIs of other libraries outside pipelines/core/internals.py:\n" + "\n".join(
        bad
    )


def test_the_check_finds_what_it_is_for():
    """The check itself: each kind of use it must refuse is refused, and public uses pass."""
    src = (
        "import dask._task_spec\n"
        "from scipy.optimize import _lbfgsb\n"
        "from distributed.utils_comm import gather_from_workers\n"
        "import scipy.optimize\n"
        "x = scipy.optimize._minimize\n"
        "def f(ret):\n"
        "    return ret._return_value\n"
        "from dask.task_spec import Task\n"
        "y = f(1)._replace(a=1)\n"
    )
    tree = ast.parse(src)
    found = _violations(REPO / "pipelines" / "x.py", tree, own=set())
    assert len(found) == 5, found
    assert any("_task_spec" in v for v in found) and any("_lbfgsb" in v for v in found)
    assert any("utils_comm" in v for v in found) and any("_minimize" in v for v in found)
    assert any("_return_value" in v for v in found)


def _version_tuple(v: str) -> tuple:
    return tuple(int(p) for p in v.split(".")[:2] if p.isdigit())


@pytest.mark.parametrize("dist", ["distributed"])
def test_the_quarantine_is_pinned_to_the_versions_it_was_checked_with(dist):
    """An upgrade past the checked range is a decision: re-check pipelines/core/internals.py, then widen it."""
    from pgmflow.core.internals import CHECKED

    lo, hi = CHECKED[dist]
    v = importlib.metadata.version(dist)
    assert _version_tuple(lo) <= _version_tuple(v) < _version_tuple(hi), (
        f"{dist} {v} is outside {lo} <= v < {hi}: re-check pipelines/core/internals.py against it"
    )


def test_the_quarantined_internals_still_work():
    """What the quarantine uses exists and behaves as it assumes, on the installed versions."""
    import logging

    from pgmflow.core import internals

    rec = logging.LogRecord(
        "distributed.scheduler",
        logging.ERROR,
        __file__,
        1,
        "Task %s marked as failed because %d workers died while trying to run it",
        ("x-1", 3),
        None,
    )
    assert not internals.KilledWorkerLogFilter().filter(rec)
    rec.msg, rec.args = "something else", ()
    assert internals.KilledWorkerLogFilter().filter(rec)

    import mlflow.utils.environment as env

    check = env.warn_dependency_requirement_mismatches  # the name the quarantine replaces for a model's save
    with internals.mlflow_requirements_unchecked():
        assert env.warn_dependency_requirement_mismatches is not check
        assert env.warn_dependency_requirement_mismatches(["numpy==0.0.1"]) is None
    assert env.warn_dependency_requirement_mismatches is check


def test_the_warm_servers_internals_still_work(tmp_path):
    """The warm server's quarantined calls (pgmflow.core.warm): Hydra's plugin scan runs; a numba kernel cached on
    disk by one process is loaded into a new process's dispatcher without a call, and then runs without
    compiling; numba's threading layer is reported as not started; ``interpreter_exit`` runs the atexit
    handlers and waits for a non-daemon thread before an ``os._exit``."""
    import subprocess
    import sys

    from pgmflow.core import internals

    internals.hydra_plugins_scanned()
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    make = (
        "import numpy as np\n"
        "from pgmflow.tasks.gp import fused\n"
        "k = fused._kernels()['_adjoint_block']\n"
        "k(np.ones((2, 3)), np.ones((2, 3)), np.ones(3), np.ones(2))\n"
    )
    subprocess.run([sys.executable, "-c", make], check=True, env=env, timeout=300)
    load = (
        "import numpy as np\n"
        "from pgmflow.core import internals\n"
        "from pgmflow.tasks.gp import fused\n"
        "k = fused._kernels()['_adjoint_block']\n"
        "assert not k.overloads\n"
        "n = internals.numba_load_cached_overloads(k)\n"
        "assert n >= 1 and len(k.overloads) == n, n\n"
        "k.disable_compile()\n"
        "R = np.ones((2, 3)); k(R, np.ones((2, 3)), np.ones(3), np.ones(2))\n"
        "assert (R == -2.0).all(), R  # -(1 + 1 * 1) * 1\n"
        "assert internals.numba_threading_started() is False\n"
        "print('loaded', n)\n"
    )
    out = subprocess.run([sys.executable, "-c", load], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "loaded" in out.stdout, out.stderr[-2000:]
    leave = (
        "import atexit, os, threading, time\n"
        "from pgmflow.core import internals\n"
        "atexit.register(lambda: print('atexit ran', flush=True))\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread done', flush=True))).start()\n"
        "internals.interpreter_exit()\n"
        "os._exit(0)\n"
    )
    out = subprocess.run([sys.executable, "-c", leave], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["thread", "done", "atexit", "ran"], out.stdout + out.stderr
