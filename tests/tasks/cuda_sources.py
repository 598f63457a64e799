"""Find every CUDA source pgmflow ships and every place the Python side launches one of its
kernels, by reading the code of ``tasks/`` (its syntax trees; nothing is imported), and compile
the sources with NVRTC, CUDA's runtime compiler, which needs no GPU.

What is found, wherever in ``tasks/`` it lives:

* sources: module-level string constants holding a ``__global__`` kernel definition (also when
  built from other constants with ``+``, imported from another module, or read from a file beside
  the module with ``(Path(__file__).parent / "k.cu").read_text()``), string literals with one inside
  functions, ``.cu`` files in the package, and the resolved ``code`` argument of every
  ``RawKernel`` / ``RawModule``;
  a source that is only a piece of a larger one is compiled as part of that one;
* kernel sites: every ``RawKernel(code, name, options=...)`` call (and ``RawModule(...)`` with
  ``.get_function(name)``), its source, kernel name and options resolved statically;
* launches: every call ``k(grid, block, args)`` of an object that comes from a kernel site,
  followed through local names, ``return`` from a builder function (called from any module), and
  arguments passed into other functions of ``tasks/`` (``_sweep_cuda(..., _cupy_kernel())`` calls
  its parameter ``launch(grid, block, (...))``). Each argument of the launch tuple is typed where
  the code says its type: ``np.int32(x)`` is an int32 scalar, ``xp.zeros(n, dtype=xp.uint32)`` a
  uint32 array, ``.astype(np.uint32)``, ``asarray(..., dtype=...)``, names assigned from these.

The checks (see ``check_launch``): the kernel name is an ``extern "C"`` entry of the compiled PTX;
the launch passes as many arguments as the kernel takes; a pointer parameter gets an array (of
the pointer's element type where the Python side says which); a scalar parameter gets a NumPy
scalar of exactly its type (CuPy passes a Python ``int`` as a 64-bit integer and ``float`` as a
double, which a 32-bit parameter would misread). The C parameter list is parsed from the source
and cross-checked against the parameter sizes NVRTC writes in the PTX.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

KERNEL_DEF = re.compile(
    r"(?P<externc>extern\s+\"C\"\s+)?(?P<template>template\s*<[^>]*>\s*)?__global__\s+"
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?"
    r"(?P<name>[A-Za-z_]\w*)\s*\((?P<params>[^)]*)\)"
)
KERNEL_SITE_CALLS = {"RawKernel", "RawModule"}
NUMPY_SCALARS = {
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "bool_",
    "intc",
    "uintc",
    "longlong",
    "ulonglong",
    "complex64",
    "complex128",
    "half",
    "single",
    "double",
    "short",
    "ushort",
    "byte",
    "ubyte",
}
ARRAY_CTORS = {  # function -> position of its dtype argument (None: keyword only); dtype-less default
    "asarray": (1, "like"),
    "ascontiguousarray": (1, "like"),
    "array": (1, "like"),
    "asfortranarray": (1, "like"),
    "zeros": (1, "float64"),
    "empty": (1, "float64"),
    "ones": (1, "float64"),
    "full": (2, None),
    "arange": (None, None),
    "zeros_like": (1, "like"),
    "empty_like": (1, "like"),
    "ones_like": (1, "like"),
    "full_like": (2, "like"),
    "frombuffer": (1, "float64"),
}
ARRAY_KEEP = {"reshape", "ravel", "copy", "flatten", "transpose", "view", "squeeze", "__getitem__"}
C_TYPES = {
    "char": "int8",
    "signed char": "int8",
    "unsigned char": "uint8",
    "int8_t": "int8",
    "uint8_t": "uint8",
    "short": "int16",
    "short int": "int16",
    "signed short": "int16",
    "unsigned short": "uint16",
    "int16_t": "int16",
    "uint16_t": "uint16",
    "int": "int32",
    "signed": "int32",
    "signed int": "int32",
    "unsigned": "uint32",
    "unsigned int": "uint32",
    "int32_t": "int32",
    "uint32_t": "uint32",
    "long": "int64",
    "long int": "int64",
    "unsigned long": "uint64",
    "long long": "int64",
    "long long int": "int64",
    "signed long long": "int64",
    "unsigned long long": "uint64",
    "unsigned long long int": "uint64",
    "int64_t": "int64",
    "uint64_t": "uint64",
    "size_t": "uint64",
    "ptrdiff_t": "int64",
    "float": "float32",
    "double": "float64",
    "bool": "bool",
    "__half": "float16",
    "half": "float16",
}
QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct", "__grid_constant__"}


# --------------------------------------------------------------------------------------------
# CUDA C side: kernels, their parameters, and what NVRTC writes in the PTX
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    decl: str  # as written, e.g. "const signed char* __restrict__ bonds_h"
    name: str
    pointer: bool
    dtype: str | None  # numpy name of the scalar or of the pointed-to element; None: not a plain type


@dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple[Param, ...]
    extern_c: bool
    template: bool


def strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", " ", src)


def _typedefs(src: str) -> dict[str, str]:
    out = {}
    for m in re.finditer(r"\btypedef\s+([^;{}()]+?)\s+([A-Za-z_]\w*)\s*;", src):
        out[m.group(2)] = m.group(1)
    return out


def _parse_param(decl: str, typedefs: dict[str, str]) -> Param:
    tokens = re.findall(r"[A-Za-z_]\w*|\*|\[\s*\]", decl)
    idents = [t for t in tokens if t[0].isalpha() or t[0] == "_"]
    name = idents[-1] if len(idents) >= 2 else ""
    pointer = any(t == "*" or t.startswith("[") for t in tokens)
    words = [t for t in idents[:-1] if t not in QUALIFIERS] if name else [t for t in idents if t not in QUALIFIERS]
    for _ in range(8):  # expand typedefs (a typedef may name another)
        expanded = []
        for w in words:
            if w in typedefs:
                inner = typedefs[w]
                pointer = pointer or "*" in inner
                expanded += [t for t in re.findall(r"[A-Za-z_]\w*", inner) if t not in QUALIFIERS]
            else:
                expanded.append(w)
        if expanded == words:
            break
        words = expanded
    return Param(" ".join(decl.split()), name, pointer, C_TYPES.get(" ".join(words)))


def parse_kernels(src: str) -> list[Kernel]:
    """The ``__global__`` kernels defined in a CUDA source, with their parameters."""
    code = strip_comments(src)
    typedefs = _typedefs(code)
    out = []
    for m in KERNEL_DEF.finditer(code):
        params = [p for p in m.group("params").split(",") if p.strip() and p.strip() != "void"]
        out.append(
            Kernel(
                m.group("name"),
                tuple(_parse_param(p, typedefs) for p in params),
                bool(m.group("externc")) or _in_extern_c_block(code, m.start()),
                bool(m.group("template")),
            )
        )
    return out


def _in_extern_c_block(code: str, pos: int) -> bool:
    for m in re.finditer(r"extern\s+\"C\"\s*\{", code[:pos]):
        depth = code[m.end() : pos].count("{") - code[m.end() : pos].count("}")
        if depth >= 0:
            return True
    return False


def ptx_entries(ptx: str) -> dict[str, list[str]]:
    """``.entry`` functions of a PTX text -> their parameters' PTX types (e.g. ``u64``, ``u32``,
    ``b8[16]`` for a struct passed by value)."""
    out = {}
    for m in re.finditer(r"\.entry\s+([\w$]+)\s*\((.*?)\)", ptx, flags=re.S):
        types = []
        for p in re.finditer(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+[\w$]+(\[\d+\])?", m.group(2)):
            types.append(p.group(1) + (p.group(2) or ""))
        out[m.group(1)] = types
    return out


def ptx_size_agrees(param: Param, ptx_type: str) -> bool:
    """Whether a parsed C parameter has the size NVRTC gave it (pointers are 64-bit)."""
    m = re.fullmatch(r"[usbf](\d+)(\[\d+\])?", ptx_type)
    if not m:
        return False
    if param.pointer:
        return ptx_type in ("u64", "b64", "s64")
    if param.dtype is None or m.group(2):
        return True  # a struct or a type this parser does not know: nothing to compare
    bits = int(m.group(1))
    size = np.dtype(param.dtype).itemsize * 8
    return bits == size or (size < 16 and bits == 16)  # 8-bit values may travel in .b16 / .u16


# --------------------------------------------------------------------------------------------
# NVRTC
# --------------------------------------------------------------------------------------------


def load_nvrtc():
    """The NVRTC bindings of ``cuda-bindings`` (``cuda.bindings.nvrtc``, or ``cuda.nvrtc`` of older
    cuda-python). Raises ImportError when neither is installed."""
    try:
        from cuda.bindings import nvrtc  # noqa: PLC0415
    except ImportError:
        from cuda import nvrtc  # noqa: PLC0415
    return nvrtc


def nvrtc_version(nvrtc) -> str:
    err, major, minor = nvrtc.nvrtcVersion()
    _check(nvrtc, err, "nvrtcVersion")
    return f"{major}.{minor}"


def _check(nvrtc, err, what):
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")


@dataclass
class Compiled:
    ok: bool
    log: str
    ptx: str = ""  # for compute_XX targets
    cubin_bytes: int = 0  # for sm_XX targets (ptxas ran: registers, shared memory and all)


def nvrtc_compile(nvrtc, source: str, arch: str, options=(), name: str = "pgmflow_kernel.cu") -> Compiled:
    """Compile ``source`` for ``arch`` (``compute_80`` gives PTX, ``sm_80`` a cubin) with NVRTC.
    ``options`` are passed as CuPy passes a RawKernel's options (an architecture option in them
    is replaced by ``arch``)."""
    opts = [o for o in options if not re.match(r"(-arch|--gpu-architecture)", o)]
    opts = [o.encode() for o in opts] + [f"--gpu-architecture={arch}".encode()]
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        e2, size = nvrtc.nvrtcGetProgramLogSize(prog)
        _check(nvrtc, e2, "nvrtcGetProgramLogSize")
        buf = b" " * size
        (e3,) = nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.rstrip(b"\0 ").decode(errors="replace")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return Compiled(False, log or str(err))
        if arch.startswith("compute_"):
            e4, size = nvrtc.nvrtcGetPTXSize(prog)
            _check(nvrtc, e4, "nvrtcGetPTXSize")
            buf = b" " * size
            (e5,) = nvrtc.nvrtcGetPTX(prog, buf)
            _check(nvrtc, e5, "nvrtcGetPTX")
            return Compiled(True, log, ptx=buf.rstrip(b"\0").decode())
        e4, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(nvrtc, e4, "nvrtcGetCUBINSize")
        return Compiled(True, log, cubin_bytes=int(size))
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


# --------------------------------------------------------------------------------------------
# Python side: modules, names, values
# --------------------------------------------------------------------------------------------


@dataclass
class Module:
    name: str  # dotted, e.g. pgmflow.tasks.tempering.ising_kernels
    path: Path
    tree: ast.Module
    is_package: bool
    assigns: dict[str, ast.expr] = field(default_factory=dict)  # module-level NAME = value (last one)
    funcs: dict[str, ast.FunctionDef] = field(default_factory=dict)  # module-level functions
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # local -> (module, attr or None)
    parent_func: dict[int, ast.FunctionDef | None] = field(default_factory=dict)  # id(node) -> enclosing def


@dataclass(frozen=True)
class Where:
    module: str
    path: str  # relative to the repository
    line: int

    def __str__(self):
        return f"{self.path}:{self.line}"


@dataclass
class Source:
    text: str
    where: Where
    label: str  # e.g. "pgmflow.tasks.tempering.ising_kernels._CUDA_SOURCE"
    kernels: list[Kernel]
    option_sets: list = field(default_factory=list)  # the options it is compiled with (one set per distinct use)
    sites: list = field(default_factory=list)  # KernelSite


@dataclass
class KernelSite:
    where: Where
    kind: str  # RawKernel | RawModule.get_function
    kernel_name: str
    source_text: str
    options: tuple[str, ...]
    launches: list = field(default_factory=list)  # Launch


@dataclass
class Launch:
    where: Where
    args: list[tuple[str, tuple[str, str | None, str | None]]] | None  # (expression text, inferred type)
    problem: str | None = None  # why the arguments could not be read


@dataclass
class Discovery:
    root: Path
    sources: list[Source]  # what is compiled (pieces of a larger source are folded into it)
    pieces: list[tuple[str, Where]]  # kernel-bearing constants compiled as part of a larger source
    sites: list[KernelSite]
    problems: list[str]  # what the scanner could not resolve (each one fails the test)

    @property
    def kernels(self) -> list[tuple[Source, Kernel]]:
        return [(s, k) for s in self.sources for k in s.kernels]

    @property
    def launches(self) -> list[Launch]:
        return [lc for s in self.sites for lc in s.launches]


class Index:
    """The modules of a package directory and static lookups of names across them."""

    def __init__(self, root: Path, package_dir: Path):
        self.root = root
        self.modules: dict[str, Module] = {}
        for path in sorted(package_dir.rglob("*.py")):
            rel = path.relative_to(package_dir.parent).with_suffix("")
            parts = list(rel.parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            tree = ast.parse(path.read_text(), filename=str(path))
            mod = Module(".".join(parts), path, tree, is_pkg)
            self._index(mod)
            self.modules[mod.name] = mod

    def rel(self, mod: Module) -> str:
        try:
            return str(mod.path.relative_to(self.root))
        except ValueError:
            return str(mod.path)

    def where(self, mod: Module, node: ast.AST) -> Where:
        return Where(mod.name, self.rel(mod), getattr(node, "lineno", 0))

    def _index(self, mod: Module):
        for node in mod.tree.body:
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        mod.assigns[t.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                mod.assigns[node.target.id] = node.value
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                mod.funcs[node.name] = node
        for node in ast.walk(mod.tree):  # imports anywhere (lazy imports inside functions too)
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        mod.imports[a.asname] = (a.name, None)
                    else:
                        mod.imports.setdefault(a.name.split(".")[0], (a.name.split(".")[0], None))
            elif isinstance(node, ast.ImportFrom):
                base = self._absolute(mod, node.module, node.level)
                for a in node.names:
                    mod.imports[a.asname or a.name] = (base, a.name)

        def walk(node, func):
            for child in ast.iter_child_nodes(node):
                mod.parent_func[id(child)] = func
                walk(child, child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func)

        walk(mod.tree, None)

    @staticmethod
    def _absolute(mod: Module, name: str | None, level: int) -> str:
        if level == 0:
            return name or ""
        parts = mod.name.split(".")
        if not mod.is_package:
            parts = parts[:-1]
        parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
        return ".".join(parts + ([name] if name else []))

    # -- name lookups ------------------------------------------------------------------------
    def lookup(self, mod: Module, name: str, depth: int = 0):
        """What a module-level name of ``mod`` is: ("value", mod, expr), ("func", mod, def),
        ("module", mod) or None (not defined in the package, e.g. numpy)."""
        if depth > 20:
            return None
        if name in mod.funcs:
            return ("func", mod, mod.funcs[name])
        if name in mod.assigns:
            return ("value", mod, mod.assigns[name])
        if name in mod.imports:
            target, attr = mod.imports[name]
            if attr is None:
                m = self.modules.get(target)
                return ("module", m) if m else None
            sub = self.modules.get(f"{target}.{attr}")
            if sub is not None:
                return ("module", sub)
            m = self.modules.get(target)
            if m is not None:
                return self.lookup(m, attr, depth + 1)
        return None

    def resolve(self, mod: Module, expr: ast.expr, depth: int = 0):
        """Resolve a Name or a dotted Attribute chain at module scope (see :meth:`lookup`)."""
        if isinstance(expr, ast.Name):
            return self.lookup(mod, expr.id, depth)
        if isinstance(expr, ast.Attribute):
            base = self.resolve(mod, expr.value, depth + 1)
            if base and base[0] == "module":
                return self.lookup(base[1], expr.attr, depth + 1)
        return None

    def string(self, mod: Module, expr: ast.expr, depth: int = 0) -> str | None:
        """The value of a string expression built from literals and module-level constants."""
        if depth > 30 or expr is None:
            return None
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return expr.value
        if isinstance(expr, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in expr.values):
            return "".join(v.value for v in expr.values)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            a, b = self.string(mod, expr.left, depth + 1), self.string(mod, expr.right, depth + 1)
            return a + b if a is not None and b is not None else None
        if (
            isinstance(expr, ast.Call)
            and _call_name(expr) in ("read_text", "read")
            and isinstance(expr.func, ast.Attribute)
        ):  # a source kept in a file beside the module
            target = expr.func.value
            if (
                _call_name(expr) == "read"
                and isinstance(target, ast.Call)
                and _call_name(target) == "open"
                and target.args
            ):
                target = target.args[0]
            path = self.path(mod, target, depth + 1)
            if path is not None and path.is_file():
                return path.read_text()
            return None
        if (
            isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Attribute)
            and expr.func.attr == "join"
            and len(expr.args) == 1
            and isinstance(expr.args[0], (ast.List, ast.Tuple))
        ):
            sep = self.string(mod, expr.func.value, depth + 1)
            items = [self.string(mod, e, depth + 1) for e in expr.args[0].elts]
            return sep.join(items) if sep is not None and None not in items else None
        if isinstance(expr, ast.Call) and _call_name(expr) == "dedent" and len(expr.args) == 1:
            import textwrap  # noqa: PLC0415

            inner = self.string(mod, expr.args[0], depth + 1)
            return textwrap.dedent(inner) if inner is not None else None
        r = self.resolve(mod, expr, depth + 1)
        if r and r[0] == "value":
            return self.string(r[1], r[2], depth + 1)
        return None

    def path(self, mod: Module, expr: ast.expr, depth: int = 0) -> Path | None:
        """A file path built from ``__file__`` (``Path(__file__).parent / "k.cu"``, ``.with_name(...)``,
        ``os.path.join(os.path.dirname(__file__), ...)``) and string constants."""
        if depth > 30:
            return None
        if isinstance(expr, ast.Name) and expr.id == "__file__":
            return mod.path
        if isinstance(expr, ast.Call) and _call_name(expr) in ("Path", "PurePath") and len(expr.args) == 1:
            return self.path(mod, expr.args[0], depth + 1)
        if isinstance(expr, ast.Call) and _call_name(expr) in ("dirname", "abspath", "realpath", "resolve"):
            inner = (
                self.path(mod, expr.args[0] if expr.args else expr.func.value, depth + 1)
                if (expr.args or isinstance(expr.func, ast.Attribute))
                else None
            )
            if inner is None:
                return None
            return inner.parent if _call_name(expr) == "dirname" else inner
        if isinstance(expr, ast.Attribute) and expr.attr == "parent":
            inner = self.path(mod, expr.value, depth + 1)
            return inner.parent if inner is not None else None
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
            base, part = self.path(mod, expr.left, depth + 1), self.string(mod, expr.right, depth + 1)
            return base / part if base is not None and part is not None else None
        if (
            isinstance(expr, ast.Call)
            and _call_name(expr) in ("join", "joinpath", "with_name")
            and (_call_name(expr) != "join" or expr.args)
        ):
            if _call_name(expr) == "join":
                base, parts = self.path(mod, expr.args[0], depth + 1), expr.args[1:]
            else:
                base, parts = self.path(mod, expr.func.value, depth + 1), expr.args
            names = [self.string(mod, a, depth + 1) for a in parts]
            if base is None or None in names:
                return None
            if _call_name(expr) == "with_name":
                return base.with_name(names[0])
            return base.joinpath(*names)
        r = self.resolve(mod, expr, depth + 1)
        if r and r[0] == "value":
            return self.path(r[1], r[2], depth + 1)
        return None

    def strings(self, mod: Module, expr: ast.expr | None) -> tuple[str, ...] | None:
        """A tuple/list of strings (a RawKernel's ``options``)."""
        if expr is None:
            return ()
        if isinstance(expr, (ast.Tuple, ast.List)):
            vals = [self.string(mod, e) for e in expr.elts]
            return tuple(vals) if None not in vals else None
        r = self.resolve(mod, expr)
        if r and r[0] == "value":
            return self.strings(r[1], r[2])
        s = self.string(mod, expr)
        return (s,) if s is not None else None

    def calls_of(self, target: ast.FunctionDef):
        """Every call of a module-level function of the package, from any module: (mod, Call)."""
        for mod in self.modules.values():
            for node in ast.walk(mod.tree):
                if isinstance(node, ast.Call):
                    r = self.resolve(mod, node.func)
                    if r and r[0] == "func" and r[2] is target:
                        yield mod, node


def _call_name(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Attribute):
        return f.attr
    if isinstance(f, ast.Name):
        return f.id
    return None


def _docstring_nodes(tree: ast.Module) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


# --------------------------------------------------------------------------------------------
# Following a kernel object from its construction to its launches
# --------------------------------------------------------------------------------------------


def _func_of(mod: Module, node: ast.AST):
    return mod.parent_func.get(id(node))


def _loads_in(scope: ast.AST, name: str):
    for node in ast.walk(scope):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
            yield node


def _parent_map(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    return [x.arg for x in (*a.posonlyargs, *a.args)]


def follow(index: Index, mod: Module, origin: ast.expr, limit: int = 200):
    """Every expression that evaluates to the object ``origin`` constructs: (mod, expr) pairs."""
    parents = {m.name: _parent_map(m.tree) for m in index.modules.values()}
    todo, seen, out = [(mod, origin)], set(), []
    while todo and len(seen) < limit:
        m, e = todo.pop()
        if (m.name, id(e)) in seen:
            continue
        seen.add((m.name, id(e)))
        out.append((m, e))
        parent = parents[m.name].get(id(e))
        fn = _func_of(m, e)
        # name = <object>  (in a function: its loads there; at module level or `global`: anywhere in the module)
        if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is e:
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    declared_global = fn is not None and any(
                        isinstance(g, ast.Global) and t.id in g.names for g in ast.walk(fn)
                    )
                    scope = m.tree if fn is None or declared_global else fn
                    todo += [(m, n) for n in _loads_in(scope, t.id)]
        # return <object>: every call of the enclosing function, from any module
        if isinstance(parent, ast.Return) and fn is not None:
            todo += [(cm, call) for cm, call in index.calls_of(fn)]
        # f(..., <object>, ...): the parameter of f, inside f
        if isinstance(parent, ast.Call) and e is not parent.func:
            r = index.resolve(m, parent.func)
            if r and r[0] == "func":
                callee_mod, callee = r[1], r[2]
                params = _params(callee)
                names = []
                if e in parent.args:
                    i = parent.args.index(e)
                    if i < len(params):
                        names.append(params[i])
                names += [k.arg for k in parent.keywords if k.value is e and k.arg]
                for name in names:
                    todo += [(callee_mod, n) for n in _loads_in(callee, name)]
        # (<object> if c else other), and the object as the value of a conditional
        if isinstance(parent, ast.IfExp) and e is not parent.test:
            todo.append((m, parent))
    return out


# --------------------------------------------------------------------------------------------
# Types of launch arguments, as the Python code states them
# --------------------------------------------------------------------------------------------


def _dtype_of(index: Index, mod: Module, expr: ast.expr | None) -> str | None:
    if expr is None:
        return None
    if isinstance(expr, ast.Attribute) and expr.attr in NUMPY_SCALARS:
        return np.dtype(expr.attr).name if expr.attr != "bool_" else "bool"
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        try:
            return np.dtype(expr.value).name
        except TypeError:
            return None
    if isinstance(expr, ast.Name):
        if expr.id in ("float", "int", "bool", "complex"):
            return {"float": "float64", "int": "int64", "bool": "bool", "complex": "complex128"}[expr.id]
        r = index.resolve(mod, expr)
        if r and r[0] == "value":
            return _dtype_of(index, r[1], r[2])
    if isinstance(expr, ast.Call) and _call_name(expr) == "dtype" and expr.args:
        return _dtype_of(index, mod, expr.args[0])
    return None


UNKNOWN = ("unknown", None, None)


def infer(index: Index, mod: Module, fn: ast.FunctionDef | None, expr: ast.expr, depth: int = 0):
    """(kind, dtype, note): kind is "scalar" (a NumPy scalar), "array", "pyscalar" (a Python
    int/float/bool) or "unknown"; dtype a NumPy name or None."""
    if depth > 12:
        return UNKNOWN
    if isinstance(expr, ast.Constant) and isinstance(expr.value, (bool, int, float)):
        return ("pyscalar", type(expr.value).__name__, None)
    if isinstance(expr, ast.IfExp):
        a = infer(index, mod, fn, expr.body, depth + 1)
        b = infer(index, mod, fn, expr.orelse, depth + 1)
        return _merge(a, b)
    if isinstance(expr, ast.Subscript):
        base = infer(index, mod, fn, expr.value, depth + 1)
        return ("array", base[1], None) if base[0] == "array" else UNKNOWN
    if isinstance(expr, ast.Call):
        name = _call_name(expr)
        if isinstance(expr.func, (ast.Attribute, ast.Name)) and name in NUMPY_SCALARS and len(expr.args) <= 1:
            return ("scalar", np.dtype(name).name if name != "bool_" else "bool", None)
        kw = {k.arg: k.value for k in expr.keywords if k.arg}
        if name in ARRAY_CTORS and isinstance(expr.func, ast.Attribute):
            pos, default = ARRAY_CTORS[name]
            dt_expr = kw.get("dtype") or (expr.args[pos] if pos is not None and len(expr.args) > pos else None)
            if dt_expr is not None:
                return ("array", _dtype_of(index, mod, dt_expr), None)
            if default == "like" and expr.args:
                inner = infer(index, mod, fn, expr.args[0], depth + 1)
                return ("array", inner[1] if inner[0] in ("array", "scalar") else None, None)
            return ("array", default if default != "like" else None, None)
        if name == "astype" and isinstance(expr.func, ast.Attribute) and (expr.args or "dtype" in kw):
            recv = infer(index, mod, fn, expr.func.value, depth + 1)
            dt = _dtype_of(index, mod, expr.args[0] if expr.args else kw["dtype"])
            return ("scalar" if recv[0] == "scalar" else "array", dt, None)
        if name in ARRAY_KEEP and isinstance(expr.func, ast.Attribute):
            recv = infer(index, mod, fn, expr.func.value, depth + 1)
            return ("array", recv[1], None) if recv[0] in ("array", "unknown") else UNKNOWN
        return UNKNOWN
    if isinstance(expr, ast.Name):
        scope = fn if fn is not None else mod.tree
        values = []
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id == expr.id:
                        values.append(node.value)
                    elif isinstance(t, (ast.Tuple, ast.List)) and any(
                        isinstance(x, ast.Name) and x.id == expr.id for x in t.elts
                    ):
                        # a, b = x, y: pairwise; a, b = f(): unknown
                        pos = [i for i, x in enumerate(t.elts) if isinstance(x, ast.Name) and x.id == expr.id][0]
                        if (
                            isinstance(node.value, (ast.Tuple, ast.List))
                            and len(node.value.elts) == len(t.elts)
                            and not any(isinstance(x, ast.Starred) for x in t.elts)
                        ):
                            values.append(node.value.elts[pos])
                        else:
                            return UNKNOWN
            elif (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and node.target.id == expr.id
                and node.value is not None
            ):
                values.append(node.value)
            elif (
                isinstance(node, (ast.AugAssign, ast.For))
                and isinstance(node.target, ast.Name)
                and node.target.id == expr.id
            ):
                return UNKNOWN
        if fn is not None and expr.id in _params(fn) + [a.arg for a in fn.args.kwonlyargs]:
            return (
                UNKNOWN if not values else _merge_all([infer(index, mod, fn, v, depth + 1) for v in values] + [UNKNOWN])
            )
        if values:
            return _merge_all([infer(index, mod, fn, v, depth + 1) for v in values])
        r = index.lookup(mod, expr.id)
        if r and r[0] == "value":
            return infer(index, r[1], None, r[2], depth + 1)
    return UNKNOWN


def _merge(a, b):
    if a == b:
        return a
    if a[0] == b[0] == "array":
        return ("array", a[1] if a[1] == b[1] else None, None)
    if "unknown" in (a[0], b[0]) and "array" in (a[0], b[0]):
        return ("array", None, "may be an array")
    return UNKNOWN


def _merge_all(items):
    out = items[0]
    for it in items[1:]:
        out = _merge(out, it)
    return out


def _launch_args(index: Index, mod: Module, call: ast.Call):
    """The argument tuple of ``k(grid, block, args)`` as a list of expressions, or a reason."""
    fn = _func_of(mod, call)
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    args = call.args[2] if len(call.args) >= 3 else kw.get("args")
    if args is None:
        return None, "no argument tuple: expected k(grid, block, args)"
    if isinstance(args, ast.Name):
        scope = fn if fn is not None else mod.tree
        vals = [
            n.value
            for n in ast.walk(scope)
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == args.id for t in n.targets)
        ]
        if len(vals) == 1:
            args = vals[0]
    if not isinstance(args, (ast.Tuple, ast.List)) or any(isinstance(e, ast.Starred) for e in args.elts):
        return None, f"the arguments ({ast.unparse(args)}) are not a literal tuple here"
    return list(args.elts), None


# --------------------------------------------------------------------------------------------
# Discovery
# --------------------------------------------------------------------------------------------


def discover(root: Path, package: str = "tasks") -> Discovery:
    """Scan ``root/package`` (``tasks/``) for CUDA sources, kernel sites and launches."""
    index = Index(root, root / package)
    problems: list[str] = []
    candidates: list[tuple[str, Where, str]] = []  # (text, where, label)
    sites: list[KernelSite] = []

    # CUDA files shipped in the package (.cu; .cuh headers are compiled where they are included)
    for path in sorted((root / package).rglob("*.cu")):
        text = path.read_text()
        rel = str(path.relative_to(root))
        candidates.append((text, Where(package, rel, 1), rel))

    for mod in index.modules.values():
        docs = _docstring_nodes(mod.tree)
        covered = set()
        for name, value in mod.assigns.items():
            text = index.string(mod, value)
            for node in ast.walk(value):
                covered.add(id(node))
            if text is not None and KERNEL_DEF.search(strip_comments(text)):
                candidates.append((text, index.where(mod, value), f"{mod.name}.{name}"))
        for node in ast.walk(mod.tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in covered
                and id(node) not in docs
                and KERNEL_DEF.search(strip_comments(node.value))
            ):
                candidates.append((node.value, index.where(mod, node), f"{mod.name}:{node.lineno}"))

        for node in ast.walk(mod.tree):
            if not (isinstance(node, ast.Call) and _call_name(node) in KERNEL_SITE_CALLS):
                continue
            where = index.where(mod, node)
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            code_expr = node.args[0] if node.args else kw.get("code")
            code = index.string(mod, code_expr)
            opt_expr = node.args[2] if len(node.args) > 2 and _call_name(node) == "RawKernel" else kw.get("options")
            if _call_name(node) == "RawModule" and len(node.args) > 1:
                opt_expr = node.args[1]
            options = index.strings(mod, opt_expr)
            if code is None:
                problems.append(
                    f"{where}: the CUDA source of this {_call_name(node)} cannot be read statically "
                    f"({ast.unparse(code_expr) if code_expr is not None else 'no code argument'}); "
                    "keep CUDA sources as module-level string constants (or + of them)"
                )
                continue
            if options is None:
                problems.append(f"{where}: the options of this {_call_name(node)} cannot be read statically")
                options = ()
            if kw.get("backend") is not None and index.string(mod, kw["backend"]) not in (None, "nvrtc"):
                problems.append(f"{where}: backend={ast.unparse(kw['backend'])}: only NVRTC sources are checked")
            candidates.append((code, where, f"{_call_name(node)} at {where}"))
            objects = follow(index, mod, node)
            if _call_name(node) == "RawKernel":
                name_expr = node.args[1] if len(node.args) > 1 else kw.get("name")
                kname = index.string(mod, name_expr)
                if kname is None:
                    problems.append(f"{where}: the kernel name of this RawKernel cannot be read statically")
                    continue
                site = KernelSite(where, "RawKernel", kname, code, tuple(options))
                site.launches = _find_launches(index, objects)
                sites.append(site)
            else:  # RawModule: one site per .get_function("name")
                for om, oe in objects:
                    parent = _parent_map(om.tree).get(id(oe))
                    if isinstance(parent, ast.Attribute) and parent.attr == "get_function":
                        call = _parent_map(om.tree).get(id(parent))
                        if isinstance(call, ast.Call) and call.args:
                            kname = index.string(om, call.args[0])
                            gw = index.where(om, call)
                            if kname is None:
                                problems.append(f"{gw}: get_function's kernel name cannot be read statically")
                                continue
                            site = KernelSite(gw, "RawModule.get_function", kname, code, tuple(options))
                            site.launches = _find_launches(index, follow(index, om, call))
                            sites.append(site)

    # one compiled source per distinct text; a candidate inside a larger one is a piece of it
    by_text: dict[str, Source] = {}
    for text, where, label in candidates:  # constants come first: their names label the sources
        if text not in by_text:
            by_text[text] = Source(text, where, label, parse_kernels(text))
    texts = list(by_text)
    pieces = []
    sources = []
    for t in texts:
        larger = [u for u in texts if u != t and t in u]
        if larger:
            pieces.append((by_text[t].label, by_text[t].where))
        else:
            sources.append(by_text[t])
    for s in sources:
        s.sites = [site for site in sites if site.source_text == s.text]
        s.option_sets = sorted({site.options for site in s.sites}) or [()]
    for site in sites:
        if not site.launches:
            problems.append(
                f"{site.where}: no launch of kernel {site.kernel_name!r} was found: expected a call "
                "k(grid, block, (args...)) of the object this site builds (directly, through a "
                "name, a returning builder function, or a parameter of a tasks/ function)"
            )
    return Discovery(root, sources, pieces, sites, problems)


def _find_launches(index: Index, objects) -> list[Launch]:
    out, seen = [], set()
    for om, oe in objects:
        parent = _parent_map(om.tree).get(id(oe))
        if isinstance(parent, ast.Call) and parent.func is oe and (om.name, id(parent)) not in seen:
            seen.add((om.name, id(parent)))
            exprs, why = _launch_args(index, om, parent)
            where = index.where(om, parent)
            if exprs is None:
                out.append(Launch(where, None, why))
                continue
            fn = _func_of(om, parent)
            out.append(Launch(where, [(ast.unparse(e), infer(index, om, fn, e)) for e in exprs]))
    return sorted(out, key=lambda lc: (lc.where.path, lc.where.line))


def raw_kernel_definitions(package_dir: Path) -> list[tuple[str, str]]:
    """A plain text scan, independent of the syntax trees: (file:line, kernel name) of every
    ``__global__`` kernel definition written anywhere in the package's .py files (comments of
    Python aside), to check that the AST scan has missed none."""
    out = []
    for path in sorted(package_dir.rglob("*.cu")):
        text = strip_comments(path.read_text())
        out += [
            (f"{path.relative_to(package_dir.parent)}:{text.count(chr(10), 0, m.start()) + 1}", m.group("name"))
            for m in KERNEL_DEF.finditer(text)
        ]
    for path in sorted(package_dir.rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        doc_lines = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Expr) and id(node.value) in _docstring_nodes(tree):
                doc_lines.update(range(node.lineno, node.end_lineno + 1))
        for m in KERNEL_DEF.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            src_line = text.splitlines()[line - 1].lstrip()
            if src_line.startswith("#") or line in doc_lines:
                continue
            out.append((f"{path.relative_to(package_dir.parent)}:{line}", m.group("name")))
    return out


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


def check_launch(kernel: Kernel, launch: Launch) -> list[str]:
    """What is wrong with one launch of ``kernel`` (an empty list when nothing is)."""
    if launch.args is None:
        return [f"{launch.where}: cannot read the launch arguments of {kernel.name}: {launch.problem}"]
    errs = []
    if len(launch.args) != len(kernel.params):
        errs.append(
            f"{launch.where}: {kernel.name} takes {len(kernel.params)} arguments, the launch passes {len(launch.args)}"
        )
    for i, (p, (text, (kind, dtype, _))) in enumerate(zip(kernel.params, launch.args)):
        where = f"{launch.where}: {kernel.name} argument {i} ({p.decl}) gets `{text}`"
        if p.pointer:
            if kind in ("scalar", "pyscalar"):
                errs.append(f"{where}, a scalar, not an array")
            elif kind == "array" and dtype and p.dtype and dtype != p.dtype:
                errs.append(f"{where}, an array of {dtype}, not {p.dtype}")
        else:
            want = p.dtype or "?"
            if kind == "pyscalar":
                errs.append(f"{where}, a Python {dtype}: CuPy passes it as a 64-bit value; wrap it as np.{want}(...)")
            elif kind == "array":
                errs.append(f"{where}, an array, not a {want} scalar")
            elif kind == "unknown":
                errs.append(f"{where}, whose type the code does not state: wrap it as np.{want}(...)")
            elif p.dtype and dtype != p.dtype:
                errs.append(f"{where}, a {dtype} scalar, not {p.dtype}")
    return errs
