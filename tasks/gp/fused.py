"""Cache-blocked CPU passes of SGPR and DTC with the RBF kernel: ``Kuf`` made, used and reused one
block of columns at a time, so that its exponentials and the products that follow them run on data
in the core's caches, not in main memory.

Both passes of an evaluation are dominated by BLAS-3 products of ``Kuf`` [m, n_c]: the TRSM ``A = L^-1 Kuf``
and the SYRK ``A A'`` (``m^2 n_c`` flops each) of the statistics, and the TRSM ``L^-1 Kuf``, the GEMM ``W A``
(``2 m^2 n_c``) and the TRSM ``L^-T (W A)`` of the gradient. What surrounds them is elementwise (``m n_c``
exponentials, the adjoint ``G = -(L^-T W A + a y' / 2) * Kuf``) and costs a pass over ``Kuf`` each time it
runs over a whole chunk: 20 MB at m = 256, n_c = 10,000, several times the cache. Here every chunk is cut into
blocks of :data:`BLOCK` columns (256 x 1,024 doubles = 2 MiB):

* statistics: per block, ``E' = A2_b A1'`` (the augmented GEMM of
  :func:`pgmflow.tasks.gp.kernels._rbf_log_kernel`, transposed), ``K_b = exp(min(E, log s))`` in place
  (:func:`pgmflow.tasks.fastexp.capped_exp`), then, while ``K_b`` is in cache, ``A_b = L^-1 K_b`` (TRSM into
  a scratch block), ``AAT += A_b A_b'`` (SYRK, accumulated in place) and ``Ay += A_b y_b``;
* gradient: per block, ``R = L^-T W L^-1 K_b`` (two TRSMs and a GEMM into scratch blocks), the elementwise
  adjoint in place in ``R'`` (one numba loop), then ``T' += [x~_b, 1]' R'`` (the GEMM of
  :func:`pgmflow.tasks.gp.kernels._vjp_core`, transposed, without its ``x~^2`` columns) and the column
  sums ``R' 1`` that the lengthscale gradient takes in their place.

``Kuf`` is kept in Fortran (column) order, i.e. as ``Kfu`` [n_c, m] in C order: every block of
columns ``Kuf[:, j0:j1]`` is one contiguous piece of memory (the rows ``j0:j1`` of ``Kfu``), so each
block goes to BLAS without a copy, and the whole matrix is still an ordinary ``[m, n_c]`` array. The
blocking is fixed by :data:`BLOCK` and the chunk's row count alone, so the bits do not depend on
where or how often a chunk is computed; they differ from a whole-chunk SYRK in the order in which
``A A'``'s sums are added (rounding only). A C-ordered ``Kuf`` (``stats.cross_covariance``) is
accepted too (copied to Fortran order first) and gives the same bits.

Cost per chunk on the 2-core AMD EPYC (Zen 4) of the benchmarks, m = 256, n_c = 10,000, one BLAS thread,
measured before issue 37 added the triangular solves (one TRSM to the statistics, two to the gradient, each
about ``m^2 n_c`` flops): statistics 19.4 ms (its SYRK 14.4 ms: OpenBLAS's dsyrk at ~87 % of its dgemm rate on
a block its exponentials just wrote; the augmented GEMM 1.8 ms, the exponentials 1.9 ms with fused
multiply-adds), gradient 31 ms (its GEMM 27.3 ms, at 92 % of the dgemm rate; the product with ``[x~, 1]``, the adjoint
and the column sums 3.1 ms), against 27 and 32 ms for the whole-chunk passes they replace
(``benchmarks/sparse_gp.py`` prints the current profile).
"""

from __future__ import annotations

import functools
import math
import sys

import numpy as np
from scipy.linalg.blas import dsyrk, dtrsm

from pgmflow.tasks import backend, fastexp
from pgmflow.tasks.gp import kernels as kern

__all__ = ["BLOCK", "block_bounds", "rbf_grad", "rbf_kuf", "rbf_stats"]

BLOCK = 1024  # columns of Kuf per block (2 MiB at m = 256); 256 and 512 measured 2-5 % slower on Zen 4


def block_bounds(n: int, block: int = BLOCK) -> list[tuple[int, int]]:
    """The ``(start, stop)`` column ranges of the blocks of an ``n``-column ``Kuf``."""
    return [(j, min(j + block, n)) for j in range(0, int(n), int(block))]


