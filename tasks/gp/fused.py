"""Cache-blocked CPU passes of SGPR and DTC with the RBF kernel: ``Kuf`` made, used and reused one
block of columns at a time, so that its exponentials and the products that follow them run on data
in the core's caches, not in main memory.

Both passes of an evaluation are dominated by BLAS-3 products of ``Kuf`` [m, n_c]. They come in two forms,
chosen per evaluation from the Cholesky factor ``L`` of ``Kuu`` alone (:func:`plain_inverse`):

* plain (``Kuu`` well conditioned): the SYRK ``Kuf Kfu`` (``m^2 n_c`` flops) and ``Kuf y``, whitened once per
  chunk with an explicit ``L^-1``; the gradient's ``P Kuf`` with ``P = L^-T W L^-1`` formed once (a GEMM,
  ``2 m^2 n_c``);
* whitened: the TRSM ``A = L^-1 Kuf`` and the SYRK ``A A'`` of the statistics, ``A`` kept for the gradient
  pass, whose ``M A`` with ``M = L^-T W`` formed once is again one GEMM (without a kept ``A``, a TRSM more).

What surrounds them is elementwise (``m n_c`` exponentials, the adjoint ``G = -(R + a y' / 2) * Kuf``) and
costs a pass over ``Kuf`` each time it runs over a whole chunk: 20 MB at m = 256, n_c = 10,000, several times
the cache. Here every chunk is cut into blocks of :data:`BLOCK` columns (256 x 1,024 doubles = 2 MiB):

* statistics: per block, ``E' = A2_b A1'`` (the augmented GEMM of
  :func:`pgmflow.tasks.gp.kernels._rbf_log_kernel`, transposed), ``K_b = exp(min(E, log s))`` in place
  (:func:`pgmflow.tasks.fastexp.capped_exp`), then, while ``K_b`` is in cache, the SYRK of ``K_b`` (plain) or
  ``A_b = L^-1 K_b`` (TRSM into a scratch block or the kept ``A``) and its SYRK (whitened), accumulated in place,
  and the product with ``y_b``;
* gradient: per block, ``R = P K_b`` or ``M A_b`` (one GEMM into a scratch block), the elementwise adjoint in
  place in ``R'`` (one numba loop), then ``T' += [x~_b, 1]' R'`` (the GEMM of
  :func:`pgmflow.tasks.gp.kernels._vjp_core`, transposed, without its ``x~^2`` columns) and the column
  sums ``R' 1`` that the lengthscale gradient takes in their place.

``Kuf`` is kept in Fortran (column) order, i.e. as ``Kfu`` [n_c, m] in C order: every block of
columns ``Kuf[:, j0:j1]`` is one contiguous piece of memory (the rows ``j0:j1`` of ``Kfu``), so each
block goes to BLAS without a copy, and the whole matrix is still an ordinary ``[m, n_c]`` array. The
blocking is fixed by :data:`BLOCK` and the chunk's row count alone, so the bits do not depend on
where or how often a chunk is computed; they differ from a whole-chunk SYRK in the order in which
``A A'``'s sums are added (rounding only). A C-ordered ``Kuf`` (``stats.cross_covariance``) is
accepted too (copied to Fortran order first) and gives the same bits.

Cost per chunk on the 2-core AMD EPYC (Zen 4) of the benchmarks, m = 256, n_c = 10,000, one BLAS thread
(``benchmarks/sparse_gp.py`` prints the current profile;
``benchmarks/results/issue37-sgpr-two-forms-cpu-2core-epyc.md``):
plain form, statistics 23 ms (the SYRK ~14 ms at ~87 % of the dgemm rate; the augmented GEMM ~2 ms, the
exponentials ~2 ms with fused multiply-adds) and gradient 34 ms (its GEMM ~27 ms); whitened form, statistics 62
ms (the TRSM runs at about half the dgemm rate) and gradient 33 ms with the kept ``A`` (67 ms without).
"""

from __future__ import annotations

import functools
import math
import sys

import numpy as np
from scipy.linalg.blas import dsyrk, dtrmm, dtrsm
from scipy.linalg.lapack import dtrcon, dtrtri

from pgmflow.tasks import backend, fastexp
from pgmflow.tasks.gp import kernels as kern

__all__ = ["BLOCK", "PLAIN_MAX_COND", "block_bounds", "plain_inverse", "rbf_grad", "rbf_kuf", "rbf_stats", "sandwich"]

BLOCK = 1024  # columns of Kuf per block (2 MiB at m = 256); 256 and 512 measured 2-5 % slower on Zen 4

PLAIN_MAX_COND = 1000.0  # the largest 1-norm condition number of L (estimated) for which the plain form is used


