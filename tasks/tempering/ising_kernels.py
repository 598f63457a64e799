"""Checkerboard sweeps of the 2D Ising model (ferromagnet or +-J spin glass), CPU and GPU.

This is the explorer kernel of parallel tempering on Ising models: ``R`` replicas of one
``L x L`` periodic lattice (``L`` even), each at its own inverse temperature, are swept in one
call. It is the hot loop of the project, so it comes as a numba kernel for the CPU and a CuPy
``RawKernel`` for the GPU behind the single function :func:`ising_sweep`; both draw every random
number from Philox4x32-10 keyed by the site's identity and use the same integer thresholds, so
they produce the same bits.

Model (names as in the paper; code names in brackets)
-----------------------------------------------------
Spins ``s_i in {-1, +1}`` [``spins``, int8], couplings ``J_ij = J_abs * bond_ij`` with
``bond_ij in {-1, +1}`` [``bonds_h``: bond between ``(i, j)`` and ``(i, (j+1) % L)``;
``bonds_v``: bond between ``(i, j)`` and ``((i+1) % L, j)``], external field ``h``::

    E(s) = - sum_<ij> J_abs * bond_ij * s_i * s_j  -  h * sum_i s_i

Site update rule (both methods)
-------------------------------
For a site with spin ``s`` let ``n`` be the number of its four neighbours ``k`` with
``bond_k * s_k > 0``, so its local field is ``sum_k J_k s_k = J_abs * (2n - 4)``. With ``u`` a
uniform uint32 the new spin is ``+1 if u < thr[r, n, (s + 1) // 2] else -1`` where
``thr = ising_thresholds(...)`` (an int64 table in ``[0, 2**32]``, computed once on the host).

Sweep and random numbers
------------------------
A sweep updates all sites of colour 0 (``(i + j) % 2 == 0``) from the current state, then all
sites of colour 1. For global sweep ``t``, colour ``c``, row ``i`` and the site ``(i, j)`` of
colour ``c`` let ``q = j // 2`` and ``G = (L // 2 + 3) // 4``; its ``u`` is word ``q & 3`` of::

    philox4x32_10(counter=(i * G + (q >> 2), 2 * t + c, replica_id & 0xffffffff, chain & 0xffffffff),
                  key=(key[0], key[1]))

(counter words taken mod 2**32). Same-colour sites do not interact, so the result does not
depend on the order in which sites, rows or replicas are processed, nor on how replicas are
split between calls: it depends only on ``(key, chain, replica_ids, sweep0 + t)``.

CPU kernel (numba): the lattice is copied into padded per-colour planes ``[R, 2, L, L//2 + 2]``
(colour, row, ``1 + q``, with one halo column on each side), where every neighbour is a
unit-stride load. Per chunk of rows, a loop over counters that vectorises fills a buffer with
the rows' Philox words, then a site loop that vectorises in byte and 32-bit lanes updates them:
it compares ``u`` with the thresholds clipped to uint32, which agrees with the int64 rule for
every ``u`` except ``2**32 - 1``, so a chunk that draws that value is done by an exact int64 loop
instead. The copies in and out cost ~0.1-0.3 ns per site, a fraction of one sweep. Threads run
over replicas when there are enough, else over chunks of rows within each colour.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from tasks import backend
from tasks.philox import numba_philox4x32

__all__ = [
    "METHODS",
    "ising_thresholds",
    "ising_sweep",
    "ising_energy_magnetisation",
    "numpy_checkerboard_sweep",
]

METHODS = ("heatbath", "metropolis")

_TWO32 = 1 << 32
_MASK32 = 0xFFFFFFFF


# --------------------------------------------------------------------------------------------
# Thresholds (host)
# --------------------------------------------------------------------------------------------


def ising_thresholds(betas_eff, J_abs: float, h: float, method: str) -> np.ndarray:
    """Integer acceptance thresholds of the site update, one table per replica.

    Parameters
    ----------
    betas_eff : array_like of float, shape [R]
        Inverse temperature of each replica (finite).
    J_abs : float
        Coupling magnitude ``|J|``.
    h : float
        External field.
    method : {"heatbath", "metropolis"}

    Returns
    -------
    numpy.ndarray of int64, shape [R, 5, 2]
        ``thr[r, n, b]`` for ``n`` = number of satisfied neighbour bonds (0..4) and
        ``b = (s + 1) // 2`` (0 for ``s = -1``, 1 for ``s = +1``); the new spin is ``+1`` iff
        ``u < thr`` for a uniform uint32 ``u``. Values lie in ``[0, 2**32]``.

    With local field ``x = J_abs * (2n - 4) + h``:

    * heatbath: ``P(+1) = 1 / (1 + exp(-2 beta x))`` for either ``s``; ``thr = rint(P(+1) * 2**32)``.
    * metropolis: flip probability ``a = min(1, exp(-beta dE))``, ``dE = 2 s x``;
      ``thr = 2**32 - rint(a * 2**32)`` for ``s = +1`` (stay up with probability ``1 - a``) and
      ``thr = rint(a * 2**32)`` for ``s = -1``. (Complementing the rounded ``a`` rather than
      rounding ``1 - a`` keeps tiny flip probabilities exact to 2**-32.)
    * ``beta == 0`` exactly: ``thr = 2**31`` for both methods -- an independent fair draw per site.
      (Metropolis at ``beta = 0`` accepts every flip, which would flip every spin deterministically.)

    ``rint`` is float64 round-half-to-even of a number already scaled by ``2**32`` (an exact
    power-of-two scaling), i.e. probabilities are rounded to the nearest multiple of ``2**-32``.
    Everything is computed in float64 on the host, so CPU and GPU kernels get identical tables.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    betas = np.asarray(betas_eff, dtype=np.float64)
    if betas.ndim != 1:
        raise ValueError(f"betas_eff must have shape [R], got {betas.shape}")
    if not np.all(np.isfinite(betas)):
        raise ValueError("betas_eff must be finite")
    J_abs = float(J_abs)
    h = float(h)
    if not (math.isfinite(J_abs) and math.isfinite(h)):
        raise ValueError(f"J_abs and h must be finite, got J_abs={J_abs}, h={h}")

    n = np.arange(5, dtype=np.float64)
    x = J_abs * (2.0 * n - 4.0) + h  # [5] local field incl. h
    beta = betas[:, None, None]  # [R, 1, 1]
    s = np.array([-1.0, 1.0])  # [2] indexed by b = (s + 1) // 2
    scale = float(_TWO32)
    if method == "heatbath":
        z = 2.0 * beta * x[None, :, None]  # [R, 5, 1]
        # Numerically stable logistic: 1/(1+exp(-z)) = exp(z)/(1+exp(z)).
        ez = np.exp(-np.abs(z))
        p_plus = np.where(z >= 0, 1.0 / (1.0 + ez), ez / (1.0 + ez))
        thr = np.rint(p_plus * scale) * np.ones((1, 1, 2))  # [R, 5, 2]
    else:
        dE = 2.0 * s[None, None, :] * x[None, :, None]  # [1, 5, 2]
        a = np.exp(np.minimum(0.0, -beta * dE))  # [R, 5, 2] in (0, 1]
        a_int = np.rint(a * scale)
        thr = np.where(s[None, None, :] > 0, scale - a_int, a_int)
    thr = np.where(beta == 0.0, float(1 << 31), thr)
    out = thr.astype(np.int64)
    # Exact: every value is an integer in [0, 2**32] held in float64.
    return np.ascontiguousarray(np.broadcast_to(out, (betas.shape[0], 5, 2)))


