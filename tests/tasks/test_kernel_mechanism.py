"""One way to compile numba kernels in ``tasks/``: module-level functions marked with
``backend.kernel`` and compiled by ``backend.compile_kernels`` behind the module's cached accessor.

No factory defines kernels inside a function and rebinds module names with ``global``; no module
calls ``njit`` itself; after its accessor, no module keeps a marked function uncompiled."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from pathlib import Path

import numpy as np
import pytest

from pgmflow.tasks import backend

TASKS = Path(backend.__file__).resolve().parent


def _sources():
    return sorted(p for p in TASKS.rglob("*.py") if "__pycache__" not in p.parts)


def _defined_functions(tree: ast.Module) -> set[str]:
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_no_global_statement_rebinds_a_function():
    """A ``global`` statement that names a function of its module, or sits in a function that defines
    functions of its own (a kernel factory), is the old mechanism."""
    found = []
    for path in _sources():
        tree = ast.parse(path.read_text(), filename=str(path))
        functions = _defined_functions(tree)
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            inner = any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in ast.walk(fn) if n is not fn)
            for g in (n for n in ast.walk(fn) if isinstance(n, ast.Global)):
                named = sorted(set(g.names) & functions)
                if named or inner:
                    found.append(f"{path.relative_to(TASKS.parent)}:{g.lineno} global {', '.join(g.names)}")
    assert found == []


def test_only_backend_calls_njit():
    """Kernels are marked with ``backend.kernel``; ``njit`` and ``jit`` appear in backend.py alone."""
    found = []
    for path in _sources():
        if path.name == "backend.py" and path.parent == TASKS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("njit", "jit"):  # nb.njit, numba.jit
                found.append(f"{path.relative_to(TASKS.parent)}:{node.lineno} {ast.unparse(node)}")
            elif (
                isinstance(node, ast.Name)
                and node.id == "njit"
                or (isinstance(node, ast.ImportFrom) and node.module == "numba")
            ):
                found.append(f"{path.relative_to(TASKS.parent)}:{node.lineno} {ast.unparse(node)}")
    assert found == []


# module, accessor: every module with marked kernels, and the cached function that compiles them
ACCESSORS = [
    ("pgmflow.tasks.fastexp", "_kernels"),
    ("pgmflow.tasks.philox", "numba_philox4x32"),
    ("pgmflow.tasks.tesla.prox", "_kernels"),
    ("pgmflow.tasks.tesla.solver", "_kernels"),
    ("pgmflow.tasks.tesla.ssnal", "_kernels"),
    ("pgmflow.tasks.tesla.gibbs", "_kernels"),
    ("pgmflow.tasks.bounds.messages", "_kernels"),
    ("pgmflow.tasks.bounds.lattice_kernel", "_kernels"),
    ("pgmflow.tasks.bounds.mean_field", "_kernels"),
    ("pgmflow.tasks.lda.estep", "_kernels"),
    ("pgmflow.tasks.lda.synthetic", "_kernels"),
    ("pgmflow.tasks.lda.regularization", "_numba_kernels"),
    ("pgmflow.tasks.tempering.ising_cpu", "kernels"),
    ("pgmflow.tasks.tempering.ising_kernels", "_energy_kernel"),
    ("pgmflow.tasks.tempering.mrf_kernels", "_kernels"),
    ("pgmflow.tasks.gp.kernels", "_kernels"),
    ("pgmflow.tasks.gp.fused", "_kernels"),
]


# modules whose kernels another module's accessor compiles (it binds their names to its own dispatchers)
COMPILED_BY_ANOTHER = ("pgmflow.tasks.lda.pr_kernels", "pgmflow.tasks.tempering.mrf_lanes")


def _marked(module) -> list[str]:
    return sorted(
        name
        for name, fn in vars(module).items()
        if inspect.isfunction(fn) and getattr(fn, backend.KERNEL_MARK, None) is not None
    )


def test_every_kernel_module_is_listed():
    """The list above covers every module of tasks/ that marks kernels (so the next test sees them all)."""
    marking = set()
    for path in _sources():
        if "backend.kernel(" in path.read_text() and path.name != "backend.py":
            marking.add(".".join(("pgmflow", *path.relative_to(TASKS.parent).with_suffix("").parts)))
    listed = {m for m, _ in ACCESSORS}
    # pr_kernels is compiled by regularization's accessor, mrf_lanes by mrf_kernels'
    assert marking - listed == set(COMPILED_BY_ANOTHER)


def test_accessors_leave_no_kernel_uncompiled():
    """After each module's accessor (numba wraps lazily: nothing compiles here), every marked function,
    its own and the ones it names from other modules, is a dispatcher."""
    pytest.importorskip("numba")
    left = {}
    for mod_name, accessor in ACCESSORS:
        module = importlib.import_module(mod_name)
        getattr(module, accessor)()
        if _marked(module):
            left[mod_name] = _marked(module)
    for name in COMPILED_BY_ANOTHER:
        if _marked(importlib.import_module(name)):
            left[name] = _marked(importlib.import_module(name))
    assert left == {}


_TOY = """
from pgmflow.tasks import backend
from {other} import twice as _twice

