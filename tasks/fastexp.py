"""``exp(min(E, cap))`` in place on the CPU, vectorised: RBF cross matrices (sparse_gp), TESLA margins.

NumPy's float64 ``exp`` on a CPU without AVX-512 is the C library's, element by element (~6-7 ns an
element on the benchmark machine): the ``m n`` exponentials of ``Kuf`` cost about half as much as
the ``m^2 n`` SYRK of the statistics. :func:`capped_exp` does the clip and the exponential in one
pass of a numba loop that LLVM vectorises (~2 ns an element), with the classic reduction

    exp(x) = 2^k exp(r),   k = round(x / ln 2),   r = (x - k ln2_hi) - k ln2_lo,  |r| <= ln(2) / 2

(Cody and Waite's two-part ``ln 2``, exact for ``|k| < 2^11``), ``exp(r)`` by its Taylor polynomial of
degree 13 (remainder below ``0.35^14 / 14! * 1.5 < 1e-17`` relative) in Horner form, and ``2^k``
built in the exponent bits (``k`` read from the bits of ``x / ln 2 + 1.5 * 2^52``: no float-to-int
conversion, which AVX2 lacks). Every operation is a plain IEEE multiply or add (no fused
multiply-add, no fast-math), so the bits are the same on every x86-64 or ARM machine -- unlike
NumPy's ``exp``, whose bits depend on the CPU's SIMD level. Measured against NumPy on 2.5 million
arguments in [-30, 0]: at most 1 ulp apart, 90 % identical. ``capped_exp(..., fma=True)`` runs the same
loop with fused multiply-adds allowed (1.6x faster, 92 % identical to NumPy; bits then depend on the CPU
having FMA): what the sparse GP's RBF matrices use.

Range: arguments below ``-708`` give 0 (their exponential is below the smallest normal float64,
``2.2e-308``: an absolute error under ``3.3e-308``); the cap must be at most 700 (callers fall back
to NumPy above: a kernel scale over ``e^700``); NaN stays NaN.
"""

from __future__ import annotations

import functools
import sys
import types

import numpy as np

from pgmflow.tasks import backend

__all__ = ["MAX_CAP", "capped_exp"]

MAX_CAP = 700.0  # largest cap: 2^k stays a normal float64 (k <= 1010)
_FLOOR = -708.0  # exp(-708) = 3.3e-308, just above the smallest normal float64
_LOG2E = 1.4426950408889634  # 1 / ln 2
_LN2_HI = 6.93147180369123816490e-01  # ln 2, its high part (32 trailing zero bits: k * _LN2_HI is exact)
_LN2_LO = 1.90821492927058770002e-10  # ln 2 - _LN2_HI
_SHIFT = 6755399441055744.0  # 1.5 * 2^52: x + _SHIFT rounds x to an integer held in the low bits
_SHIFT_BITS = int(np.float64(_SHIFT).view(np.int64))
_E0 = 1.0  # 1/0!
_E1 = 1.0  # 1/1!
_E2 = 0.5  # 1/2!
_E3 = 0.16666666666666666  # 1/3!
_E4 = 0.041666666666666664  # 1/4!
_E5 = 0.008333333333333333  # 1/5!
_E6 = 0.001388888888888889  # 1/6!
_E7 = 0.0001984126984126984  # 1/7!
_E8 = 2.48015873015873e-05  # 1/8!
_E9 = 2.7557319223985893e-06  # 1/9!
_E10 = 2.755731922398589e-07  # 1/10!
_E11 = 2.505210838544172e-08  # 1/11!
_E12 = 2.08767569878681e-09  # 1/12!
_E13 = 1.6059043836821613e-10  # 1/13!


@backend.kernel(cache=True, nogil=True)
def _capped_exp_nb(a, cap):
    """``a[i] = exp(min(a[i], cap))`` for a float64 vector ``a``, in place (see the module docstring)."""
    bits = a.view(np.int64)
    for i in range(a.size):
        x = a[i]
        keep = x == x  # False for NaN
        x = min(x, cap)
        small = x < _FLOOR
        x = max(x, _FLOOR)
        kf = x * _LOG2E + _SHIFT
        k = kf - _SHIFT
        r = (x - k * _LN2_HI) - k * _LN2_LO
        p = (
            (
                (
                    (
                        (
                            (
                                (((((((_E13) * r + _E12) * r + _E11) * r + _E10) * r + _E9) * r + _E8) * r + _E7) * r
                                + _E6
                            )
                            * r
                            + _E5
                        )
                        * r
                        + _E4
                    )
                    * r
                    + _E3
                )
                * r
                + _E2
            )
            * r
            + _E1
        ) * r + _E0
        a[i] = kf
        bits[i] = (bits[i] - _SHIFT_BITS + 1023) << 52  # 2^k
        y = a[i] * p
        a[i] = 0.0 if small else (y if keep else x)


def _renamed(fn, name: str):
    """A second function object with ``fn``'s code under another name (numba compiles and caches each
    function object on its own, with its own options)."""
    twin = types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    twin.__qualname__ = name
    twin.__doc__ = fn.__doc__
    return twin


# The same loop with fused multiply-adds allowed (LLVM's ``contract``): each Horner step and the reduction become
# one FMA each where the CPU has them (every x86-64 since 2013's Haswell and AMD's Zen, every ARM64), about 1.6x
# faster (a 2 MiB block on the benchmarks' Zen 4: 190 against 301 us) and rounded once per step instead of twice:
# at most 1 ulp from NumPy's exp, 92 % identical. Its bits depend on whether the CPU has FMA, as OpenBLAS's do;
# the sparse GP's RBF matrices use it (their bits depend on the BLAS anyway), TESLA keeps the plain loop, whose
# bits are the same on every machine.
_capped_exp_fma_nb = backend.kernel(cache=True, nogil=True, fastmath={"contract"})(
    _renamed(_capped_exp_nb, "_capped_exp_fma_nb")
)


@functools.cache
def _kernels():
    return backend.compile_kernels(sys.modules[__name__])


def capped_exp(E: np.ndarray, cap: float, fma: bool = False) -> np.ndarray:
    """``exp(min(E, cap))`` written over ``E`` (float64, C-contiguous, any shape); returns ``E``.
    ``cap <= MAX_CAP``. ``fma``: the loop with fused multiply-adds (faster; bits then depend on the CPU
    having FMA, see ``_capped_exp_fma_nb``)."""
    if E.dtype != np.float64 or not E.flags.c_contiguous or not E.flags.writeable:
        raise ValueError("capped_exp needs a writeable C-contiguous float64 array")
    cap = float(cap)
    if not cap <= MAX_CAP:
        raise ValueError(f"capped_exp: cap {cap} is above {MAX_CAP}; use numpy.exp there")
    _kernels()["_capped_exp_fma_nb" if fma else "_capped_exp_nb"](E.reshape(-1), cap)
    return E