# --------------------------------------------------------------------------------------------
# Energy, magnetisation
# --------------------------------------------------------------------------------------------


def ising_energy_magnetisation(spins, bonds_h, bonds_v, J_abs: float, h: float):
    """Energy and magnetisation of each replica.

    Parameters
    ----------
    spins : numpy or cupy int8 array, shape [R, L, L], values +-1
    bonds_h, bonds_v : int8 arrays, shape [L, L], values +-1 (same array module as ``spins``,
        or host arrays, which are copied over)
    J_abs, h : float

    Returns
    -------
    (E, M) : host numpy arrays, float64 [R] and int64 [R]
        ``E = -J_abs * sum_bonds bond * s_i * s_j - h * M`` and ``M = sum_i s_i``.
    """
    xp = backend.array_module(spins)
    if spins.ndim != 3:
        raise ValueError(f"spins must have shape [R, L, L], got {spins.shape}")
    if xp is np:
        # numba: integer sums without [R, L, L] int64 temporaries (which cost more than the sweeps).
        bond_sum, M = _energy_kernel()(np.ascontiguousarray(spins), np.ascontiguousarray(bonds_h, dtype=np.int8),
                                       np.ascontiguousarray(bonds_v, dtype=np.int8))
        E = -float(J_abs) * bond_sum.astype(np.float64) - float(h) * M.astype(np.float64)
        return E, M
    s = spins.astype(xp.int64)  # [R, L, L]
    bh = xp.asarray(bonds_h).astype(xp.int64)  # [L, L]
    bv = xp.asarray(bonds_v).astype(xp.int64)  # [L, L]
    bond_sum = (bh[None] * s * xp.roll(s, -1, axis=2)).sum(axis=(1, 2)) + (
        bv[None] * s * xp.roll(s, -1, axis=1)
    ).sum(axis=(1, 2))  # [R] int64
    M = s.sum(axis=(1, 2))  # [R] int64
    E = -float(J_abs) * bond_sum.astype(xp.float64) - float(h) * M.astype(xp.float64)
    return backend.to_numpy(E).astype(np.float64), backend.to_numpy(M).astype(np.int64)


_energy_compiled = None


def _energy_kernel():
    """numba kernel: (spins int8 [R,L,L], bonds_h, bonds_v int8 [L,L]) -> (bond_sum int64 [R], M int64 [R]),
    with bond_sum = sum_bonds bond * s_i * s_j (parallel over replicas)."""
    global _energy_compiled
    if _energy_compiled is None:
        nb = backend.numba()

        @nb.njit(parallel=True, cache=True)
        def energy(spins, bh, bv):  # pragma: no cover - compiled
            R, L, _ = spins.shape
            bond_sum = np.zeros(R, dtype=np.int64)
            mag = np.zeros(R, dtype=np.int64)
            for r in nb.prange(R):
                acc = 0
                m = 0
                for i in range(L):
                    ip = i + 1 if i + 1 < L else 0
                    for j in range(L):
                        jp = j + 1 if j + 1 < L else 0
                        si = np.int64(spins[r, i, j])
                        acc += si * (np.int64(bh[i, j]) * spins[r, i, jp] + np.int64(bv[i, j]) * spins[r, ip, j])
                        m += si
                bond_sum[r] = acc
                mag[r] = m
            return bond_sum, mag

        _energy_compiled = energy
    return _energy_compiled