prange = range


@backend.kernel(cache=False)
def _inc(x):
    return x + 1.0


@backend.kernel(cache=False, parallel=True)
def total(a):
    s = 0.0
    for i in prange(a.shape[0]):
        s += _twice(_inc(a[i]))
    return s
"""

_OTHER = """
from pgmflow.tasks import backend


@backend.kernel(cache=False)
def twice(x):
    return 2.0 * x
"""


@pytest.fixture
def toy_modules(tmp_path, monkeypatch):
    """Two throw-away modules: ``toy_other`` with a kernel ``twice``, ``toy_main`` whose kernel calls it."""
    pytest.importorskip("numba")
    tag = tmp_path.name.replace("-", "_")
    other, main = f"toy_other_{tag}", f"toy_main_{tag}"
    (tmp_path / f"{other}.py").write_text(_OTHER)
    (tmp_path / f"{main}.py").write_text(_TOY.format(other=other))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module(other), importlib.import_module(main)
    for name in (other, main):
        sys.modules.pop(name, None)


def test_kernels_stay_plain_python_until_compiled(toy_modules):
    _, main = toy_modules
    assert main.total(np.array([1.0, 2.0])) == 10.0  # plain Python: range, the other module's function


def test_bind_passes_another_modules_dispatcher(toy_modules):
    other, main = toy_modules
    twice = backend.compile_kernels(other)["twice"]
    nb = backend.numba()
    k = backend.compile_kernels(main, bind={"prange": nb.prange, "_twice": twice})
    assert set(k) == {"_inc", "total"}  # the other module's kernel is not compiled a second time here
    assert main.total is k["total"] and main._inc is k["_inc"] and main._twice is twice
    assert k["total"](np.array([1.0, 2.0, 3.0])) == 18.0


def test_an_unbound_foreign_kernel_is_an_error(toy_modules):
    _, main = toy_modules
    with pytest.raises(ValueError, match="_twice"):
        backend.compile_kernels(main, bind={"prange": backend.numba().prange})


def test_bind_cannot_replace_an_own_kernel(toy_modules):
    other, main = toy_modules
    with pytest.raises(ValueError, match="_inc"):
        backend.compile_kernels(main, bind={"_inc": backend.compile_kernels(other)["twice"]})


def test_a_second_call_returns_the_same_dispatchers(toy_modules):
    other, _ = toy_modules
    first = backend.compile_kernels(other)
    assert backend.compile_kernels(other) == first and other.twice is first["twice"]


def test_accessors_called_from_threads_at_once_agree(toy_modules):
    """A study's stages call an accessor from several driver threads; lru_cache lets them all run its body. Before
    the lock, a thread that found its module compiled by another got no dispatchers (KeyError in mrf_kernels)."""
    import threading

    other, main = toy_modules
    barrier, out, errors = threading.Barrier(8), [], []

    def accessor():
        try:
            barrier.wait()
            twice = backend.compile_kernels(other)["twice"]
            out.append(backend.compile_kernels(main, bind={"prange": backend.numba().prange, "_twice": twice}))
        except Exception as exc:  # noqa: BLE001  (collected and asserted below)
            errors.append(exc)

    threads = [threading.Thread(target=accessor) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(out) == 8
    assert all(k == out[0] and set(k) == {"_inc", "total"} for k in out)
    assert out[0]["total"](np.array([1.0, 2.0, 3.0])) == 18.0
