"""Gibbs sampling of a pairwise binary Markov random field (Ising model on any graph).

Model
-----
Spins ``x_i in {-1, +1}``, ``i = 0..p-1``, with node fields ``h`` float64 [p] and couplings ``J``
float64 [p, p] (symmetric, zero diagonal)::

    P(x)  proportional to  exp( sum_i h_i x_i + sum_{i<j} J_ij x_i x_j )

so that ``P(x_i = +1 | x_rest) = sigmoid(2 * (h_i + sum_j J_ij x_j))``.

Sweeps and random numbers
-------------------------
One *sweep* is a systematic scan: sites ``i = 0, 1, ..., p-1`` in order, each resampled from its
conditional given the current values of the others. Many independent chains ``[n_chains, p]``
(int8 spins) are swept in one call. :func:`step` draws its uniforms from the NumPy Generator it
is given, in bulk and in this order::

    u = rng.random((n_sweeps, n_chains, p))      # float64, C order

(drawn in consecutive blocks of sweeps to bound memory, which consumes the generator exactly like
the one call above), and site ``i`` of chain ``c`` at sweep ``s`` becomes::

    +1 if u[s, c, i] < 1 / (1 + exp(-2 * (h_i + sum_j J_ij x_cj))) else -1

The result therefore depends only on the generator's state and the parameters, never on the
number of threads that run the kernel (threads split the chains, which are independent).

The hot loop is a numba kernel over the nonzero couplings of each row (CSR), so a sweep costs
O(n_chains * (p + nnz(J))).

Contract (blackjax style): ``init(rng, p, n_chains) -> GibbsState`` and
``step(rng, state, h, J, n_sweeps) -> (GibbsState, GibbsInfo)``; the input state is never
modified. :func:`exact_moments` enumerates all ``2**p`` states (small ``p``) for tests.
"""

from __future__ import annotations

import functools
import math
import sys
from typing import NamedTuple

import numpy as np

from pgmflow.tasks import backend

__all__ = [
    "ExactMoments",
    "GibbsInfo",
    "GibbsState",
    "check_parameters",
    "exact_moments",
    "init",
    "step",
]

_UNIFORM_BUDGET = 1 << 22  # uniforms drawn per block (32 MiB of float64)


class GibbsState(NamedTuple):
    """The state of ``n_chains`` independent chains.

    spins: int8 [n_chains, p], values in {-1, +1}; row ``c`` is chain ``c``.
    """

    spins: np.ndarray


class GibbsInfo(NamedTuple):
    """Diagnostics of one :func:`step`.

    flip_rate: float64 [n_sweeps], for each sweep the fraction of the ``n_chains * p`` site updates
        that changed the spin (a mixing indicator: near 0 means the chains are stuck).
    """

    flip_rate: np.ndarray


class ExactMoments(NamedTuple):
    """Exact moments of the model by enumeration of all ``2**p`` states.

    log_z: float, the log partition function ``log sum_x exp(h.x + sum_{i<j} J_ij x_i x_j)``.
    mean: float64 [p], ``E[x_i]``.
    second: float64 [p, p], ``E[x_i x_j]`` (ones on the diagonal).
    """

    log_z: float
    mean: np.ndarray
    second: np.ndarray