def plain_inverse(L) -> np.ndarray | None:
    """``L^-1`` [m, m] (lower, Fortran order) when the lower Cholesky factor ``L`` of ``Kuu`` is well enough
    conditioned for the *plain* form of the chunk passes, None when the whitened form is needed.

    The two forms compute the same statistics and gradient: whitened, ``A_b = L^-1 K_b`` by a triangular solve per
    block of ``Kuf`` (and two in the gradient pass); plain, ``Kuf Kfu`` and ``Kuf y`` summed over the chunk's blocks
    and turned into ``A A' = L^-1 (Kuf Kfu) L^-T`` and ``A y`` once per chunk with this ``L^-1`` (``m^3`` flops,
    against ``m^2 n_c`` for each solve they save), and the gradient's ``L^-T W L^-1 Kuf`` as one GEMM with the
    explicit ``P = L^-T W L^-1``. The plain form's rounding grows with ``cond(L)^2 = cond(Kuu)``, the whitened
    form's with ``cond(L)``; with ``cond_1(L) <= PLAIN_MAX_COND`` (LAPACK's trcon estimate, ``m^2`` flops) the
    plain form is at most about that factor less accurate, which on the benchmarks' problems is a relative
    difference below 1e-11 in the bound and 1e-8 in the gradient (``tests/tasks/gp/test_plain_form.py``), and it
    saves the three triangular solves per block (2.6x the time of an SGPR evaluation on the CPU, issue 37).
    Badly conditioned ``Kuu`` (dense inducing inputs, the CO2 record with ``Z = X``) keeps the whitened form.

    The choice is a function of ``L``'s bits alone, which the driver ships to every chunk, so the same chunks give
    the same bits on any worker count."""
    Lf = np.asfortranarray(L, dtype=np.float64)
    rcond, info = dtrcon(Lf, norm="1", uplo="L", diag="N")
    if info != 0 or not rcond * PLAIN_MAX_COND >= 1.0:
        return None
    Linv, info = dtrtri(Lf, lower=1)
    if info != 0:  # pragma: no cover - a singular factor has rcond 0
        return None
    return np.asfortranarray(np.tril(Linv))


def sandwich(Linv, S, outer: bool = False) -> np.ndarray:
    """``Linv' S Linv`` (``outer``: ``Linv S Linv'``) [m, m] for lower-triangular ``Linv`` and symmetric ``S``,
    exactly symmetric, in C order: two BLAS trmm."""
    X = dtrmm(1.0, Linv, np.asfortranarray(S), side=0, lower=1, trans_a=0 if outer else 1)
    X = dtrmm(1.0, Linv, X, side=1, lower=1, trans_a=1 if outer else 0, overwrite_b=1)
    return np.ascontiguousarray(0.5 * (X + X.T))


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


def rbf_stats(Zs, Xs, y, log_s: float, L, Kuf=None, out: np.ndarray | None = None, a_out=None, keep_a=False):
    """``(Ay [m], AAT [m, m], Kuf, A)``: ``A y`` and ``A A'`` (exactly symmetric) with ``A = L^-1 Kuf`` for the
    lower Cholesky factor ``L`` [m, m] of ``Kuu``, computing ``Kuf`` (Fortran order, into ``out`` when given)
    block by block as they go, or reading a given ``Kuf``. ``Kuf`` itself is kept (the gradient pass uses it).

    Whitened form (:func:`plain_inverse` is None): each block's ``A_b = L^-1 K_b`` is solved while ``K_b`` is
    in cache, in one scratch block, or, with ``keep_a`` (or ``a_out``, a Fortran-ordered float64 [m, n] array to
    write into), into a whole ``A`` [m, n] that is returned for the gradient pass to take back (it then needs no
    triangular solve). Plain form: ``Kuf Kfu`` and ``Kuf y`` whitened once; ``A`` is None."""
    m = Zs.shape[0]
    if Kuf is not None:
        K = as_fortran(Kuf)
        blocks = block_bounds(K.shape[1])
    else:
        K = _check_out(out, m, Xs.shape[0])
        blocks = _made(Zs, Xs, log_s, K)
    Linv = plain_inverse(L)
    C = np.zeros((m, m), order="F")  # upper triangle of sum_b A_b A_b' (plain: of sum_b K_b K_b')
    Ay = np.zeros(m)
    if Linv is not None:  # plain form: psi2 = sum_b K_b K_b' and psi1y, whitened once at the end
        for j0, j1 in blocks:
            Kb = K[:, j0:j1]  # [m, b], Fortran-contiguous
            dsyrk(1.0, Kb, beta=1.0, c=C, trans=0, overwrite_c=1)
            Ay += Kb @ y[j0:j1]
        AAT = sandwich(Linv, kern.symmetric_from_triangle(C), outer=True)  # L^-1 psi2 L^-T
        return Linv @ Ay, AAT, (Kuf if Kuf is not None else K), None
    Lf = np.asfortranarray(L, dtype=np.float64)
    A = _check_out(a_out, m, K.shape[1]) if (keep_a or a_out is not None) else None
    scratch = np.empty((m, min(BLOCK, K.shape[1])), order="F") if A is None else None
    for j0, j1 in blocks:
        Ab = scratch[:, : j1 - j0] if A is None else A[:, j0:j1]  # [m, b], Fortran-contiguous
        Ab[...] = K[:, j0:j1]
        dtrsm(1.0, Lf, Ab, lower=1, overwrite_b=1)  # A_b = L^-1 K_b in place
        dsyrk(1.0, Ab, beta=1.0, c=C, trans=0, overwrite_c=1)
        Ay += Ab @ y[j0:j1]
    AAT = kern.symmetric_from_triangle(C)  # C is zero below its diagonal
    return Ay, np.ascontiguousarray(AAT), (Kuf if Kuf is not None else K), A


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