def as_fortran(Kuf) -> np.ndarray:
    """``Kuf`` [m, n] in Fortran order (a copy only when it is not already)."""
    return np.asfortranarray(Kuf, dtype=np.float64)


def _check_out(out, m: int, n: int) -> np.ndarray:
    if out is None:
        return np.empty((m, n), order="F")
    if out.dtype != np.float64 or out.shape != (m, n) or not out.flags.f_contiguous or not out.flags.writeable:
        raise ValueError(f"out must be a writeable Fortran-ordered float64 array of shape {(m, n)}")
    return out


def _made(Zs, Xs, log_s: float, K, offsets=None):
    """Fill ``K`` (Fortran [m, n]) with the RBF ``Kuf`` block by block, yielding each block's columns once
    made. With ``offsets`` (the blocks of a wider ``Kuf``), ``K`` is one block's scratch, written over for
    each of them in turn."""
    if log_s > fastexp.MAX_CAP:
        raise ValueError(f"log kernel scale {log_s} is above {fastexp.MAX_CAP}: use the whole-chunk path")
    A1, A2 = kern.rbf_augmented(np, Zs, Xs, float(log_s))
    KT = K.T  # [n, m] C order: Kfu
    for j0, j1 in block_bounds(K.shape[1]) if offsets is None else offsets:
        Eb = KT[j0:j1] if offsets is None else KT[: j1 - j0]  # [b, m], contiguous
        np.matmul(A2[j0:j1], A1.T, out=Eb)  # log s - u / 2
        fastexp.capped_exp(Eb, log_s, fma=True)
        yield j0, j1


def rbf_kuf(Zs, Xs, log_s: float, out: np.ndarray | None = None, order: str = "F") -> np.ndarray:
    """The RBF ``Kuf = K(Z, X)`` [m, n] of scaled inputs ``Zs`` [m, d], ``Xs`` [n, d]: in Fortran order,
    written into ``out`` (Fortran-ordered [m, n] float64) when given; or, with ``order="C"``, a new
    C-ordered array with the same bits (each block made as for Fortran order, then copied across while
    in cache: FITC's whole-chunk code runs on C-ordered matrices)."""
    m, n = Zs.shape[0], Xs.shape[0]
    if order == "C":
        K = np.empty((m, n))
        scratch = _check_out(None, m, min(BLOCK, n))
        for j0, j1 in _made(Zs, Xs, log_s, scratch, offsets=block_bounds(n)):
            K[:, j0:j1] = scratch[:, : j1 - j0]
        return K
    K = _check_out(out, m, n)
    for _ in _made(Zs, Xs, log_s, K):
        pass
    return K


def rbf_stats(Zs, Xs, y, log_s: float, L, Kuf=None, out: np.ndarray | None = None):
    """``(Ay [m], AAT [m, m], Kuf)``: ``A y`` and ``A A'`` (exactly symmetric) with ``A = L^-1 Kuf`` for the
    lower Cholesky factor ``L`` [m, m] of ``Kuu``, computing ``Kuf`` (Fortran order, into ``out`` when given)
    block by block as they go, or reading a given ``Kuf``. ``Kuf`` itself is kept (the gradient pass uses it);
    each block's ``A_b = L^-1 K_b`` is solved in one scratch block while ``K_b`` is in cache."""
    m = Zs.shape[0]
    if Kuf is not None:
        K = as_fortran(Kuf)
        blocks = block_bounds(K.shape[1])
    else:
        K = _check_out(out, m, Xs.shape[0])
        blocks = _made(Zs, Xs, log_s, K)
    Lf = np.asfortranarray(L, dtype=np.float64)
    scratch = np.empty((m, min(BLOCK, K.shape[1])), order="F")
    C = np.zeros((m, m), order="F")  # upper triangle of sum_b A_b A_b'
    Ay = np.zeros(m)
    for j0, j1 in blocks:
        Ab = scratch[:, : j1 - j0]  # [m, b], Fortran-contiguous
        Ab[...] = K[:, j0:j1]
        dtrsm(1.0, Lf, Ab, lower=1, overwrite_b=1)  # A_b = L^-1 K_b in place
        dsyrk(1.0, Ab, beta=1.0, c=C, trans=0, overwrite_c=1)
        Ay += Ab @ y[j0:j1]
    AAT = kern.symmetric_from_triangle(C)  # C is zero below its diagonal
    return Ay, np.ascontiguousarray(AAT), (Kuf if Kuf is not None else K)


