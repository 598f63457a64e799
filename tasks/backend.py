"""Array backends: the one place in ``tasks/`` that imports CuPy and numba, lazily.

Everything else in ``tasks/`` calls :func:`numba` or :func:`cupy` from here inside a cached
builder function, so that importing ``tasks`` never pays for (or requires) either library.

``get_xp(name)`` returns the array module for a backend name (``"numpy"`` or ``"cupy"``);
``array_module(x)`` returns the module an array belongs to; ``to_numpy(x)`` copies any array to
host memory.
"""

from __future__ import annotations

import functools
import inspect
import os

import numpy as np

KERNEL_MARK = "__pgmflow_kernel__"

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


def compile_kernels(module) -> dict:
    """``njit`` every :func:`kernel`-marked function of ``module`` and rebind the module's globals to
    the dispatchers, so that kernels calling each other call compiled code (numba resolves callees
    through the caller's globals; binding them to module globals rather than closure cells also keeps
    numba's on-disk cache key free of pickled closures). Returns ``{name: dispatcher}``. Compilation
    itself happens at each kernel's first call (or is loaded from the on-disk cache); call this once
    per module (its callers cache it)."""
    nb = numba()
    marked = {name: fn for name, fn in vars(module).items()
              if inspect.isfunction(fn) and getattr(fn, KERNEL_MARK, None) is not None}
    compiled = {name: nb.njit(**getattr(fn, KERNEL_MARK))(fn) for name, fn in marked.items()}
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
    """Import and return cupyx with ``cupyx.scipy.special`` loaded (raises ImportError without CuPy)."""
    import cupyx as _cupyx  # noqa: PLC0415  (lazy by design)
    import cupyx.scipy.special  # noqa: F401, PLC0415

    return _cupyx


def gpu_status() -> tuple[bool, str]:
    """Return ``(available, description)``: whether CuPy imports and sees a CUDA device.

    The description names the device when there is one, or says why there is none.
    """
    if os.environ.get("PGMFLOW_DISABLE_GPU"):
        return False, "GPU disabled by PGMFLOW_DISABLE_GPU"
    try:
        cp = cupy()
    except Exception as exc:  # ImportError, or a CUDA library that fails to load
        return False, f"cupy is not importable ({type(exc).__name__}: {exc})"
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return False, f"cupy sees no CUDA device ({type(exc).__name__}: {exc})"
    if n < 1:
        return False, "cupy sees no CUDA device"
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    return True, name


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
