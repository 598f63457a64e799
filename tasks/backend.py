"""Array backends: the one place in ``tasks/`` that imports CuPy and numba, lazily.

Everything else in ``tasks/`` calls :func:`numba` or :func:`cupy` from here inside a cached
builder function, so that importing ``tasks`` never pays for (or requires) either library.

numba kernels have one form: plain module-level functions marked with :func:`kernel` (the njit
options they need), compiled on first use by :func:`compile_kernels` from the module's cached
accessor (``_kernels()``), which rebinds the module's globals to the dispatchers. Names a kernel
takes from elsewhere (another module's kernels, ``numba.prange``) are passed as ``bind``.

``get_xp(name)`` returns the array module for a backend name (``"numpy"`` or ``"cupy"``);
``array_module(x)`` returns the module an array belongs to; ``to_numpy(x)`` copies any array to
host memory. ``gpu_info()`` says which CUDA device, runtime and driver CuPy finds (or why none),
``gpu_status()`` the same as ``(available, one line)``: what ``backend=auto`` records.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
from pathlib import Path

import numpy as np

KERNEL_MARK = "__pgmflow_kernel__"
# compile_kernels runs one module at a time: a study's stages call the workloads' accessors from several driver
# threads, and functools.lru_cache does not stop two threads from running one accessor at once
_COMPILE_LOCK = threading.RLock()

BACKENDS = ("numpy", "cupy")


@functools.lru_cache(maxsize=None)
def numba():
    """Import and return the numba module (raises ImportError with the reason)."""
    import numba as _numba  # noqa: PLC0415  (lazy by design)

    return _numba


def kernel(**options):
    """Mark a module-level function as a numba kernel, compiled with ``numba.njit(**options)`` by
    :func:`compile_kernels` on first use. Marking imports nothing: the function stays plain Python
    (callable, testable and readable as such) until its module's kernels are compiled."""

    def mark(fn):
        setattr(fn, KERNEL_MARK, dict(options))
        return fn

    return mark


def compile_kernels(module, bind: dict | None = None) -> dict:
    """``njit`` every :func:`kernel`-marked function defined in ``module`` and rebind the module's globals
    to the dispatchers, so that kernels calling each other call compiled code (numba resolves callees
    through the caller's globals; binding them to module globals rather than closure cells also keeps
    numba's on-disk cache key free of pickled closures). Returns ``{name: dispatcher}``. Compilation
    itself happens at each kernel's first call (or is loaded from the on-disk cache); call this once
    per module, behind the module's cached accessor (``functools.lru_cache``). A second call, or one from another
    thread at the same time (a study's stages), returns the same dispatchers: calls hold one lock, and a kernel
    compiled already is kept.

    ``bind`` (``{global name: object}``) sets further module globals before anything compiles: what
    the kernels call or use from elsewhere, namely kernels of *other* modules (their compiled
    dispatchers, so compile that module first through its own accessor) and ``numba.prange``. The
    module declares each such name at module level with its plain-Python meaning, so that the kernels
    stay callable as Python and a reader (or a linter) sees where the name comes from::

        from pgmflow.tasks import fastexp

        prange = range  # bound to numba.prange by _kernels()
        _cexp = fastexp._capped_exp_nb  # bound to its dispatcher by _kernels()

        @backend.kernel(cache=True, nogil=True, parallel=True)
        def _exps(a, out):
            for i in prange(a.shape[0]):
                ...
            _cexp(out, 0.0)

        @functools.lru_cache(maxsize=None)
        def _kernels():
            return backend.compile_kernels(sys.modules[__name__], bind={
                "prange": backend.numba().prange, "_cexp": fastexp._kernels()["_capped_exp_nb"]})

    A global that still names another module's marked (uncompiled) kernel raises ``ValueError``: numba
    could not call it, and compiling a second copy here would split the on-disk cache. Kernels whose
    name is in ``bind`` raise too (a kernel of this module is compiled here, not bound).
    """
    with _COMPILE_LOCK:
        return _compile_kernels(module, dict(bind or {}))


def _own_kernels(module) -> dict:
    """``{name: function or dispatcher}``: the module's marked kernels, compiled already or not (a dispatcher's
    ``py_func`` carries the mark)."""
    own = {}
    for name, obj in vars(module).items():
        fn = getattr(obj, "py_func", obj)
        if inspect.isfunction(fn) and getattr(fn, KERNEL_MARK, None) is not None and fn.__module__ == module.__name__:
            own[name] = obj
    return own


def _compile_kernels(module, bind: dict) -> dict:
    nb = numba()
    own = _own_kernels(module)
    clash = sorted(set(own) & set(bind))
    if clash:
        raise ValueError(f"compile_kernels({module.__name__}): bind names kernels of the module itself: {clash}")
    for name, value in bind.items():
        setattr(module, name, value)
    foreign = sorted(
        name
        for name, fn in vars(module).items()
        if inspect.isfunction(fn) and getattr(fn, KERNEL_MARK, None) is not None and name not in own
    )
    if foreign:
        raise ValueError(
            f"compile_kernels({module.__name__}): {foreign} name kernels of other modules, not their "
            "compiled dispatchers; pass bind={name: that module's dispatcher}"
        )
    compiled = {
        name: fn if not inspect.isfunction(fn) else nb.njit(**getattr(fn, KERNEL_MARK))(fn) for name, fn in own.items()
    }
    for name, dispatcher in compiled.items():
        setattr(module, name, dispatcher)
    return compiled


@functools.lru_cache(maxsize=None)
def cupy():
    """Import and return the cupy module (raises ImportError if it is not installed)."""
    import cupy as _cupy  # noqa: PLC0415  (lazy by design)

    return _cupy


