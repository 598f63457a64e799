"""Every CUDA source in tasks/ compiles with NVRTC for sm_80 (A100) and sm_90 (H100/H200), and every
launch from Python matches its kernel's name and parameters -- on a machine without a GPU.

NVRTC, CUDA's runtime compiler, is a plain shared library (``nvidia-cuda-nvrtc`` on PyPI, called
through ``cuda-bindings``; both in the ``dev`` extra). The sources, kernel sites and launches are
found by reading tasks/ (``tests/tasks/cuda_sources.py``), so a source that moves to another module,
or a new one, is covered without touching this file. The test ids carry the counts found.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tests.tasks import cuda_sources as cs

REPO = Path(__file__).resolve().parents[2]
ARCHS = ("sm_80", "sm_90")

try:
    FOUND = cs.discover(REPO)
    _DISCOVERY_ERROR = None
except Exception as exc:  # reported by the tests, not at collection
    FOUND, _DISCOVERY_ERROR = None, exc


def _counts() -> str:
    if FOUND is None:
        return "discovery_failed"
    return (
        f"{len(FOUND.sources)}_sources-{len(FOUND.kernels)}_kernels-{len(FOUND.sites)}_sites-"
        f"{len(FOUND.launches)}_launches"
    )


@pytest.fixture(scope="module")
def found():
    if _DISCOVERY_ERROR is not None:
        raise _DISCOVERY_ERROR
    return FOUND


@pytest.fixture(scope="module")
def nvrtc():
    if not sys.platform.startswith(("linux", "win")):
        pytest.skip(f"NVRTC has no PyPI wheels for {sys.platform}")
    try:
        mod = cs.load_nvrtc()
        cs.nvrtc_version(mod)
    except Exception as exc:
        pytest.fail(
            f"NVRTC is not usable here ({type(exc).__name__}: {exc}); it comes with the dev extra: "
            "pip install -e '.[dev]' (cuda-bindings and nvidia-cuda-nvrtc from PyPI; no GPU or driver needed)"
        )
    return mod


@pytest.fixture(scope="module")
def compiled(nvrtc, found):
    """(source label, options, target) -> cs.Compiled, for every source, option set and target."""
    cache = {}

    def get(source, options, target):
        key = (source.label, options, target)
        if key not in cache:
            cache[key] = cs.nvrtc_compile(
                nvrtc, source.text, target, options, name=source.label.replace(":", "_") + ".cu"
            )
        return cache[key]

    return get


def _say(capsys, line: str):
    with capsys.disabled():
        print(f"\n{line}", end="")


def test_discovery_finds_every_cuda_source(found, capsys):
    assert not found.problems, "the scan of tasks/ could not follow:\n" + "\n".join(found.problems)
    assert found.sources, "no CUDA source found in tasks/ (the Ising sweep has one)"
    names = {k.name for _, k in found.kernels}
    missed = [
        f"{where} defines kernel {name}"
        for where, name in cs.raw_kernel_definitions(REPO / "tasks")
        if name not in names
    ]
    assert not missed, (
        "kernels written in tasks/ that the scan did not resolve to a source (keep CUDA sources "
        "as module-level string constants):\n" + "\n".join(missed)
    )
    _say(
        capsys,
        f"CUDA sources in tasks/: {len(found.sources)} source(s), {len(found.kernels)} kernel(s), "
        f"{len(found.sites)} kernel site(s), {len(found.launches)} launch(es): "
        + "; ".join(f"{s.label} ({', '.join(k.name for k in s.kernels)})" for s in found.sources),
    )


@pytest.mark.parametrize("arch", ARCHS, ids=[f"{a}-{_counts()}" for a in ARCHS])
def test_every_cuda_source_compiles_with_nvrtc(nvrtc, found, compiled, arch, capsys):
    failures, done = [], []
    for src in found.sources:
        for options in src.option_sets:
            for target in (arch.replace("sm_", "compute_"), arch):  # PTX, then a cubin (ptxas runs too)
                res = compiled(src, options, target)
                if not res.ok:
                    failures.append(
                        f"{src.label} ({src.where}; NVRTC's line N is about line {src.where.line}+N-1 "
                        f"of that file) for {target} with options {list(options)}:\n" + textwrap.indent(res.log, "    ")
                    )
                    continue
                if res.ptx:
                    entries = cs.ptx_entries(res.ptx)
                    for k in src.kernels:
                        if not k.extern_c or k.template:
                            continue  # a mangled name: checked where a site launches it
                        if k.name not in entries:
                            failures.append(f"{src.label}: kernel {k.name} is not an entry of the PTX")
                            continue
                        if len(entries[k.name]) != len(k.params) or not all(
                            cs.ptx_size_agrees(p, t) for p, t in zip(k.params, entries[k.name])
                        ):
                            failures.append(
                                f"{src.label}: kernel {k.name}: parameters parsed as "
                                f"{[p.decl for p in k.params]} but the PTX has {entries[k.name]}"
                            )
                else:
                    done.append(f"{src.label} -> {target} cubin {res.cubin_bytes} bytes")
    assert not failures, "NVRTC:\n" + "\n".join(failures)
    _say(
        capsys,
        f"NVRTC {cs.nvrtc_version(nvrtc)}: {len(found.sources)} CUDA source(s) with "
        f"{len(found.kernels)} kernel(s) compiled for {arch} (PTX and cubin): " + "; ".join(done),
    )


@pytest.mark.parametrize("ids", [_counts()])
def test_launches_match_kernel_names_and_signatures(nvrtc, found, compiled, ids, capsys):
    errors, checked = [], []
    for site in found.sites:
        src = next(s for s in found.sources if site.source_text in s.text)
        res = compiled(src, site.options, "compute_80")
        if not res.ok:
            errors.append(f"{site.where}: its source does not compile (see the compile test):\n{res.log}")
            continue
        entries = cs.ptx_entries(res.ptx)
        kernel = next((k for k in src.kernels if k.name == site.kernel_name), None)
        if site.kernel_name not in entries or kernel is None:
            errors.append(
                f"{site.where}: {site.kind} names kernel {site.kernel_name!r}, but the compiled source's "
                f'entries are {sorted(entries)} (is it declared extern "C" __global__?)'
            )
            continue
        for launch in site.launches:
            errs = cs.check_launch(kernel, launch)
            errors += errs
            if not errs:
                checked.append(f"{kernel.name} at {launch.where} ({len(launch.args)} arguments)")
    assert not errors, "\n".join(errors)
    assert checked, "no launch was checked"
    _say(capsys, f"CUDA launches checked against their kernels: {'; '.join(checked)}")


# ------------------------------------------------------------------------------------------------
# The scanner itself, on a made-up package where sources, sites and launches are spread out
# ------------------------------------------------------------------------------------------------

_FILES = {
    "pkg/__init__.py": "",
    "pkg/sources.py": '''
        """CUDA sources. The docstring may say __global__ void not_a_kernel(int) without being one."""
        _PRELUDE = "typedef unsigned int u32;\\n"
        SAXPY = _PRELUDE + r"""
        extern "C" __global__ void saxpy(const float* __restrict__ x, float* y, const u32 n, const float a)
        { unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] += a * x[i]; }
        """
        PIECE = r"""__global__ void fill(long long* out, int n) { if (threadIdx.x < n) out[threadIdx.x] = n; }"""
        WHOLE = "extern \\"C\\" {\\n" + PIECE + "\\n}\\n"
        ''',
    "pkg/sub/__init__.py": "",
    "pkg/sub/build.py": """
        import functools
        from .. import sources
        from ..sources import WHOLE as W
        from pkg import backend

        @functools.lru_cache(maxsize=None)
        def saxpy_kernel():
            return backend.cupy().RawKernel(sources.SAXPY, "saxpy", options=("-std=c++17",))

        def fill_kernel():
            k = backend.cupy().RawKernel(W, "fill")
            return k
        """,
    "pkg/sub/run.py": """
        import numpy as np
        from pkg.sub.build import saxpy_kernel, fill_kernel

        def _go(x, n, xp, launch):
            y = xp.zeros(n, dtype=xp.float32)
            launch((1,), (32,), (x, y, np.uint32(n), 2.0))  # a Python float for a float parameter
            args = (y, x, np.uint32(n))
            launch((1,), (32,), args)  # one argument short
            return y

        def saxpy(x, xp):
            return _go(x, 3, xp, saxpy_kernel())

        def fill(xp, n):
            out = xp.zeros(n, dtype=xp.int32)
            fill_kernel()((1,), (32,), (out, np.int32(n)))  # int32 array for long long*
        """,
    "pkg/kernels/scale.cu": """
        extern "C" __global__ void scale(double* x, const double a, const long long n)
        { long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }
        """,
    "pkg/filed.py": """
        from pathlib import Path
        import numpy as np
        from pkg import backend

        _SCALE_CU = Path(__file__).parent / "kernels" / "scale.cu"

        def scale(x, a):
            k = backend.cupy().RawKernel(_SCALE_CU.read_text(), "scale")
            k((1,), (x.size,), (x, np.float64(a), np.int64(x.size)))
        """,
    "pkg/inline.py": '''
        import numpy as np
        from pkg import backend

        def run(xp, code):
            k = backend.cupy().RawKernel(r"""extern "C" __global__ void neg(int* a, unsigned n) {}""", "neg")
            a = xp.arange(4, dtype=xp.int32)
            n32 = np.uint32(4)
            k((1,), (4,), (a, n32))  # correct
            backend.cupy().RawKernel(code, "dynamic")  # its source is a parameter: not readable statically
        ''',
}


@pytest.fixture
def made_up(tmp_path):
    for rel, text in _FILES.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return cs.discover(tmp_path, package="pkg"), tmp_path


def test_scanner_follows_sources_sites_and_launches_across_modules(made_up):
    found, root = made_up
    labels = sorted(s.label for s in found.sources)
    assert labels == ["pkg.inline:6", "pkg.sources.SAXPY", "pkg.sources.WHOLE", "pkg/kernels/scale.cu"]
    assert [p[0] for p in found.pieces] == ["pkg.sources.PIECE"]  # compiled as part of WHOLE
    assert sorted(k.name for _, k in found.kernels) == ["fill", "neg", "saxpy", "scale"]
    saxpy = next(k for _, k in found.kernels if k.name == "saxpy")
    assert [(p.name, p.pointer, p.dtype) for p in saxpy.params] == [
        ("x", True, "float32"),
        ("y", True, "float32"),
        ("n", False, "uint32"),
        ("a", False, "float32"),
    ]
    fill = next(k for _, k in found.kernels if k.name == "fill")
    assert fill.extern_c  # inside an extern "C" { } block
    sites = {s.kernel_name: s for s in found.sites}
    assert sites["saxpy"].options == ("-std=c++17",) and sites["fill"].options == ()
    assert {name: len(s.launches) for name, s in sites.items()} == {"saxpy": 2, "fill": 1, "neg": 1, "scale": 1}
    assert found.problems == [
        "pkg/inline.py:10: the CUDA source of this RawKernel cannot be read statically "
        "(code); keep CUDA sources as module-level string constants (or + of them)"
    ]
    assert [where for where, _ in cs.raw_kernel_definitions(root / "pkg")] == [
        "pkg/kernels/scale.cu:2",
        "pkg/inline.py:6",
        "pkg/sources.py:5",
        "pkg/sources.py:8",
    ]  # not the docstring

    errs = {
        name: [e for lc in s.launches for e in cs.check_launch(next(k for _, k in found.kernels if k.name == name), lc)]
        for name, s in sites.items()
    }
    assert errs["neg"] == [] and errs["scale"] == []
    assert len(errs["saxpy"]) == 2
    assert "argument 3 (const float a) gets `2.0`, a Python float" in errs["saxpy"][0]
    assert "saxpy takes 4 arguments, the launch passes 3" in errs["saxpy"][1]
    assert errs["fill"] == [
        "pkg/sub/run.py:17: fill argument 0 (long long* out) gets `out`, an array of int32, not int64"
    ]


def test_scanner_sources_compile_and_an_error_shows_nvrtc_log(made_up, nvrtc):
    found, _ = made_up
    for src in found.sources:
        for options in src.option_sets:
            res = cs.nvrtc_compile(nvrtc, src.text, "compute_80", options)
            assert res.ok, res.log
            entries = cs.ptx_entries(res.ptx)
            for k in src.kernels:
                assert len(entries[k.name]) == len(k.params)
                assert all(cs.ptx_size_agrees(p, t) for p, t in zip(k.params, entries[k.name]))
    bad = cs.nvrtc_compile(nvrtc, 'extern "C" __global__ void k(int* a) { a[0] = undefined_name; }', "sm_90")
    assert not bad.ok and "undefined_name" in bad.log and "error" in bad.log
