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
colour ``c`` let ``q = j // 2`` (its index among the ``H = L // 2`` sites of its colour in the row),
``W = (H + 63) // 64`` (words of 64 sites per row and colour), ``w = q >> 6`` and ``b = q & 63``.
Block ``g`` (0..15) of word ``(i, w)`` is::

    philox4x32_10(counter=((i * W + w) * 16 + g, 2 * t + c, replica_id & 0xffffffff, chain & 0xffffffff),
                  key=(key[0], key[1]))

(counter words taken mod 2**32), and its *planes* ``2g`` and ``2g + 1`` are the 64-bit words
``x0 | x1 << 32`` and ``x2 | x3 << 32`` of its output words ``x0..x3``. The site's ``u`` is the
32-bit integer whose bit ``31 - k`` is bit ``b`` of plane ``k``: plane 0 holds the most significant
bit of the uniforms of all 64 sites of the word, plane 31 the least. Same-colour sites do not
interact, so the result does not depend on the order in which sites, rows or replicas are
processed, nor on how replicas are split between calls: it depends only on ``(key, chain,
replica_ids, sweep0 + t)``.

Why this layout (multi-spin coding): a kernel holding 64 sites per machine word compares all 64
uniforms with their thresholds bit-serially, most significant bit first, with a handful of bitwise
operations per plane, and a site is decided at the first plane where the bits of ``u`` and of its
threshold differ -- after two planes on average, so the first four blocks (eight planes) decide all
but about one site in 256 and the rest draw the next blocks only where needed. The rule is still
exactly ``u < thr`` for a uniform 32-bit ``u``; only which Philox bits make up ``u`` is defined so
that the bits a kernel needs first come first. (Changed once, in issue 18: ``u`` used to be word
``q & 3`` of the block with counter ``i * G + (q >> 2)``, ``G = (H + 3) // 4``; every sampled
trajectory changed then, the distribution did not.)

CPU kernel (numba, :mod:`~pgmflow.tasks.tempering.ising_cpu`): the lattice is packed into bit planes
per colour (64 sites per ``uint64``, halo rows above and below); per chunk of rows, a loop that
vectorises over words draws the first four Philox blocks of every word, a second one -- four words
(256 sites) per AVX2 register -- builds each site's class ``(n, s)`` from the neighbour bits with a
bit-sliced adder and runs the eight planes of the comparison, and the words with a site still
undecided (about one in six) are gathered and given further blocks, again in a loop that vectorises.
Threads run over replicas when there are enough, else over chunks of rows within each colour. The
GPU kernels (:mod:`~pgmflow.tasks.tempering.ising_cuda`) run on the int8 lattice, one thread per site
(``pgm_ising_sites``, the default: a word's Philox planes drawn into shared memory by 16 of its 64
threads) or one per word of 64 sites (``pgm_ising_colour``), and build the same ``u``; tests compile
the CUDA source as C++ and compare both with the numba kernel bit for bit.
"""

from __future__ import annotations

import functools
import math
import sys

import numpy as np

from pgmflow.tasks import backend
from pgmflow.tasks.tempering.ising_cpu import _sweep_numba
from pgmflow.tasks.tempering.ising_cuda import _sweep_cupy

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
        bond_sum, M = _energy_kernel()(
            np.ascontiguousarray(spins),
            np.ascontiguousarray(bonds_h, dtype=np.int8),
            np.ascontiguousarray(bonds_v, dtype=np.int8),
        )
        E = -float(J_abs) * bond_sum.astype(np.float64) - float(h) * M.astype(np.float64)
        return E, M
    s = spins.astype(xp.int64)  # [R, L, L]
    bh = xp.asarray(bonds_h).astype(xp.int64)  # [L, L]
    bv = xp.asarray(bonds_v).astype(xp.int64)  # [L, L]
    bond_sum = (bh[None] * s * xp.roll(s, -1, axis=2)).sum(axis=(1, 2)) + (bv[None] * s * xp.roll(s, -1, axis=1)).sum(
        axis=(1, 2)
    )  # [R] int64
    M = s.sum(axis=(1, 2))  # [R] int64
    E = -float(J_abs) * bond_sum.astype(xp.float64) - float(h) * M.astype(xp.float64)
    return backend.to_numpy(E).astype(np.float64), backend.to_numpy(M).astype(np.int64)


# numba kernel: a plain module-level function marked for numba; _energy_kernel() compiles it
# (pgmflow.tasks.backend.compile_kernels) and binds prange to numba.prange (as plain Python, range).
prange = range


@backend.kernel(parallel=True, cache=True)
def _energy(spins, bh, bv):  # pragma: no cover - compiled
    R, L, _ = spins.shape
    bond_sum = np.zeros(R, dtype=np.int64)
    mag = np.zeros(R, dtype=np.int64)
    for r in prange(R):
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


@functools.lru_cache(maxsize=None)
def _energy_kernel():
    """numba kernel: (spins int8 [R,L,L], bonds_h, bonds_v int8 [L,L]) -> (bond_sum int64 [R], M int64 [R]),
    with bond_sum = sum_bonds bond * s_i * s_j (parallel over replicas); compiled on first use."""
    return backend.compile_kernels(sys.modules[__name__], bind={"prange": backend.numba().prange})["_energy"]


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
    bh, bv, thr_h, key_h, rid_h = _validate_sweep_args(spins, bonds_h, bonds_v, thr, key, replica_ids, sweep0, n_sweeps)
    if spins.shape[0] == 0 or int(n_sweeps) == 0:
        return np.zeros(spins.shape[0], dtype=np.int64)
    if type(spins).__module__.startswith("cupy"):
        return _sweep_cupy(spins, bonds_h, bonds_v, thr, key_h, rid_h, chain, sweep0, int(n_sweeps))
    if not isinstance(spins, np.ndarray):
        raise TypeError(f"spins must be a numpy or cupy array, got {type(spins).__name__}")
    return _sweep_numba(spins, bh, bv, thr_h, key_h, rid_h, chain, sweep0, int(n_sweeps))