@backend.kernel(cache=True, nogil=True)
def _adjoint_block(RT, KT, ha, y):
    """``R' = -(R' + y ha') * K'`` in place: RT, KT [b, m], ha [m], y [b]."""
    b, m = RT.shape
    for j in range(b):
        yj = y[j]
        for i in range(m):
            RT[j, i] = -(RT[j, i] + ha[i] * yj) * KT[j, i]


@functools.cache
def _kernels():
    return backend.compile_kernels(sys.modules[__name__])


def rbf_grad(W, a, Kuf, Xs, y, L):
    """``(GX [m, d], g1 [m], sq [d], sum G)`` for ``G = dF/dKuf * dK/du = -(R + a y' / 2) * Kuf`` [m, n] with
    ``R = L^-T W L^-1 Kuf``: ``GX = G x~``, ``g1 = G 1`` and ``sq = 1' G x~^2`` (what ``kernels._vjp_sums`` turns
    into the lengthscale and ``Z`` gradients). ``W`` [m, m] symmetric (``dF/dAAT`` of the whitened statistics),
    ``a`` [m]; ``Kuf`` [m, n] (Fortran order, else copied to it); ``Xs`` [n, d], ``y`` [n]; ``L`` [m, m] the
    lower Cholesky factor of ``Kuu`` the statistics were made with. Per block, ``R_b = L^-T (W (L^-1 K_b))`` by
    two triangular solves and a GEMM: forming ``L^-T W L^-1`` once instead loses the gradient to rounding
    when ``Kuu`` is badly conditioned (issue 37: hundreds of nats per unit on the CO2 record with Z = X).

    The squares enter only through ``sq``, a sum over the inducing inputs too, so each block's product is
    ``[x~_b, 1]' R'`` (``d + 1`` rows) and ``sq`` takes the column sums ``R' 1`` (a GEMV) of each block
    times ``x~_b^2``: 11 rows of GEMM and a GEMV instead of 21 rows at d = 10 (2.0 against 2.9 ms a
    chunk at m = 256, n_c = 10,000 on the benchmarks' Zen 4)."""
    adjoint = _kernels()["_adjoint_block"]
    K = as_fortran(Kuf)
    KT = K.T  # [n, m] C order
    n, m = KT.shape
    d = Xs.shape[1]
    W = np.ascontiguousarray(W, dtype=np.float64)
    Lf = np.asfortranarray(L, dtype=np.float64)
    ha = 0.5 * np.asarray(a, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.float64)
    AugT = np.empty((d + 1, n))  # [x~, 1]'
    AugT[:d] = Xs.T
    AugT[d] = 1.0
    ones = np.ones(m)
    col = np.empty(n)  # column sums of G
    Tt = np.zeros((d + 1, m))  # [G x~, G 1]'
    scratch = np.empty(min(BLOCK, n) * m)
    whitened = np.empty((m, min(BLOCK, n)), order="F")
    Ttb = np.empty_like(Tt)
    for j0, j1 in block_bounds(n):
        Ab = whitened[:, : j1 - j0]  # [m, b] Fortran
        Ab[...] = K[:, j0:j1]
        dtrsm(1.0, Lf, Ab, lower=1, overwrite_b=1)  # L^-1 K_b
        RT = scratch[: (j1 - j0) * m].reshape(j1 - j0, m)
        np.matmul(Ab.T, W, out=RT)  # [b, m]  (W A_b)' as W = W'
        R = dtrsm(1.0, Lf, RT.T, lower=1, trans_a=1, overwrite_b=1)  # L^-T W A_b, in place ([m, b] Fortran)
        if not np.shares_memory(R, RT):  # pragma: no cover - BLAS worked on a copy
            RT[...] = R.T
        adjoint(RT, KT[j0:j1], ha, y[j0:j1])
        np.matmul(AugT[:, j0:j1], RT, out=Ttb)  # [d + 1, m]
        Tt += Ttb
        np.matmul(RT, ones, out=col[j0:j1])
    sq = col @ (Xs * Xs)  # [d]
    return np.ascontiguousarray(Tt[:d].T), Tt[d].copy(), sq, math.fsum(Tt[d])