@functools.lru_cache(maxsize=None)
def cupyx():
    """Import and return cupyx with ``cupyx.scipy.special`` and ``cupyx.scipy.linalg`` loaded (raises ImportError
    without CuPy)."""
    import cupyx as _cupyx  # noqa: PLC0415  (lazy by design)
    import cupyx.scipy.special  # noqa: F401, PLC0415

    with contextlib.suppress(ImportError):  # an old CuPy without it: callers fall back (tasks/gp/stats.py)
        import cupyx.scipy.linalg  # noqa: F401, PLC0415

    return _cupyx


def _version(v: int) -> str:
    """CUDA's integer version (e.g. 13000, 12080) as "13.0", "12.8"."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def _kernel_driver_version() -> str | None:
    """The NVIDIA kernel driver's version (e.g. "580.65.06") from /proc, or None."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return word
    return None


def gpu_info() -> dict:
    """What CuPy finds: whether a CUDA device is usable, and which CUDA, driver and device.

    Returns a dict with ``available`` (bool) and ``reason`` (why not, or None), and where CuPy
    imports: ``cupy`` (its version), ``cuda_runtime`` (the CUDA runtime CuPy uses, e.g. "13.0"),
    ``cuda_driver`` (the newest CUDA the driver supports), ``driver`` (the kernel driver's version,
    e.g. "580.65.06", where /proc tells it), ``nvrtc`` (the runtime compiler's version); and with a
    device: ``device_count``, ``device`` (device 0's name), ``compute_capability`` (e.g. "9.0"),
    ``memory_gib`` and ``multiprocessors``. Nothing here raises: a failing query leaves its key out.
    """
    info: dict = {"available": False, "reason": None}
    if os.environ.get("PGMFLOW_DISABLE_GPU"):
        info["reason"] = "GPU disabled by PGMFLOW_DISABLE_GPU"
        return info
    try:
        cp = cupy()
    except Exception as exc:  # ImportError, or a CUDA library that fails to load
        info["reason"] = f"cupy is not importable ({type(exc).__name__}: {exc})"
        return info
    info["cupy"] = getattr(cp, "__version__", "?")
    queries = {
        "cuda_runtime": lambda: _version(cp.cuda.runtime.runtimeGetVersion()),
        "cuda_driver": lambda: _version(cp.cuda.runtime.driverGetVersion()),  # 0 (-> "0.0") without a driver
        "nvrtc": lambda: ".".join(str(x) for x in cp.cuda.nvrtc.getVersion()),
    }
    for key, query in queries.items():
        try:
            value = query()
        except Exception:  # e.g. no driver: the runtime version is still known
            continue
        if value != "0.0":
            info[key] = value
    driver = _kernel_driver_version()
    if driver:
        info["driver"] = driver
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:
        info["reason"] = f"cupy sees no CUDA device ({type(exc).__name__}: {exc})"
        return info
    if n < 1:
        info["reason"] = "cupy sees no CUDA device"
        return info
    try:
        props = cp.cuda.runtime.getDeviceProperties(0)
    except Exception as exc:
        info["reason"] = f"cupy cannot query CUDA device 0 ({type(exc).__name__}: {exc})"
        return info
    name = props["name"]
    info.update(
        available=True,
        device_count=int(n),
        device=name.decode() if isinstance(name, bytes) else str(name),
        compute_capability=f"{props['major']}.{props['minor']}",
        memory_gib=round(props["totalGlobalMem"] / 2**30, 1),
        multiprocessors=int(props["multiProcessorCount"]),
    )
    return info


def describe_gpu(info: dict) -> str:
    """One line for a :func:`gpu_info` dict: the device and the CUDA it runs, or why there is none.

    e.g. ``NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB; CUDA runtime 13.0, driver 580.65.06 (CUDA 13.0),
    CuPy 13.6.0)``.
    """
    if not info.get("available"):
        return str(info.get("reason") or "no CUDA device")
    cc = info.get("compute_capability", "?").replace(".", "")
    more = f", 1 of {info['device_count']} devices" if info.get("device_count", 1) > 1 else ""
    driver = info.get("driver", "?")
    if info.get("cuda_driver"):
        driver += f" (CUDA {info['cuda_driver']})"
    return (
        f"{info['device']} (sm_{cc}, {info.get('memory_gib', '?')} GiB{more}; "
        f"CUDA runtime {info.get('cuda_runtime', '?')}, driver {driver}, CuPy {info.get('cupy', '?')})"
    )


def gpu_status() -> tuple[bool, str]:
    """Return ``(available, description)``: whether CuPy imports and sees a CUDA device.

    The description names the device and the CUDA runtime, driver and CuPy versions when there is
    one (:func:`describe_gpu`), or says why there is none.
    """
    info = gpu_info()
    return bool(info["available"]), describe_gpu(info)


def resolve_backend(name: str) -> str:
    """Map ``auto|numpy|cupy`` to a concrete backend; ``auto`` picks cupy when a GPU is usable."""
    if name == "auto":
        return "cupy" if gpu_status()[0] else "numpy"
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; expected one of auto, {', '.join(BACKENDS)}")
    return name


def get_xp(name: str):
    """The array module for a concrete backend name."""
    if name == "numpy":
        return np
    if name == "cupy":
        return cupy()
    raise ValueError(f"unknown backend {name!r}")


def array_module(x):
    """numpy or cupy, whichever ``x`` belongs to."""
    mod = type(x).__module__
    if mod.startswith("cupy"):
        return cupy()
    return np


def to_numpy(x):
    """A host (NumPy) copy of ``x``; NumPy arrays and scalars pass through."""
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return np.asarray(x)
