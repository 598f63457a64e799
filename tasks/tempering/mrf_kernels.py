"""Per-colour sweeps of a pairwise binary MRF on any graph (heat bath or Metropolis), CPU and GPU.

The explorer kernel of parallel tempering on ``model=mrf`` targets (``pgmflow.tasks.tempering.mrf_target``):
``R`` replicas of one graph, each at its own level ``b``, swept in one call. A numba kernel (CPU) and a CUDA
source (GPU, :mod:`~pgmflow.tasks.tempering.mrf_cuda`) sit behind the one function :func:`mrf_sweep` and
produce the same bits: every random number comes from Philox4x32-10 keyed by the update's identity, and the
acceptance thresholds are computed from the local field with plain IEEE operations only.

The update (the spec both kernels implement)
--------------------------------------------
Sweep ``t`` updates colour ``c = 0, 1, ..., C - 1`` in turn. Colour ``c``'s nodes ``sites[colptr[c]:...]``
(ascending) are taken in groups of four: group ``g`` (its nodes at positions ``4 g .. 4 g + 3`` of the
colour) draws one Philox block

    philox4x32_10(counter = (g, (t * C + c) mod 2**32, replica_id mod 2**32, chain mod 2**32), key)

and the node at position ``4 g + w`` takes its output word ``w`` as its uniform ``u`` (a uint32). Its local
field, summed in the CSR order of its neighbours from ``h_i``, is

    f = h_i + sum_k Jn[k] * x[nbr[k]],    z = b * f + (1 - b) * a_i        (a: the reference fields)

where ``a`` is the replica's reference: ``ref_fields[leg[r]]`` when a per-replica reference is given (the two
legs of ``tempering.reference=stabilized``: uniform spins and the mean-field/fitted product), else the
target's own ``ref_field`` (one reference: a select between two loaded values, so the bits are the same),

and its new spin is ``+1`` iff ``u < thr`` with the integer threshold ``thr`` in ``[0, 2**32]``:

* heat bath (and every method at ``b == 0``: an exact draw from the reference):
  ``p = 1 / (1 + e)`` if ``z >= 0`` else ``e / (1 + e)``, ``e = dexp(-2 |z|)``; ``thr = rint(p * 2**32)``;
* Metropolis: ``acc = dexp(min(0, -2 s z))`` for the current spin ``s``; ``thr = 2**32 - rint(acc * 2**32)``
  when ``s = +1`` (stay up unless flipped) and ``rint(acc * 2**32)`` when ``s = -1``.

``dexp(x)`` (``x <= 0``) is ``exp`` by Cody and Waite's reduction and a degree-13 Taylor polynomial in
Horner form (the arithmetic of ``pgmflow.tasks.fastexp``) times the exact power of two, and 0 below
-40 (there ``exp(x) < 4.3e-18``: every threshold is then 0 or ``2**32`` whatever its value, since
``1 + e == 1`` and ``e * 2**32 < 0.5``): only correctly rounded IEEE operations, and no fused
multiply-add (numba without fast-math; the CUDA source is compiled with ``--fmad=false``), so both kernels
compute the same thresholds bit for bit.

How the CPU kernel computes it
------------------------------
Replicas are independent, so the numba kernel (:mod:`~pgmflow.tasks.tempering.mrf_lanes`) sweeps them in blocks
of at most ``BLOCK_MAX`` replicas (shared evenly between the threads), the replicas as vector lanes: the
block's spins are held as bits (one uint64 word per node, bit ``q`` for lane ``q``), and each Philox group of
four nodes is one branch-free loop over the lanes that draws the group's Philox block once and decides its
four nodes, storing nothing but the new spins' bits. A node's neighbours are added four at a time in CSR
order (``Jn[k] * x`` as the select ``Jn[k]`` or ``-Jn[k]``, the same value for a spin of +-1; the spins are
checked to be +-1), the last one to four, padded with zero couplings on a spare node of spin ``+1``, in the
loop that decides (adding ``+-0`` changes no field but the sign of a zero, and no threshold depends on that
sign: ``z >= 0``, ``|z|``, ``min(0, .)``). Each lane's field and ``z`` are the spec's, in the spec's order,
so a replica's bits do not depend on the block it is swept in.

The certified fast path
-----------------------
The lanes do not compute ``thr``. With ``v = 2**32 - u`` and ``e`` the spec's ``dexp`` value, the sign of

    D = u e - v (heat bath, z >= 0),   u - v e (z < 0),   2**32 e - v (Metropolis, s = +1),   u - 2**32 e (s = -1)

is the decision: ``D = (1 + e) (u - P)`` in the heat bath, ``P = 2**32 p`` the real threshold before
rounding, and ``D = u - 2**32 acc`` (or ``2**32 acc - v``) in Metropolis. The computed ``thr`` lies within
``1/2 + 2**-20`` of ``P`` (``rint``; the division and ``1 + e`` are correctly rounded), so ``|D| > 1 + 2**-19``
puts ``u`` and ``thr`` on the same side of ``P``: then ``u < thr`` iff ``D < 0``.

Each lane computes ``D_fast`` (``_fast_decision``) from ``e_fast = _fexp(arg)``, the same argument as the spec's
``dexp``: ``2**k`` (exact) times the degree-4 Taylor polynomial of ``2**f = exp(f ln 2)``, ``k`` the nearest
integer to ``y = arg * log2(e)`` and ``f = y - k`` (exact, ``|f| <= 1/2``), in float64, without ``1 + e``,
the division or ``rint``. Its error against ``dexp``, with ``E = exp(arg)``:

* truncation: ``|t|**5 / 5! * exp(|t|)`` relative, ``|t| = |f| ln 2 <= 0.3466``: at most 5.89266e-5 ``E``;
* Horner's rounding: ``gamma_9 * sum_k a_k |f|**k / 2**f <= 9 * 2**-53 * 2 = 2e-15`` relative (coefficients
  positive, their sum at ``|f|`` at most ``sqrt 2``, the value at least ``1/sqrt 2``);
* ``y``'s rounding: ``|y - arg log2 e| <= |arg| log2(e) 2**-52``, so at most ``E |arg| 2**-52 <= 2**-52 / e``
  absolute (``x exp(-x) <= 1/e``);
* ``dexp`` itself: within ``1e-14 E`` of ``E`` (Horner's rounding ``27 * 2**-53 * 2 = 6e-15`` relative with
  ``|r| <= 0.347``, a reduction error below ``4e-17``, truncation below ``1e-17``; the tests measure 4e-16);

so ``|e_fast - e| <= 5.8927e-5`` (both are 0 where ``arg < -40`` or NaN: the same clamp and select). ``|u|,
|v| <= 2**32`` are exact in float64, and the product and difference add at most ``2**-19``, so

    |D_fast - D| <= 2**32 * 5.8927e-5 + 2**-19 < 253,100 = ERR_BOUND.

A lane with ``|D_fast| > MARGIN = 2**19`` (``>= ERR_BOUND + 1 + 2**-19``, a factor 2.07 of headroom) therefore
takes ``+1`` iff ``D_fast < 0``, which is the spec's ``u < thr``. The others (``u`` within ``MARGIN + ERR_BOUND`` of
``P``: at most a fraction ``2 (MARGIN + ERR_BOUND) / 2**32 = 3.6e-4`` of the updates) are marked in the loop (a bit
per lane) and redone after it, each in a scalar loop by the spec itself (``mrf_lanes._fixup``: the field in CSR
order and ``_threshold``), and counted. Any margin of at least
``ERR_BOUND + 1`` gives the same bits (``_sweep_cpu(..., margin)``; ``inf`` is the exact path: every lane by
``_threshold``). The fast path is the CPU kernel's way to the spec's bits, not a change of the spec: the CUDA
kernel computes ``thr`` as written.

The NumPy peer :func:`numpy_colour_sweep` (heat bath, the obvious way) is what ``benchmarks/tempering_mrf.py``
measures the kernel against.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time

import numpy as np

from pgmflow.tasks import backend, philox
from pgmflow.tasks.tempering import mrf_lanes
from pgmflow.tasks.tempering.mrf_target import reference_rows

__all__ = ["METHODS", "mrf_sweep", "mrf_statistics", "numpy_colour_sweep", "reference_rows"]

METHODS = ("heatbath", "metropolis")
_MASK32 = 0xFFFFFFFF
_TWO32 = 4294967296.0
PARALLEL_MIN_WORK = 1 << 20  # node and neighbour visits of one call above which threads run over replicas
BLOCK_MAX = 64  # replicas swept together as vector lanes (mrf_lanes; at most 64: a node's spins are one uint64)
BLOCK_MIN = 8  # ... and at least this many (the lanes come in groups of 8): fewer threads rather than idle lanes
NODE_SPLIT_LANES = 64  # threads share a colour's nodes rather than the replicas when a thread would get fewer lanes
NODE_SPLIT_GROUPS = 32  # ... and the colours have at least this many Philox groups per thread

# dexp's constants (see pgmflow.tasks.fastexp); module globals, frozen into the compiled code
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_SHIFT = 6755399441055744.0
_C = (
    1.0,
    1.0,
    0.5,
    0.16666666666666666,
    0.041666666666666664,
    0.008333333333333333,
    0.001388888888888889,
    0.0001984126984126984,
    2.48015873015873e-05,
    2.7557319223985893e-06,
    2.755731922398589e-07,
    2.505210838544172e-08,
    2.08767569878681e-09,
    1.6059043836821613e-10,
)
_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7, _C8, _C9, _C10, _C11, _C12, _C13 = _C

# The fast path's exp (see "The certified fast path" in the module docstring): 2**f for |f| <= 1/2 by the
# degree-4 Taylor polynomial of exp(f ln 2), coefficients (ln 2)**k / k! rounded to doubles. Degree 4 rather than
# 6 (issue 34): two multiply-adds fewer per update, about 0.9x the sweep's time on the 4-regular graph at 64 replicas
# (Zen 4), for at most 3.6e-4 of the lanes left to the fallback instead of 8e-7 (its cost is inside that figure;
# benchmarks/results/tempering_mrf-cpu-2core-epyc-issue34-fexp4.md).
_A = (
    1.0,
    0.6931471805599453,
    0.24022650695910072,
    0.05550410866482158,
    0.009618129107628477,
)
_A0, _A1, _A2, _A3, _A4 = _A
ERR_BOUND = 253100.0  # proven bound on |D_fast - D| (module docstring, "The certified fast path")
MARGIN = 524288.0  # 2**19: a lane with |D_fast| > MARGIN (>= ERR_BOUND + 1 + 2**-19) is decided by the fast path


@backend.kernel(cache=True, nogil=True, inline="always")
def _dexp(x):
    """exp(x) for -40 <= x <= 0 from IEEE + - * only (see the module docstring); 0 below -40. Written without a
    branch on data (the argument clamped to -40 so that the power of two stays normal, 0 selected below), so
    that it vectorises inside a loop over lanes."""
    xc = x if x >= -40.0 else -40.0
    kf = xc * _LOG2E + _SHIFT
    k = kf - _SHIFT
    r = (xc - k * _LN2_HI) - k * _LN2_LO
    p = _C13
    p = p * r + _C12
    p = p * r + _C11
    p = p * r + _C10
    p = p * r + _C9
    p = p * r + _C8
    p = p * r + _C7
    p = p * r + _C6
    p = p * r + _C5
    p = p * r + _C4
    p = p * r + _C3
    p = p * r + _C2
    p = p * r + _C1
    p = p * r + _C0
    e = p * np.int64((np.int64(k) + 1023) << 52).view(np.float64)  # p * 2**k exactly: k in [-58, 0]
    return e if x >= -40.0 else 0.0


@backend.kernel(cache=True, nogil=True, inline="always")
def _fexp(x):
    """exp(x) for -40 <= x <= 0 within 5.8927e-5 of ``_dexp(x)`` (module docstring), and 0 where ``_dexp`` is 0
    (below -40, and NaN): 2**k times a degree-4 polynomial in f = x log2(e) - k, k the nearest integer (then f
    is exact and |f| <= 1/2). Branch-free like ``_dexp``."""
    xc = x if x >= -40.0 else -40.0
    y = xc * _LOG2E
    kf = y + _SHIFT
    k = kf - _SHIFT
    f = y - k  # exact: |f| <= 1/2
    p = _A4
    p = p * f + _A3
    p = p * f + _A2
    p = p * f + _A1
    p = p * f + _A0
    e = p * np.int64((np.int64(k) + 1023) << 52).view(np.float64)  # p * 2**k exactly: k in [-58, 0]
    return e if x >= -40.0 else 0.0


@backend.kernel(cache=True, nogil=True, inline="always")
def _fast_decision(z, s, b, metro, uf):
    """The certified fast path of one update (module docstring): D, within ERR_BOUND of the exact D, so that
    the new spin is +1 iff D < 0 whenever |D| > MARGIN. z: the update's z; s: the current spin (float64, +-1);
    b: the level; metro: Metropolis; uf: the uniform u (a uint32) as a float64, exact. Branch-free (selects),
    so that lanes vectorise."""
    mq = metro & (b != 0.0)
    az = z if z >= 0.0 else -z
    d = -2.0 * s * z
    d = d if d < 0.0 else 0.0
    ea = _fexp(d if mq else -2.0 * az)
    pos = (s > 0.0) if mq else (z >= 0.0)
    vf = 4294967296.0 - uf
    alpha = (4294967296.0 if pos else -4294967296.0) if mq else (uf if pos else -vf)
    beta = vf if pos else -uf
    return alpha * ea - beta


@backend.kernel(cache=True, nogil=True, inline="always")
def _threshold(z, s, b, metropolis):
    """The integer threshold of one update (int64 in [0, 2**32]); see the module docstring."""
    if metropolis and b != 0.0:
        d = -2.0 * s * z
        acc = _dexp(d if d < 0.0 else 0.0)
        t = np.int64(np.rint(acc * 4294967296.0))
        return np.int64(4294967296) - t if s > 0 else t
    az = z if z >= 0.0 else -z
    e = _dexp(-2.0 * az)
    p = 1.0 / (1.0 + e) if z >= 0.0 else e / (1.0 + e)
    return np.int64(np.rint(p * 4294967296.0))


@backend.kernel(cache=True, nogil=True)
def _not_pm1(x):
    """How many entries of the int8 array x are neither +1 nor -1 (the kernel reads a spin by its sign)."""
    bad = 0
    xf = x.ravel()
    for k in range(xf.shape[0]):
        v = xf[k]
        bad += np.int64((v != 1) & (v != -1))
    return bad


@backend.kernel(cache=True, nogil=True)
def _statistics(x, h, a, ea, eb, J, out):
    """out[r] = (h.x, sum_e J_e x_i x_j, a.x, sum_i x_i) of replica r, summed in index order."""
    R, n = x.shape
    for r in range(R):
        hx = 0.0
        ax = 0.0
        m = 0.0
        for i in range(n):
            xi = np.float64(x[r, i])
            hx += h[i] * xi
            ax += a[i] * xi
            m += xi
        jx = 0.0
        for e in range(J.shape[0]):
            jx += J[e] * np.float64(x[r, ea[e]] * x[r, eb[e]])
        out[r, 0] = hx
        out[r, 1] = jx
        out[r, 2] = ax
        out[r, 3] = m


@functools.lru_cache(maxsize=None)
def _kernels():
    """Compile the kernels above (once per process; numba's on-disk cache serves later processes)."""
    own = backend.compile_kernels(sys.modules[__name__])
    bind = {"prange": backend.numba().prange, "_philox": philox.numba_philox4x32()}
    bind.update({name: own[name] for name in ("_fast_decision", "_threshold")})
    return {**own, **backend.compile_kernels(mrf_lanes, bind=bind)}


def _check(x, b, key, replica_ids, sweep0, n_sweeps, method, n):
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if x.ndim != 2 or x.shape[1] != n or x.dtype != np.int8:
        raise ValueError(f"spins must be int8 [R, {n}], got {x.dtype} {x.shape}")
    R = x.shape[0]
    b = np.ascontiguousarray(backend.to_numpy(b), dtype=np.float64)
    if b.shape != (R,) or not np.all((b >= 0) & (b <= 1)):
        raise ValueError(f"b must be [R] = [{R}] values in [0, 1], got {b}")
    key = np.asarray(backend.to_numpy(key))
    if key.shape != (2,) or key.dtype.kind not in "iu" or key.min() < 0 or key.max() > _MASK32:
        raise ValueError(f"key must be two 32-bit words, got {key!r}")
    rid = np.asarray(backend.to_numpy(replica_ids))
    if rid.shape != (R,) or rid.dtype.kind not in "iu":
        raise ValueError(f"replica_ids must be an integer array [R] = [{R}], got {rid.shape}")
    if int(sweep0) < 0 or int(n_sweeps) < 0:
        raise ValueError(f"sweep0 and n_sweeps must be >= 0, got {sweep0}, {n_sweeps}")
    return b, key, (rid.astype(np.int64) & _MASK32).astype(np.uint64)


def _plan(R: int, threads: int, n: int, n_colours: int) -> tuple[str, int]:
    """How the kernel shares one call between threads: ``("replicas", block)``, blocks of ``block`` replicas and
    threads over blocks, or ``("nodes", block)``, blocks of ``block`` replicas one after another, each colour's
    groups shared between the threads. Replicas while they give every thread a block of at least
    ``NODE_SPLIT_LANES`` lanes (or the colours are too small to share); else nodes, so that each block keeps all
    its lanes. Results do not depend on it."""
    nb = -(-R // BLOCK_MAX)  # the fewest blocks
    per = -(-R // max(1, threads))
    groups = n // max(1, n_colours) // 4  # Philox groups in a typical colour
    if threads > 1 and per < NODE_SPLIT_LANES and nb < threads and groups >= NODE_SPLIT_GROUPS * threads:
        return "nodes", -(-R // nb)
    return "replicas", max(1, min(BLOCK_MAX, max(per, min(BLOCK_MIN, R))))


TUNE_MIN_THREADS = 4  # from this many threads the plan is measured rather than assumed (PGMFLOW_MRF_PLAN overrides)
TUNE_SAMPLES = 2  # timed calls of each candidate plan before the fastest is kept
_tuning: dict = {}  # (graph shape, R, threads, method) -> {plan: [ns per update, ...]}
_tuning_lock = threading.Lock()


def _candidates(R: int, threads: int, n: int, n_colours: int) -> list[tuple[str, int]]:
    """The plans worth timing for one call shape: ``_plan``'s first, then blocks of 8, 16, 32 and 64 replicas
    (threads over blocks), then one block at a time with each colour's groups shared (while the colours have at
    least 4 groups a thread)."""
    out = [_plan(R, threads, n, n_colours)]
    for b in sorted({min(b, R) for b in (BLOCK_MIN, 16, 32, BLOCK_MAX)}):
        out.append(("replicas", b))
    if threads > 1 and n // max(1, n_colours) // 4 >= 4 * threads:
        out.append(("nodes", -(-R // -(-R // BLOCK_MAX))))
    return list(dict.fromkeys(out))


def _tuning_mode(threads: int) -> bool:
    """Whether this call's plan is measured: ``PGMFLOW_MRF_PLAN=static`` never, ``tune`` always, else (``auto``)
    from ``TUNE_MIN_THREADS`` threads (the static plan was measured on two cores)."""
    mode = os.environ.get("PGMFLOW_MRF_PLAN", "auto")
    if mode not in ("auto", "static", "tune"):
        raise ValueError(f"PGMFLOW_MRF_PLAN must be auto, static or tune, not {mode!r}")
    return mode == "tune" or (mode == "auto" and threads >= TUNE_MIN_THREADS)


def _tuned_plan(key, candidates) -> tuple[str, int]:
    """The next candidate with fewer than ``TUNE_SAMPLES`` timings (each is a real call: the bits do not depend on
    the plan), then the fastest by its best timing."""
    with _tuning_lock:
        seen = _tuning.setdefault(key, {c: [] for c in candidates})
        for c in candidates:
            if len(seen[c]) < TUNE_SAMPLES:
                return c
        return min(candidates, key=lambda c: min(seen[c]))


def _record(key, plan, ns_per_update: float) -> None:
    with _tuning_lock:
        times = _tuning[key][plan]
        if len(times) < TUNE_SAMPLES:
            times.append(ns_per_update)


def mrf_sweep(
    x,
    target,
    b,
    key,
    replica_ids,
    chain: int,
    sweep0: int,
    n_sweeps: int,
    method: str,
    ref_fields=None,
    leg=None,
) -> np.ndarray:
    """``n_sweeps`` per-colour sweeps of every replica, IN PLACE (see the module docstring for the rule).

    x: int8 [R, n] spins, numpy (numba kernel, CPU) or cupy (CUDA kernel); target: an
    :class:`~pgmflow.tasks.tempering.mrf_target.MRFTarget`; b: float64 [R] levels in [0, 1]; key: uint32 [2]
    Philox key; replica_ids: int [R] (counter word 2, mod 2**32); chain: counter word 3 (mod 2**32);
    sweep0: global index of the first sweep; ref_fields: None (every replica at the target's own reference
    ``target.ref_field``) or float64 [G, n], the reference fields of G <= 2 references (a two-leg path), with
    leg: int [R] the row of each replica. Returns int64 [R] (host): spins changed per replica.
    The result depends only on the arguments, not on the backend, thread count or how replicas are batched.
    """
    b, key, rid = _check(x, b, key, replica_ids, sweep0, n_sweeps, method, target.n_sites)
    R = x.shape[0]
    a, lg = reference_rows(target, R, ref_fields, leg)
    if R == 0 or int(n_sweeps) == 0:
        return np.zeros(R, dtype=np.int64)
    if type(x).__module__.startswith("cupy"):
        from pgmflow.tasks.tempering.mrf_cuda import sweep_cupy

        return sweep_cupy(x, target, b, key, rid, chain, sweep0, int(n_sweeps), method, a, lg)
    return _sweep_cpu(x, target, b, key, rid, chain, sweep0, n_sweeps, method, a, lg, MARGIN)[0]


def _sweep_cpu(x, target, b, key, rid, chain, sweep0, n_sweeps, method, a, lg, margin, plan=None):
    """The numba kernel with the fast path's ``margin`` (MARGIN, or any larger value: the same bits; ``inf``:
    every lane by the exact threshold); ``plan``: None (``_plan``'s, or measured among ``_candidates`` where
    ``_tuning_mode`` says so) or ``(how, block, threads)`` (tests: the same bits whatever the plan). Returns
    (spins changed per replica, lane updates left to the exact threshold)."""
    if not isinstance(x, np.ndarray) or not x.flags.c_contiguous or not x.flags.writeable:
        raise ValueError("spins must be a writeable C-contiguous numpy (or cupy) array")
    if _kernels()["_not_pm1"](x):
        raise ValueError("spins must contain only -1 and +1")
    R = x.shape[0]
    out = np.zeros(R, dtype=np.int64)
    nfb = np.zeros(R, dtype=np.int64)
    work = R * int(n_sweeps) * (target.n_sites + target.nbr.shape[0])
    threads = backend.numba().get_num_threads() if R > 0 and work > PARALLEL_MIN_WORK else 1
    tune = None
    if plan is not None:
        how, block, threads = plan
    elif threads > 1 and _tuning_mode(threads):
        shape = (target.n_sites, target.nbr.shape[0], target.n_colours, R, threads, method)
        cands = _candidates(R, threads, target.n_sites, target.n_colours)
        how, block = _tuned_plan(shape, cands)
        tune = (shape, (how, block), time.perf_counter())
    else:
        how, block = _plan(R, threads, target.n_sites, target.n_colours)
    k = _kernels()
    args = (
        target.h,
        a,
        lg,
        target.indptr,
        target.nbr,
        target.Jn,
        target.colptr,
        target.sites,
        (np.uint64(int(key[0])), np.uint64(int(key[1]))),
        rid,
        (np.uint64(int(chain) & _MASK32), np.int64(sweep0), np.int64(n_sweeps)),
        method == "metropolis",
        float(margin),
        out,
        nfb,
    )
    if how == "nodes":
        for r0 in range(0, R, block):
            k["_sweep_nodes"](x, r0, min(R, r0 + block), b, *args, np.int64(threads))
    else:
        k["_sweeps" if threads > 1 and R > 1 else "_sweeps_serial"](x, b, *args, np.int64(block))
    if tune is not None:
        _record(tune[0], tune[1], (time.perf_counter() - tune[2]) * 1e9 / max(1, work))
    return out, int(nfb.sum())


def mrf_statistics(x, target, ref_field=None) -> np.ndarray:
    """float64 [R, 4] of spins ``x`` [R, n] (numpy or cupy): ``(h.x, sum_e J_e x_i x_j, a.x, sum_i x_i)``,
    each summed in index order per replica, so a replica's values do not depend on the others in ``x``
    (``a``: ``ref_field`` [n], None: the target's own)."""
    xh = np.ascontiguousarray(backend.to_numpy(x), dtype=np.int8)
    out = np.empty((xh.shape[0], 4))
    ea = np.ascontiguousarray(target.edges[:, 0])
    eb = np.ascontiguousarray(target.edges[:, 1])
    a = target.ref_field if ref_field is None else np.ascontiguousarray(ref_field, dtype=np.float64)
    _kernels()["_statistics"](xh, target.h, a, ea, eb, target.J, out)
    return out


def numpy_colour_sweep(x, target, b: float, rng, n_sweeps: int, colour_rows=None):
    """Heat-bath per-colour sweeps written the obvious NumPy way (the benchmark's peer): per colour, the
    local fields of its nodes in every replica by one sparse product, ``rng.random`` per node, a logistic and
    ``np.where``. Same distribution as :func:`mrf_sweep` at level ``b``, not the same bits.

    x: int8 [R, n], updated in place; colour_rows: per colour, (nodes, CSR matrix of their rows of J), made
    once by :func:`colour_rows` and passed in to keep the set-up out of the timing."""
    rows = colour_rows if colour_rows is not None else colour_rows_of(target)
    for _ in range(n_sweeps):
        for nodes, A in rows:
            f = (A @ x.T).T + target.h[nodes]  # [R, |c|]
            z = b * f + (1.0 - b) * target.ref_field[nodes]
            p = 1.0 / (1.0 + np.exp(-2.0 * z))
            x[:, nodes] = np.where(rng.random(f.shape) < p, 1, -1)
    return x


def colour_rows_of(target):
    """Per colour: (its nodes, the CSR matrix [|c|, n] of their rows of the coupling matrix)."""
    import scipy.sparse as sp

    n = target.n_sites
    A = sp.csr_matrix((target.Jn, target.nbr, target.indptr), shape=(n, n))
    out = []
    for c in range(target.n_colours):
        nodes = target.sites[target.colptr[c] : target.colptr[c + 1]]
        out.append((nodes, A[nodes]))
    return out