# --------------------------------------------------------------------------------------------
# The NumPy peer (benchmark baseline)
# --------------------------------------------------------------------------------------------


def numpy_checkerboard_sweep(spins, J_abs: float, h: float, beta: float, rng, n_sweeps: int):
    """Metropolis checkerboard sweeps of a ferromagnet, written the obvious NumPy way.

    The peer that ``benchmarks/tempering.py`` measures :func:`ising_sweep` against: per half
    sweep, neighbour sums with ``np.roll``, one ``rng.random`` draw per site of the whole
    lattice, ``exp`` acceptance, ``np.where``. It samples the same distribution as
    ``ising_sweep`` with Metropolis thresholds and all bonds +1, but not the same bits.

    Parameters
    ----------
    spins : numpy int8 array, shape [R, L, L] (or [L, L]), values +-1; updated in place.
    J_abs, h, beta : float
    rng : numpy.random.Generator
    n_sweeps : int

    Returns
    -------
    spins (the same array).
    """
    L = spins.shape[-1]
    ii, jj = np.indices((L, L))
    colours = [((ii + jj) % 2) == c for c in (0, 1)]  # [L, L] bool each
    for _ in range(n_sweeps):
        for mask in colours:
            nbr = (
                np.roll(spins, 1, axis=-1)
                + np.roll(spins, -1, axis=-1)
                + np.roll(spins, 1, axis=-2)
                + np.roll(spins, -1, axis=-2)
            )
            dE = 2.0 * spins * (J_abs * nbr + h)
            accept = rng.random(spins.shape) < np.exp(-beta * dE)
            spins[...] = np.where(mask & accept, -spins, spins)
    return spins


# --------------------------------------------------------------------------------------------
# numba kernel (CPU)
# --------------------------------------------------------------------------------------------

# Set by _numba_kernels() (numba is imported lazily): the numba module, the Philox device
# function, and the kernels that other kernels call.
_nb = None
_philox = None
_fill_uniforms = None
_update_rows_fast = None
_update_rows_exact = None
_sweep_chunk = None