def check_parameters(h, J, p: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Validate and return ``(h, J)`` as contiguous float64 arrays.

    ``h`` must be [p] and finite; ``J`` [p, p], finite, symmetric (to 1e-10 relative to max|J|)
    with an exactly zero diagonal. Raises ValueError naming the problem.
    """
    h = np.ascontiguousarray(h, dtype=np.float64)
    J = np.ascontiguousarray(J, dtype=np.float64)
    if h.ndim != 1:
        raise ValueError(f"h must be a vector [p]; got shape {h.shape}")
    q = h.shape[0] if p is None else int(p)
    if h.shape != (q,):
        raise ValueError(f"h must have shape ({q},); got {h.shape}")
    if J.shape != (q, q):
        raise ValueError(f"J must have shape ({q}, {q}); got {J.shape}")
    if not np.all(np.isfinite(h)):
        raise ValueError("h contains NaN or infinite values")
    if not np.all(np.isfinite(J)):
        raise ValueError("J contains NaN or infinite values")
    if np.any(np.diagonal(J) != 0):
        i = int(np.flatnonzero(np.diagonal(J))[0])
        raise ValueError(f"J must have a zero diagonal; J[{i}, {i}] = {J[i, i]}")
    scale = float(np.max(np.abs(J))) if J.size else 0.0
    if scale > 0 and np.max(np.abs(J - J.T)) > 1e-10 * scale:
        i, j = np.unravel_index(int(np.argmax(np.abs(J - J.T))), J.shape)
        raise ValueError(f"J must be symmetric; J[{i}, {j}] = {J[i, j]} but J[{j}, {i}] = {J[j, i]}")
    return h, J


def init(rng: np.random.Generator, p: int, n_chains: int) -> GibbsState:
    """Independent uniform random spins: ``spins[c, i] = +1 if u < 0.5 else -1`` with
    ``u = rng.random((n_chains, p))``."""
    p, n_chains = int(p), int(n_chains)
    if p < 1 or n_chains < 1:
        raise ValueError(f"need p >= 1 and n_chains >= 1; got p={p}, n_chains={n_chains}")
    u = rng.random((n_chains, p))
    return GibbsState(spins=np.where(u < 0.5, 1, -1).astype(np.int8))


def step(rng: np.random.Generator, state: GibbsState, h, J, n_sweeps: int) -> tuple[GibbsState, GibbsInfo]:
    """``n_sweeps`` systematic-scan Gibbs sweeps of every chain (see the module docstring for the
    exact use of ``rng``).

    state: :class:`GibbsState` with spins int8 [n_chains, p] (not modified).
    h: float [p] node fields; J: float [p, p] symmetric couplings with zero diagonal.
    n_sweeps: int >= 0.
    Returns ``(new_state, GibbsInfo)``.
    """
    spins = np.asarray(state.spins)
    if spins.ndim != 2 or spins.dtype != np.int8:
        raise ValueError(f"state.spins must be int8 [n_chains, p]; got {spins.dtype} {spins.shape}")
    n_chains, p = spins.shape
    h, J = check_parameters(h, J, p)
    n_sweeps = int(n_sweeps)
    if n_sweeps < 0:
        raise ValueError(f"n_sweeps must be >= 0; got {n_sweeps}")
    if not np.all((spins == 1) | (spins == -1)):
        raise ValueError("state.spins must contain only -1 and +1")
    new = np.array(spins, dtype=np.int8, order="C", copy=True)
    flips = np.zeros((n_sweeps, n_chains), dtype=np.int64)
    if n_sweeps and n_chains and p:
        indptr, indices, weights = _csr(J)
        kernel = _kernels()["_sweeps"]
        block = max(1, _UNIFORM_BUDGET // (n_chains * p))
        for s0 in range(0, n_sweeps, block):
            s1 = min(n_sweeps, s0 + block)
            u = rng.random((s1 - s0, n_chains, p))
            kernel(new, h, indptr, indices, weights, u, flips[s0:s1])
    denom = max(n_chains * p, 1)
    return GibbsState(spins=new), GibbsInfo(flip_rate=flips.sum(axis=1) / denom)


def exact_moments(h, J) -> ExactMoments:
    """Exact ``log Z``, ``E[x]`` and ``E[x x^T]`` by enumerating all ``2**p`` states (p <= 22)."""
    h, J = check_parameters(h, J)
    p = h.shape[0]
    if p > 22:
        raise ValueError(f"exact enumeration needs p <= 22; got p={p}")
    codes = np.arange(2**p, dtype=np.int64)
    X = (((codes[:, None] >> np.arange(p)) & 1) * 2 - 1).astype(np.float64)
    logw = X @ h + 0.5 * np.einsum("si,si->s", X @ J, X)
    m = logw.max()
    w = np.exp(logw - m)
    z = w.sum()
    w /= z
    return ExactMoments(log_z=float(m + math.log(z)), mean=w @ X, second=X.T @ (w[:, None] * X))


def _csr(J: np.ndarray):
    """Rows of J as CSR (nonzeros only, columns increasing): indptr int64, indices int64, weights f8."""
    rows, cols = np.nonzero(J)
    indptr = np.zeros(J.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=J.shape[0]), out=indptr[1:])
    return indptr, cols.astype(np.int64), np.ascontiguousarray(J[rows, cols])


# --- numba kernels ----------------------------------------------------------------------------------

# Plain module-level functions marked for numba; _kernels() compiles them (pgmflow.tasks.backend.compile_kernels),
# rebinds their names to the dispatchers and binds prange to numba.prange (as plain Python, range).
prange = range


@backend.kernel(cache=True, nogil=True)
def _sweep_chain(spins, c, h, indptr, indices, weights, u, flips):
    S = u.shape[0]
    p = spins.shape[1]
    for s in range(S):
        nf = 0
        for i in range(p):
            f = h[i]
            for k in range(indptr[i], indptr[i + 1]):
                f += weights[k] * spins[c, indices[k]]
            prob = 1.0 / (1.0 + math.exp(-2.0 * f))
            new = 1 if u[s, c, i] < prob else -1
            if new != spins[c, i]:
                nf += 1
                spins[c, i] = new
        flips[s, c] = nf


@backend.kernel(cache=True, nogil=True, parallel=True)
def _sweeps(spins, h, indptr, indices, weights, u, flips):
    """spins int8 [C, p] (updated in place); u float64 [S, C, p]; flips int64 [S, C] (output)."""
    for c in prange(spins.shape[0]):
        _sweep_chain(spins, c, h, indptr, indices, weights, u, flips)


@functools.lru_cache(maxsize=None)
def _kernels():
    """Compile the kernels above (once per process; numba's on-disk cache serves later processes)."""
    return backend.compile_kernels(sys.modules[__name__], bind={"prange": backend.numba().prange})