def rbf_grad(W, a, Kuf, Xs, y, L, A=None):
    """``(GX [m, d], g1 [m], sq [d], sum G)`` for ``G = dF/dKuf * dK/du = -(R + a y' / 2) * Kuf`` [m, n] with
    ``R = L^-T W L^-1 Kuf``: ``GX = G x~``, ``g1 = G 1`` and ``sq = 1' G x~^2`` (what ``kernels._vjp_sums`` turns
    into the lengthscale and ``Z`` gradients). ``W`` [m, m] symmetric (``dF/dAAT`` of the whitened statistics),
    ``a`` [m]; ``Kuf`` [m, n] (Fortran order, else copied to it); ``Xs`` [n, d], ``y`` [n]; ``L`` [m, m] the
    lower Cholesky factor of ``Kuu`` the statistics were made with; ``A``: None, or the ``L^-1 Kuf`` [m, n] that
    :func:`rbf_stats` kept (the whitened form only).

    Whitened form: ``R_b = M A_b`` with ``M = L^-T W`` formed once (one m x m triangular solve) and
    ``A_b = L^-1 K_b`` (a triangular solve per block, or the block of the given ``A``). Its rounding grows with
    ``cond(L)`` like that of two solves per block: on a record with Z = X and ``cond_1(L)`` up to 5e7, the
    gradient's contractions ``sum R * Kuf`` lie within 1e-9 relative of an extended-precision reference, where
    ``L^-T W L^-1`` formed explicitly is off by 10 % (the CO2 record's hundreds of nats, issue 37;
    ``tests/tasks/gp/test_plain_form.py``). Plain form (:func:`plain_inverse`): ``P = L^-T W L^-1`` formed once
    and ``R_b = P K_b``, one GEMM per block with nothing else.

    The squares enter only through ``sq``, a sum over the inducing inputs too, so each block's product is
    ``[x~_b, 1]' R'`` (``d + 1`` rows) and ``sq`` takes the column sums ``R' 1`` (a GEMV) of each block
    times ``x~_b^2``: 11 rows of GEMM and a GEMV instead of 21 rows at d = 10 (2.0 against 2.9 ms a
    chunk at m = 256, n_c = 10,000 on the benchmarks' Zen 4)."""
    adjoint = _kernels()["_adjoint_block"]
    Linv = plain_inverse(L)
    K = as_fortran(Kuf)
    KT = K.T  # [n, m] C order
    n, m = KT.shape
    d = Xs.shape[1]
    W = np.ascontiguousarray(W, dtype=np.float64)
    ha = 0.5 * np.asarray(a, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.float64)
    AugT = np.empty((d + 1, n))  # [x~, 1]'
    AugT[:d] = Xs.T
    AugT[d] = 1.0
    ones = np.ones(m)
    col = np.empty(n)  # column sums of G
    Tt = np.zeros((d + 1, m))  # [G x~, G 1]'
    scratch = np.empty(min(BLOCK, n) * m)
    Ttb = np.empty_like(Tt)
    if Linv is not None:
        Mt = sandwich(Linv, W)  # plain form: P = L^-T W L^-1 [m, m], symmetric
        A = None
    else:
        Lf = np.asfortranarray(L, dtype=np.float64)
        Mt = np.ascontiguousarray(dtrsm(1.0, Lf, np.asfortranarray(W), lower=1, trans_a=1).T)  # M' = (L^-T W)'
        if A is not None:
            A = as_fortran(A)
            if A.shape != K.shape:
                raise ValueError(f"A must have Kuf's shape {K.shape}; got {A.shape}")
        else:
            whitened = np.empty((m, min(BLOCK, n)), order="F")
    for j0, j1 in block_bounds(n):
        RT = scratch[: (j1 - j0) * m].reshape(j1 - j0, m)
        if Linv is not None:
            np.matmul(KT[j0:j1], Mt, out=RT)  # [b, m]  (P K_b)' as P = P'
        else:
            if A is not None:
                Ab = A[:, j0:j1]  # [m, b] Fortran
            else:
                Ab = whitened[:, : j1 - j0]
                Ab[...] = K[:, j0:j1]
                dtrsm(1.0, Lf, Ab, lower=1, overwrite_b=1)  # L^-1 K_b
            np.matmul(Ab.T, Mt, out=RT)  # [b, m]  (M A_b)' = A_b' M'
        adjoint(RT, KT[j0:j1], ha, y[j0:j1])
        np.matmul(AugT[:, j0:j1], RT, out=Ttb)  # [d + 1, m]
        Tt += Ttb
        np.matmul(RT, ones, out=col[j0:j1])
    sq = col @ (Xs * Xs)  # [d]
    return np.ascontiguousarray(Tt[:d].T), Tt[d].copy(), sq, math.fsum(Tt[d])