@functools.lru_cache(maxsize=None)
def _numba_kernels():
    """Compile (lazily, once per process; numba's on-disk cache is shared between processes)
    the CPU kernels. Returns a dict of njit functions.

    Internal layout (see the module docstring): spins live in padded planes
    ``S[r, c, i, 1 + q]`` (int8 [R, 2, L, H + 2], H = L // 2) with halo columns
    ``S[..., 0] = S[..., H]`` and ``S[..., H + 1] = S[..., 1]`` so that the horizontal neighbour
    that wraps around needs no special case; bonds in ``B[c, i, k, q]`` (int8 [2, L, 4, H], see
    ``plane_bonds``).
    """
    # The kernels are bound to module globals, not closure cells: numba's on-disk cache key
    # hashes a function's closure variables, and a jitted callee pickles differently in every
    # process, which would make every process miss the cache and append a new entry.
    global _nb, _philox, _fill_uniforms, _update_rows_fast, _update_rows_exact, _sweep_chunk
    _nb = backend.numba()
    _philox = numba_philox4x32()

    @_nb.njit(cache=True, parallel=True, fastmath=False, nogil=True)
    def to_planes(spins, S):
        """spins int8 [R, L, L] -> S int8 [R, 2, L, H+2] (with halos); returns the number of
        (row, q) pairs holding a value other than -1/+1."""
        R = spins.shape[0]
        L = spins.shape[1]
        H = L // 2
        bad = 0
        for ri in _nb.prange(R * L):
            r = ri // L
            i = ri - r * L
            row = spins[r, i]
            # colour 0 sits at j = 2q + (i & 1), colour 1 at the other parity
            ev = S[r, 0, i] if (i & 1) == 0 else S[r, 1, i]  # the colour at even j
            od = S[r, 1, i] if (i & 1) == 0 else S[r, 0, i]
            nbad = np.int32(0)
            for q in range(H):  # constant offsets: an interleaved load the vectoriser handles
                a = row[2 * q]
                b = row[2 * q + 1]
                ev[q + 1] = a
                od[q + 1] = b
                nbad = np.int32(nbad + (((a != 1) & (a != -1)) | ((b != 1) & (b != -1))))
            ev[0] = ev[H]
            ev[H + 1] = ev[1]
            od[0] = od[H]
            od[H + 1] = od[1]
            bad += nbad
        return bad

    @_nb.njit(cache=True, parallel=True, fastmath=False, nogil=True)
    def from_planes(S, spins):
        """Inverse of to_planes: S int8 [R, 2, L, H+2] -> spins int8 [R, L, L]."""
        R = spins.shape[0]
        L = spins.shape[1]
        H = L // 2
        for ri in _nb.prange(R * L):
            r = ri // L
            i = ri - r * L
            row = spins[r, i]
            ev = S[r, 0, i] if (i & 1) == 0 else S[r, 1, i]
            od = S[r, 1, i] if (i & 1) == 0 else S[r, 0, i]
            for q in range(H):
                row[2 * q] = ev[q + 1]
                row[2 * q + 1] = od[q + 1]

    @_nb.njit(cache=True, parallel=True, fastmath=False, nogil=True)
    def plane_bonds(bonds_h, bonds_v, B):
        """Bonds in the plane layout: bonds_h, bonds_v int8 [L, L] -> B int8 [2, L, 4, H];
        returns the number of bonds that are not -1/+1.

        ``B[c, i, k, q]`` is bond k of site ``(i, j = 2q + p)``, ``p = (i + c) & 1``, with k = 0:
        up (to ``(i-1, j)``), 1: down (to ``(i+1, j)``), 2: the horizontal neighbour found at the
        same ``q`` in the other colour's row (``(i, j+1)`` if ``p == 0`` else ``(i, j-1)``), 3:
        the one at the "side" index (``q-1`` if ``p == 0`` else ``q+1``). Four bytes per site
        rather than four bits: the kernel's equality tests then stay in byte lanes, which
        measured faster than unpacking bits.
        """
        L = bonds_h.shape[0]
        H = L // 2
        bad = 0
        for ci in _nb.prange(2 * L):
            c = ci // L
            i = ci - c * L
            p = (i + c) & 1
            im = i - 1 if i > 0 else L - 1
            nbad = 0
            for q in range(H):
                j = 2 * q + p
                jm = j - 1 if j > 0 else L - 1
                right = bonds_h[i, j]
                left = bonds_h[i, jm]
                B[c, i, 0, q] = bonds_v[im, j]
                B[c, i, 1, q] = bonds_v[i, j]
                B[c, i, 2, q] = right if p == 0 else left
                B[c, i, 3, q] = left if p == 0 else right
                nbad += (right * right != 1) + (bonds_v[i, j] * bonds_v[i, j] != 1)
            bad += nbad
        return bad

    @_nb.njit(cache=True, fastmath=False, nogil=True)
    def _fill_uniforms(ubuf, m0, m1, ctr1, ctr2, ctr3, k0, k1, u_special):
        """Philox words of counters (m, ctr1, ctr2, ctr3), m in [m0, m1), into ubuf.

        ubuf uint32 [>= 4 (m1 - m0)]: ``ubuf[4 (m - m0) + w]`` = word w. Vectorises over m.
        Returns True iff some word is >= u_special (uint64).
        """
        big = False
        for m in range(m0, m1):
            x0, x1, x2, x3 = _philox(m, ctr1, ctr2, ctr3, k0, k1)
            o = 4 * (m - m0)
            ubuf[o] = np.uint32(x0)
            ubuf[o + 1] = np.uint32(x1)
            ubuf[o + 2] = np.uint32(x2)
            ubuf[o + 3] = np.uint32(x3)
            big |= (x0 >= u_special) | (x1 >= u_special) | (x2 >= u_special) | (x3 >= u_special)
        return big

    @_nb.njit(cache=True, fastmath=False, nogil=True)
    def _update_rows_fast(Sm, So, Bc, ubuf, X, c, i0, i1):
        """Update rows i0..i1-1 of colour c; returns #changed spins.

        Sm, So int8 [L, H+2]: padded planes of colour c (updated) and 1-c; Bc int8 [L, 4, H];
        ubuf uint32 [(i1-i0) * 4G]: the rows' Philox words; X uint32 [10]: thresholds clipped
        to 2**32 - 1. ``u < X`` equals the spec's ``u < thr`` for every u < 2**32 - 1; callers
        route chunks containing u == 2**32 - 1 to update_rows_exact.

        The loop is written for the auto-vectoriser: the number n of satisfied bonds is
        built from the four equality bits with adder logic, the threshold is picked by a tree
        of selects on (s, n bits), all in <= 32-bit lanes.
        """
        L = Sm.shape[0]
        H = Sm.shape[1] - 2
        G4 = 4 * ((H + 3) >> 2)
        x0 = X[0]
        x1 = X[1]
        x2 = X[2]
        x3 = X[3]
        x4 = X[4]
        x5 = X[5]
        x6 = X[6]
        x7 = X[7]
        x8 = X[8]
        x9 = X[9]
        cnt = 0
        for i in range(i0, i1):
            o = 0 if ((i + c) & 1) == 0 else 2  # side neighbour: q-1 (p == 0) or q+1 (p == 1)
            im = i - 1 if i > 0 else L - 1
            ip = i + 1 if i < L - 1 else 0
            ub = (i - i0) * G4
            ur = ubuf[ub:ub + H]
            me = Sm[i, 1:H + 1]
            oth = So[i, 1:H + 1]
            side = So[i, o:o + H]
            up = So[im, 1:H + 1]
            dn = So[ip, 1:H + 1]
            bu = Bc[i, 0]
            bd = Bc[i, 1]
            bs = Bc[i, 2]
            bx = Bc[i, 3]
            rc = np.int32(0)
            for q in range(H):
                s = me[q]
                e0 = bu[q] == up[q]  # bond satisfied: bond_k * s_k > 0
                e1 = bd[q] == dn[q]
                e2 = bs[q] == oth[q]
                e3 = bx[q] == side[q]
                # n = e0 + e1 + e2 + e3 = n0 + 2 n1 + 4 n2
                a01 = e0 ^ e1
                b01 = e0 & e1
                a23 = e2 ^ e3
                b23 = e2 & e3
                n0 = a01 ^ a23
                n1 = (a01 & a23) ^ b01 ^ b23
                n2 = b01 & b23
                sp = s > 0
                t0 = x1 if sp else x0
                t1 = x3 if sp else x2
                t2 = x5 if sp else x4
                t3 = x7 if sp else x6
                t4 = x9 if sp else x8
                t01 = t1 if n0 else t0
                t23 = t3 if n0 else t2
                t03 = t23 if n1 else t01
                t = t4 if n2 else t03
                new = np.int8(1) if ur[q] < t else np.int8(-1)
                rc = np.int32(rc + (new != s))  # int32 accumulator keeps the loop in 32-bit lanes
                me[q] = new
            cnt += rc
            Sm[i, 0] = Sm[i, H]
            Sm[i, H + 1] = Sm[i, 1]
        return cnt

    @_nb.njit(cache=True, fastmath=False, nogil=True)
    def _update_rows_exact(Sm, So, Bc, ubuf, T, c, i0, i1):
        """Same as update_rows_fast with the spec's int64 comparison ``u < T[2n + (s+1)//2]``
        (T int64 [10]); a plain loop, used for the (rare) chunks that contain a large u."""
        L = Sm.shape[0]
        H = Sm.shape[1] - 2
        G4 = 4 * ((H + 3) >> 2)
        cnt = 0
        for i in range(i0, i1):
            o = 0 if ((i + c) & 1) == 0 else 2
            im = i - 1 if i > 0 else L - 1
            ip = i + 1 if i < L - 1 else 0
            ub = (i - i0) * G4
            for q in range(H):
                s = Sm[i, q + 1]
                n = (
                    (Bc[i, 0, q] == So[im, q + 1])
                    + (Bc[i, 1, q] == So[ip, q + 1])
                    + (Bc[i, 2, q] == So[i, q + 1])
                    + (Bc[i, 3, q] == So[i, q + o])
                )
                u = np.int64(ubuf[ub + q])
                new = np.int8(1) if u < T[2 * n + (1 if s > 0 else 0)] else np.int8(-1)
                cnt += new != s
                Sm[i, q + 1] = new
            Sm[i, 0] = Sm[i, H]
            Sm[i, H + 1] = Sm[i, 1]
        return cnt

    @_nb.njit(cache=True, fastmath=False, nogil=True)
    def _sweep_chunk(S, B, X, T, r, c, i0, i1, ubuf, ctr1, rid, chain, k0, k1, u_special):
        """Philox words for rows i0..i1-1 of colour c of replica r, then their updates."""
        H = S.shape[3] - 2
        G = (H + 3) >> 2
        big = _fill_uniforms(ubuf, i0 * G, i1 * G, ctr1, rid, chain, k0, k1, u_special)
        if big:
            return _update_rows_exact(S[r, c], S[r, 1 - c], B[c], ubuf, T[r], c, i0, i1)
        return _update_rows_fast(S[r, c], S[r, 1 - c], B[c], ubuf, X[r], c, i0, i1)

    @_nb.njit(cache=True, parallel=True, fastmath=False, nogil=True)
    def sweep_by_replica(S, B, X, T, k0, k1, rids, chain, sweep0, n_sweeps, rows_per_chunk, u_special, changed):
        """Parallel over replicas; each replica runs all its sweeps (no barrier needed)."""
        R = S.shape[0]
        L = S.shape[2]
        H = S.shape[3] - 2
        G = (H + 3) >> 2
        for r in _nb.prange(R):
            ubuf = np.empty(4 * G * rows_per_chunk, np.uint32)
            rid = rids[r]
            cnt = 0
            for t in range(n_sweeps):
                for c in range(2):
                    ctr1 = 2 * (sweep0 + t) + c
                    for i0 in range(0, L, rows_per_chunk):
                        i1 = min(i0 + rows_per_chunk, L)
                        cnt += _sweep_chunk(S, B, X, T, r, c, i0, i1, ubuf, ctr1, rid, chain, k0, k1, u_special)
            changed[r] = cnt

    @_nb.njit(cache=True, parallel=True, fastmath=False, nogil=True)
    def sweep_by_rows(S, B, X, T, k0, k1, rids, chain, sweep0, n_sweeps, rows_per_chunk, u_special, changed_blk):
        """Parallel over chunks of rows within each colour (for few, large replicas); one
        parallel region per colour of each sweep."""
        R = S.shape[0]
        L = S.shape[2]
        H = S.shape[3] - 2
        G = (H + 3) >> 2
        nbpr = (L + rows_per_chunk - 1) // rows_per_chunk
        for t in range(n_sweeps):
            for c in range(2):
                ctr1 = 2 * (sweep0 + t) + c
                for b in _nb.prange(R * nbpr):
                    r = b // nbpr
                    i0 = (b - r * nbpr) * rows_per_chunk
                    i1 = min(i0 + rows_per_chunk, L)
                    ubuf = np.empty(4 * G * rows_per_chunk, np.uint32)
                    changed_blk[b] += _sweep_chunk(
                        S, B, X, T, r, c, i0, i1, ubuf, ctr1, rids[r], chain, k0, k1, u_special
                    )

    return {
        "to_planes": to_planes,
        "plane_bonds": plane_bonds,
        "from_planes": from_planes,
        "sweep_by_replica": sweep_by_replica,
        "sweep_by_rows": sweep_by_rows,
        "fill_uniforms": _fill_uniforms,
        "update_rows_fast": _update_rows_fast,
        "update_rows_exact": _update_rows_exact,
    }


