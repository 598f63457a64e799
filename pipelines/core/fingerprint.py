"""Code fingerprints: what a stage's result depends on in code, as digests that comments and docstrings
do not move.

A stage's code is the *import closure* of its workload package inside its own top-level package
(``pgmflow`` for the built-in workloads, a plug-in's own package otherwise): every module the package's
modules import, statically (``import x``, ``from x import y``, relative imports, at any depth in the
module: imports inside functions count), followed transitively. Each module is parsed with ``ast``; its
docstrings are dropped and the tree is dumped without line numbers, so a comment, a docstring or a blank
line changes nothing while any change to what runs (a constant, an operator, a name) changes the module's
digest. Modules imported dynamically (``importlib.import_module`` of a computed name) are not followed:
the registry's ``"module:function"`` strings are added as roots instead.

The fingerprint also holds the versions of the numerical libraries the bits depend on (numpy, scipy,
numba, dask, distributed, cupy when installed; read from the installed metadata, nothing is imported).

Costs (benchmarks/stage_cache.py): parsing a module costs about 10 ms, a workload's closure (30-60 modules)
a few hundred. Digests are kept per file by (path, size, mtime in ns) in memory and in
``$XDG_CACHE_HOME/pgmflow/fingerprints-v1.json`` (``~/.cache`` by default; written atomically, rebuilt when
unreadable), so a later process parses only the files that changed.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import tempfile
from pathlib import Path

LIBRARIES = ("numpy", "scipy", "numba", "dask", "distributed", "cupy-cuda12x", "cupy-cuda13x")
_DIGESTS: dict = {}  # "path|size|mtime_ns|module" -> (normalised digest, imported names): a process-wide memo
_DISK = {"loaded": False, "dirty": False}


def cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pgmflow" / "fingerprints-v1.json"


def _load_disk():
    if _DISK["loaded"]:
        return
    _DISK["loaded"] = True
    try:
        stored = json.loads(cache_file().read_text())
        for k, (digest, names) in stored.items():
            _DIGESTS.setdefault(k, (digest, frozenset(names)))
    except (OSError, ValueError, TypeError):
        pass  # no cache yet, or an unreadable one: parsed again and rewritten


def save_disk():
    """Write the memo to the cache file when it gained entries (atomically: a temporary file, then rename)."""
    if not _DISK["dirty"]:
        return
    target = cache_file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=target.parent, delete=False, suffix=".tmp") as f:
            json.dump({k: [d, sorted(n)] for k, (d, n) in _DIGESTS.items()}, f)
        os.replace(f.name, target)
        _DISK["dirty"] = False
    except OSError:
        pass  # a read-only home: the memo still serves this process


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                if isinstance(body[0].value.value, str):
                    node.body = body[1:] or [ast.Pass()]
    return tree


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Absolute names of the modules (and of ``from m import x``'s candidates ``m.x``) a module imports."""
    out: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                parent = ".".join([*base, node.module] if node.module else base)
            else:
                parent = node.module or ""
            out.add(parent)
            out.update(f"{parent}.{a.name}" for a in node.names if a.name != "*")
    return out


def source_digest(path: str | Path, module: str = "", is_package: bool = False) -> tuple[str, frozenset]:
    """(SHA-256 of the normalised module: no docstrings, no comments, no positions; the names it imports)."""
    _load_disk()
    st = os.stat(path)
    memo = f"{path}|{st.st_size}|{st.st_mtime_ns}|{module}"
    if memo not in _DIGESTS:
        _DISK["dirty"] = True
        text = Path(path).read_text(encoding="utf-8")
        tree = _strip_docstrings(ast.parse(text))
        dumped = ast.dump(tree, annotate_fields=False, include_attributes=False)
        _DIGESTS[memo] = (hashlib.sha256(dumped.encode()).hexdigest(), frozenset(_imports(tree, module, is_package)))
    return _DIGESTS[memo]


@functools.lru_cache(maxsize=16)
def _package_folders(top: str) -> tuple[str, ...]:
    spec = importlib.util.find_spec(top)
    return tuple(spec.submodule_search_locations or ()) if spec is not None else ()


def _origin(name: str) -> tuple[str, bool] | None:
    """(source file, is a package) of a module under its top-level package's folders, found by path (nothing
    is imported), or None (not a module: an attribute named by ``from m import x``)."""
    top, _, rest = name.partition(".")
    for folder in _package_folders(top):
        base = Path(folder, *rest.split(".")) if rest else Path(folder)
        if (base / "__init__.py").is_file():
            return str(base / "__init__.py"), True
        if rest and base.with_suffix(".py").is_file():
            return str(base.with_suffix(".py")), False
    return None


def closure(roots: list[str], top: str) -> dict[str, str]:
    """{module: normalised digest} of ``roots`` and every module under the package ``top`` they import."""
    seen: dict[str, str] = {}
    todo = [r for r in roots]
    while todo:
        name = todo.pop()
        if name in seen or not (name == top or name.startswith(top + ".")):
            continue
        found = _origin(name)
        if found is None:
            continue
        origin, is_pkg = found
        digest, imported = source_digest(origin, name, is_pkg)
        seen[name] = digest
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # parent packages run first
        todo.extend(m for m in imported if m not in seen)
    return dict(sorted(seen.items()))


@functools.lru_cache(maxsize=1)
def library_versions() -> dict[str, str]:
    out = {}
    for dist in LIBRARIES:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def workload_code(workload) -> dict[str, str]:
    """The normalised digests of one workload's import closure (its run, validate and model modules, its
    package, and what they import inside the same top-level package)."""
    roots = [spec.partition(":")[0] for spec in (workload.run, workload.validate, workload.load_model) if spec]
    package = roots[0].rpartition(".")[0] if roots else ""
    tops = {r.split(".")[0] for r in roots}
    out: dict[str, str] = {}
    for top in sorted(tops):
        out.update(closure([package, *roots], top))
    save_disk()
    return out