def _choose_by_replica(R: int, n_threads: int) -> bool:
    """Parallelise over replicas when that keeps all threads busy (<= 25% idle), else over rows."""
    if n_threads <= 1:
        return True
    if R < n_threads:
        return False
    waves = -(-R // n_threads)
    return (waves * n_threads - R) <= 0.25 * R


_U_MAX = _MASK32  # u values >= this go through the exact int64 path (see update_rows_fast)
_CHUNK_GROUPS = 1024  # Philox groups per chunk of rows: 16 KiB of uniforms, stays in L1


def _sweep_numba(spins, bonds_h, bonds_v, thr, key, replica_ids, chain, sweep0, n_sweeps,
                 mode=None, u_special=_U_MAX):
    """numba path of :func:`ising_sweep` (arguments already validated, host arrays).

    ``mode`` ("replica" | "rows" | None = automatic) and ``u_special`` (uniforms >= it send
    their chunk of rows through the exact path; the default is the only value the fast path
    needs) are for tests: every choice gives the same bits.
    """
    nb = backend.numba()
    k = _numba_kernels()
    R, L, _ = spins.shape
    H = L // 2
    G = (H + 3) // 4
    work = spins if spins.flags.c_contiguous else np.ascontiguousarray(spins)
    S = np.empty((R, 2, L, H + 2), dtype=np.int8)
    bad = k["to_planes"](work, S)
    if bad:
        raise ValueError(f"spins must contain only -1 and +1; {bad} pairs of sites hold other values")
    B = np.empty((2, L, 4, H), dtype=np.int8)
    if k["plane_bonds"](bonds_h, bonds_v, B):
        raise ValueError("bonds_h and bonds_v must contain only -1 and +1")
    T = np.ascontiguousarray(thr.reshape(R, 10), dtype=np.int64)
    X = np.minimum(T, _MASK32).astype(np.uint32)
    k0, k1 = int(key[0]), int(key[1])
    chain32 = int(chain) & _MASK32
    rids = np.ascontiguousarray(replica_ids, dtype=np.int64) & _MASK32
    rows_per_chunk = max(1, min(L, _CHUNK_GROUPS // G))
    us = np.uint64(u_special)
    if mode is None:
        mode = "replica" if _choose_by_replica(R, nb.get_num_threads()) else "rows"
    if mode == "replica":
        changed = np.zeros(R, dtype=np.int64)
        k["sweep_by_replica"](S, B, X, T, k0, k1, rids, chain32, int(sweep0), int(n_sweeps),
                              rows_per_chunk, us, changed)
    elif mode == "rows":
        # enough chunks for every thread: at least ~4 per thread in total
        want = 4 * nb.get_num_threads()
        per_rep = -(-want // R)
        rows_per_chunk = max(1, min(rows_per_chunk, L // per_rep if per_rep <= L else 1))
        nbpr = -(-L // rows_per_chunk)
        changed_blk = np.zeros(R * nbpr, dtype=np.int64)
        k["sweep_by_rows"](S, B, X, T, k0, k1, rids, chain32, int(sweep0), int(n_sweeps),
                           rows_per_chunk, us, changed_blk)
        changed = changed_blk.reshape(R, nbpr).sum(axis=1)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    k["from_planes"](S, work)
    if work is not spins:
        spins[...] = work
    return changed


# --------------------------------------------------------------------------------------------
# CuPy kernel (GPU)
# --------------------------------------------------------------------------------------------

_CUDA_SOURCE = r"""
typedef unsigned int pgm_u32;
typedef unsigned long long pgm_u64;
typedef long long pgm_i64;

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* Philox4x32-10 (Random123); c[4] in: counter, out: the four random words. */
__device__ __forceinline__ void pgm_philox4x32_10(pgm_u32 c[4], pgm_u32 k0, pgm_u32 k1)
{
    #pragma unroll
    for (int rnd = 0; rnd < 10; ++rnd) {
        if (rnd > 0) { k0 += PHILOX_W0; k1 += PHILOX_W1; }
        const pgm_u32 hi0 = __umulhi(PHILOX_M0, c[0]);
        const pgm_u32 lo0 = PHILOX_M0 * c[0];
        const pgm_u32 hi1 = __umulhi(PHILOX_M1, c[2]);
        const pgm_u32 lo1 = PHILOX_M1 * c[2];
        const pgm_u32 n0 = hi1 ^ c[1] ^ k0;
        const pgm_u32 n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
    }
}

/* One colour of one checkerboard sweep. One thread per (replica r, row i, group g of 4 sites
   of this colour in row i): grid.y runs over replicas r0 .. r0 + gridDim.y - 1, grid.x * block.x
   over the L * G (row, group) pairs of a replica, G = (L/2 + 3) / 4.
   spins  int8  [R, L, L]  (in place)
   bonds_h, bonds_v int8 [L, L]
   thr    int64 [R, 10]    (index 2n + (s+1)/2)
   rid32  uint32 [R]       (replica_id & 0xffffffff)
   counts uint32 [R, L, G] (per-thread count of changed spins, accumulated over launches) */
extern "C" __global__ void pgm_ising_colour(
    signed char* __restrict__ spins,
    const signed char* __restrict__ bonds_h,
    const signed char* __restrict__ bonds_v,
    const pgm_i64* __restrict__ thr,
    const pgm_u32* __restrict__ rid32,
    pgm_u32* __restrict__ counts,
    const int r0, const int L, const int colour,
    const pgm_u32 ctr1, const pgm_u32 chain32, const pgm_u32 key0, const pgm_u32 key1)
{
    const int H = L >> 1;
    const int G = (H + 3) >> 2;
    const int tx = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (tx >= L * G) return;
    const int r = r0 + (int)blockIdx.y;
    const int g = tx % G;
    const int i = tx / G;
    const pgm_i64 tid = (pgm_i64)r * (pgm_i64)(L * G) + tx;

    pgm_u32 u[4];
    u[0] = (pgm_u32)i * (pgm_u32)G + (pgm_u32)g;
    u[1] = ctr1;
    u[2] = rid32[r];
    u[3] = chain32;
    pgm_philox4x32_10(u, key0, key1);

    signed char* S = spins + (pgm_i64)r * L * L;
    const pgm_i64* T = thr + (pgm_i64)r * 10;
    const int p = (i + colour) & 1;
    const int im = (i == 0) ? L - 1 : i - 1;
    const int ip = (i == L - 1) ? 0 : i + 1;
    const signed char* row = S + (pgm_i64)i * L;
    const signed char* rowm = S + (pgm_i64)im * L;
    const signed char* rowp = S + (pgm_i64)ip * L;
    const signed char* bh = bonds_h + (pgm_i64)i * L;
    const signed char* bvd = bonds_v + (pgm_i64)i * L;
    const signed char* bvu = bonds_v + (pgm_i64)im * L;

    pgm_u32 cnt = 0;
    #pragma unroll
    for (int w = 0; w < 4; ++w) {
        const int q = 4 * g + w;
        if (q < H) {
            const int j = 2 * q + p;
            const int jm = (j == 0) ? L - 1 : j - 1;
            const int jp = (j == L - 1) ? 0 : j + 1;
            const int s = row[j];
            const int f = bh[j] * row[jp] + bh[jm] * row[jm] + bvd[j] * rowp[j] + bvu[j] * rowm[j];
            const pgm_i64 t = T[f + 4 + ((s + 1) >> 1)];
            const int ns = ((pgm_i64)u[w] < t) ? 1 : -1;
            cnt += (ns != s);
            S[(pgm_i64)i * L + j] = (signed char)ns;
        }
    }
    if (cnt) counts[tid] += cnt;
}
"""

_CUDA_KERNEL_NAME = "pgm_ising_colour"
_CUDA_BLOCK = 256
_CUDA_MAX_GRID_Y = 65535  # replicas per launch (CUDA's limit on gridDim.y)
# counts are uint32 and grow by at most 4 per launch; flush them to int64 well before overflow
_CUDA_MAX_SWEEPS_PER_FLUSH = 1 << 28


@functools.lru_cache(maxsize=None)
def _cupy_kernel():
    """Compile (lazily, once per process; CuPy caches the binary on disk) the GPU kernel."""
    cp = backend.cupy()
    return cp.RawKernel(_CUDA_SOURCE, _CUDA_KERNEL_NAME, options=("-std=c++11",))


def _sweep_cuda(spins, bonds_h, bonds_v, thr, key, replica_ids, chain, sweep0, n_sweeps, xp, launch):
    """Host side of the GPU path: prepare device arrays, launch ``pgm_ising_colour`` once per
    colour of each sweep, reduce the per-thread change counts.

    ``xp`` is the array module of ``spins`` and ``launch(grid, block, args)`` runs the kernel
    (a CuPy ``RawKernel``; the tests pass NumPy and the same CUDA source compiled for the host
    CPU, so this code is exercised without a GPU too). Returns int64 [R] on the host.
    """
    R, L, _ = spins.shape
    G = (L // 2 + 3) // 4
    work = spins if spins.flags.c_contiguous else xp.ascontiguousarray(spins)
    if bool(((work != 1) & (work != -1)).any()):
        raise ValueError("spins must contain only -1 and +1")
    bh = xp.ascontiguousarray(xp.asarray(bonds_h, dtype=xp.int8))
    bv = xp.ascontiguousarray(xp.asarray(bonds_v, dtype=xp.int8))
    if bool((((bh != 1) & (bh != -1)) | ((bv != 1) & (bv != -1))).any()):
        raise ValueError("bonds_h and bonds_v must contain only -1 and +1")
    thr_d = xp.ascontiguousarray(xp.asarray(thr, dtype=xp.int64).reshape(R, 10))
    rid32 = xp.asarray((np.asarray(backend.to_numpy(replica_ids), dtype=np.int64) & _MASK32).astype(np.uint32))
    counts = xp.zeros(R * L * G, dtype=xp.uint32)  # [R, L, G] per-thread counts
    changed = np.zeros(R, dtype=np.int64)
    block = (_CUDA_BLOCK, 1)
    gx = (L * G + _CUDA_BLOCK - 1) // _CUDA_BLOCK
    batches = [(r0, min(R - r0, _CUDA_MAX_GRID_Y)) for r0 in range(0, R, _CUDA_MAX_GRID_Y)]
    k0, k1 = np.uint32(int(key[0])), np.uint32(int(key[1]))
    chain32 = np.uint32(int(chain) & _MASK32)
    pending = 0
    for t_local in range(n_sweeps):
        t = int(sweep0) + t_local
        for c in (0, 1):
            ctr1 = np.uint32((2 * t + c) & _MASK32)
            for r0, nr in batches:
                launch((gx, nr), block, (work, bh, bv, thr_d, rid32, counts,
                                         np.int32(r0), np.int32(L), np.int32(c), ctr1, chain32, k0, k1))
        pending += 1
        if pending == _CUDA_MAX_SWEEPS_PER_FLUSH:
            changed += backend.to_numpy(counts.reshape(R, -1).sum(axis=1, dtype=xp.int64))
            counts.fill(0)
            pending = 0
    changed += backend.to_numpy(counts.reshape(R, -1).sum(axis=1, dtype=xp.int64))
    if work is not spins:
        spins[...] = work
    return changed


def _sweep_cupy(spins, bonds_h, bonds_v, thr, key, replica_ids, chain, sweep0, n_sweeps):
    """GPU path of :func:`ising_sweep` (``spins`` a CuPy array)."""
    cp = backend.cupy()
    with cp.cuda.Device(spins.device.id):
        return _sweep_cuda(spins, bonds_h, bonds_v, thr, key, replica_ids, chain, sweep0,
                           n_sweeps, cp, _cupy_kernel())


# --------------------------------------------------------------------------------------------
# Dispatcher
# --------------------------------------------------------------------------------------------


def _validate_sweep_args(spins, bonds_h, bonds_v, thr, key, replica_ids, sweep0, n_sweeps):
    if spins.ndim != 3 or spins.shape[1] != spins.shape[2]:
        raise ValueError(f"spins must have shape [R, L, L], got {spins.shape}")
    if spins.dtype != np.int8:
        raise TypeError(f"spins must be int8, got {spins.dtype}")
    if not getattr(spins.flags, "writeable", True):  # (CuPy arrays have no such flag)
        raise ValueError("spins must be writeable: ising_sweep updates it in place")
    R, L, _ = spins.shape
    if L < 2 or L % 2:
        raise ValueError(f"lattice side L must be even and >= 2, got {L}")
    bonds = []
    for name, b in (("bonds_h", bonds_h), ("bonds_v", bonds_v)):
        b = np.asarray(backend.to_numpy(b))
        if b.shape != (L, L):
            raise ValueError(f"{name} must have shape [L, L] = [{L}, {L}], got {b.shape}")
        if b.dtype.kind not in "iu":
            raise TypeError(f"{name} must be an integer array (int8 +-1), got {b.dtype}")
        if b.dtype != np.int8 and not np.all((b == 1) | (b == -1)):  # int8 is checked by each path
            raise ValueError(f"{name} must contain only -1 and +1")
        bonds.append(np.ascontiguousarray(b, dtype=np.int8))
    thr_h = np.asarray(backend.to_numpy(thr))
    if thr_h.shape != (R, 5, 2):
        raise ValueError(f"thr must have shape [R, 5, 2] = [{R}, 5, 2], got {thr_h.shape}")
    if thr_h.dtype != np.int64:
        raise TypeError(f"thr must be int64 (from ising_thresholds), got {thr_h.dtype}")
    if thr_h.size and (thr_h.min() < 0 or thr_h.max() > _TWO32):
        raise ValueError("thr values must lie in [0, 2**32]")
    key_h = np.asarray(backend.to_numpy(key))
    if key_h.shape != (2,) or key_h.dtype.kind not in "iu":
        raise ValueError(f"key must be an integer array of shape [2], got {key_h.dtype} {key_h.shape}")
    if key_h.min() < 0 or key_h.max() > _MASK32:
        raise ValueError("key words must lie in [0, 2**32)")
    rid_h = np.asarray(backend.to_numpy(replica_ids))
    if rid_h.shape != (R,) or rid_h.dtype.kind not in "iu":
        raise ValueError(f"replica_ids must be an integer array of shape [R] = [{R}], got {rid_h.shape}")
    if int(sweep0) < 0 or int(n_sweeps) < 0:
        raise ValueError(f"sweep0 and n_sweeps must be >= 0, got {sweep0}, {n_sweeps}")
    return bonds[0], bonds[1], thr_h, key_h, rid_h


def ising_sweep(spins, bonds_h, bonds_v, thr, key, replica_ids, chain: int, sweep0: int, n_sweeps: int):
    """Run ``n_sweeps`` checkerboard sweeps of every replica, in place.

    Parameters
    ----------
    spins : int8 array [R, L, L], values +-1, numpy or cupy -- updated IN PLACE.
        Its array type picks the kernel: numpy -> numba (CPU, all ``numba.get_num_threads()``
        threads), cupy -> CUDA RawKernel. The other array arguments may live on either side.
    bonds_h, bonds_v : int8 [L, L], values +-1 (see the module docstring).
    thr : int64 [R, 5, 2], from :func:`ising_thresholds`.
    key : uint32 [2], Philox key.
    replica_ids : int64 [R], global replica identities (Philox counter word 2, mod 2**32).
    chain : int, chain identity (counter word 3, mod 2**32).
    sweep0 : int >= 0, global index of the first sweep (counter word 1 = 2*t + colour, mod 2**32).
    n_sweeps : int >= 0.

    Returns
    -------
    numpy.ndarray int64 [R] (host, for either backend)
        Number of site updates that changed the spin, per replica, over all ``n_sweeps``.

    The result (spins and counts) depends only on the arguments, not on the backend, thread
    count or how replicas are batched: both kernels implement the module-level spec bit for bit.
    """
    bh, bv, thr_h, key_h, rid_h = _validate_sweep_args(
        spins, bonds_h, bonds_v, thr, key, replica_ids, sweep0, n_sweeps
    )
    if spins.shape[0] == 0 or int(n_sweeps) == 0:
        return np.zeros(spins.shape[0], dtype=np.int64)
    if type(spins).__module__.startswith("cupy"):
        return _sweep_cupy(spins, bonds_h, bonds_v, thr, key_h, rid_h, chain, sweep0, int(n_sweeps))
    if not isinstance(spins, np.ndarray):
        raise TypeError(f"spins must be a numpy or cupy array, got {type(spins).__name__}")
    return _sweep_numba(spins, bh, bv, thr_h, key_h, rid_h, chain, sweep0, int(n_sweeps))
