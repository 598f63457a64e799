"""Synthetic time-varying Ising networks with known ground truth.

After the simulation protocol of Ahmed & Xing (PNAS 2009, "Recovering time-varying networks of
dependencies in social and biological studies") and Kolar, Song, Ahmed & Xing (AoAS 2010,
"Estimating time-varying networks"): a sparse random graph whose edges are rewired a few at a time
at regular intervals, with edge weights that change smoothly, and binary samples drawn at every
time point from the Ising model of that time point.

Ground truth (:func:`ground_truth`; randomness ``rng.generator(seed, STAGE_TESLA_GRAPH)``)
-----------------------------------------------------------------------------------------------
1. An initial random graph on ``p`` nodes with ``n_edges`` edges, each node of degree at most
   ``max_degree`` (node pairs in random order, added greedily while both ends have room).
2. Each edge gets a weight of magnitude uniform in ``[weight_low, weight_high]`` and random sign.
3. At every *rewiring point* ``t0 = k * rewire_every`` (k = 1, 2, ...; ``t0 < T``), ``n_rewire``
   current edges (uniformly at random) are scheduled to disappear and ``n_rewire`` current
   non-edges (pairs in random order, taken while both ends have room, counting the disappearing
   edges as still present unless ``ramp = 1``; never a pair that disappears there) to appear, each
   with a fresh random weight ``w``. Weights change
   linearly over ``ramp`` time points: an appearing edge has weight ``w * min(1, (t - t0 + 1) /
   ramp)`` for ``t >= t0`` (0 before), a disappearing one ``w * max(0, 1 - (t - t0 + 1) / ramp)``
   for ``t >= t0`` (exactly 0 from ``t0 + ramp - 1`` on). ``ramp = 1`` is an abrupt switch at
   ``t0``. ``ramp <= rewire_every`` is required, so ramps never overlap and the graph is constant
   (``n_edges`` edges) outside ``[t0, t0 + ramp - 1]``; every node's degree is at most
   ``max_degree`` at every time point.
4. Node fields ``h_t = field`` (a scalar or a [p] vector, the same at every time point).

The true edge set at time ``t`` is ``J[t] != 0`` (:func:`edge_sets`).

Samples (:func:`sample_time_point`; randomness ``rng.generator(seed, STAGE_TESLA_GIBBS, t)``)
--------------------------------------------------------------------------------------------
With ``thin=None`` (default) the ``samples_per_time`` samples of time ``t`` are the final states
of as many independent Gibbs chains (:mod:`pgmflow.tasks.tesla.gibbs`, uniform random start) run for
``burn_in`` sweeps with ``(h_t, J_t)``. With ``thin=k >= 1`` a single chain is run for ``burn_in``
sweeps and then one sample is kept every ``k`` sweeps (cheaper, but successive samples are
correlated). Each time point has its own generator, so time points can be generated independently
and in any order; the result depends only on ``seed`` and the parameters.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pgmflow.tasks import rng as _rng
from pgmflow.tasks.tesla import gibbs

__all__ = [
    "GroundTruth",
    "SyntheticNetwork",
    "edge_sets",
    "ground_truth",
    "rewire_points",
    "sample_time_point",
    "time_varying_ising",
]


class GroundTruth(NamedTuple):
    """The parameters of a time-varying Ising model.

    J: float64 [T, p, p], couplings at each time point; symmetric with zero diagonal.
    h: float64 [T, p], node fields at each time point.
    """

    J: np.ndarray
    h: np.ndarray


class SyntheticNetwork(NamedTuple):
    """Samples of a time-varying Ising network and the parameters that generated them.

    X: int8 [T, n, p], values in {-1, +1}; ``X[t]`` are the ``n = samples_per_time`` samples of
        time point ``t`` (rows independent given ``thin=None``).
    J: float64 [T, p, p], true couplings at each time point (symmetric, zero diagonal).
    h: float64 [T, p], true node fields at each time point.
    edges: bool [T, p, p], the true edge sets ``J != 0`` (symmetric, False on the diagonal).
    """

    X: np.ndarray
    J: np.ndarray
    h: np.ndarray
    edges: np.ndarray


def edge_sets(J) -> np.ndarray:
    """The edge set of each time point: bool ``J != 0`` (same shape as J, e.g. [T, p, p])."""
    return np.asarray(J) != 0


def rewire_points(T: int, rewire_every: int) -> np.ndarray:
    """The rewiring points ``k * rewire_every < T`` (k >= 1), int64."""
    return np.arange(int(rewire_every), int(T), int(rewire_every), dtype=np.int64)


def _check(p, T, n_edges, rewire_every, n_rewire, max_degree, weight_low, weight_high, ramp):
    if p < 2:
        raise ValueError(f"p must be >= 2; got {p}")
    if T < 1:
        raise ValueError(f"T must be >= 1; got {T}")
    if max_degree < 1:
        raise ValueError(f"max_degree must be >= 1; got {max_degree}")
    cap = min(p * (p - 1) // 2, p * max_degree // 2)
    if not 0 <= n_edges <= cap:
        raise ValueError(f"n_edges must be in [0, {cap}] for p={p}, max_degree={max_degree}; got {n_edges}")
    if rewire_every < 1:
        raise ValueError(f"rewire_every must be >= 1; got {rewire_every}")
    if not 0 <= n_rewire <= n_edges:
        raise ValueError(f"n_rewire must be in [0, n_edges={n_edges}]; got {n_rewire}")
    if not 1 <= ramp <= rewire_every:
        raise ValueError(f"ramp must be in [1, rewire_every={rewire_every}]; got {ramp}")
    if not (0 <= weight_low <= weight_high and np.isfinite(weight_high)):
        raise ValueError(f"need 0 <= weight_low <= weight_high < inf; got {weight_low}, {weight_high}")


def _add_edges(g, p, count, deg, forbidden, max_degree, what):
    """Pick ``count`` new pairs (i < j), not in ``forbidden`` (bool [p, p]), in random order while
    both ends have degree < max_degree; updates ``deg``. Returns int64 [count, 2]."""
    iu, ju = np.triu_indices(p, 1)
    order = g.permutation(iu.size)
    out = []
    if count:
        for k in order:
            i, j = iu[k], ju[k]
            if forbidden[i, j] or deg[i] >= max_degree or deg[j] >= max_degree:
                continue
            out.append((i, j))
            deg[i] += 1
            deg[j] += 1
            if len(out) == count:
                break
    if len(out) < count:
        raise ValueError(
            f"could not place {count} {what} edges with max_degree={max_degree} "
            f"(placed {len(out)}); lower n_edges or n_rewire, or raise max_degree"
        )
    return np.asarray(out, dtype=np.int64).reshape(-1, 2)


def ground_truth(
    seed: int,
    p: int = 20,
    T: int = 100,
    *,
    n_edges: int | None = None,
    rewire_every: int = 10,
    n_rewire: int = 2,
    max_degree: int = 4,
    weight_low: float = 0.5,
    weight_high: float = 1.0,
    ramp: int = 5,
    field=0.0,
) -> GroundTruth:
    """The couplings ``J`` [T, p, p] and fields ``h`` [T, p] of a time-varying network (module
    docstring, "Ground truth"). Depends only on ``seed`` and the parameters."""
    p, T = int(p), int(T)
    n_edges = p if n_edges is None else int(n_edges)
    rewire_every, n_rewire, max_degree, ramp = int(rewire_every), int(n_rewire), int(max_degree), int(ramp)
    weight_low, weight_high = float(weight_low), float(weight_high)
    _check(p, T, n_edges, rewire_every, n_rewire, max_degree, weight_low, weight_high, ramp)
    h_row = np.broadcast_to(np.asarray(field, dtype=np.float64), (p,))
    if not np.all(np.isfinite(h_row)):
        raise ValueError("field must be finite")

    g = _rng.generator(seed, _rng.STAGE_TESLA_GRAPH)

    def weights(n):
        mag = g.uniform(weight_low, weight_high, size=n)
        return np.where(g.random(n) < 0.5, -mag, mag)

    never = np.iinfo(np.int64).max // 4
    deg = np.zeros(p, dtype=np.int64)
    adj = np.zeros((p, p), dtype=bool)
    # one record per edge life: pair, weight, first time of the ramp up, first time of the ramp down
    pairs = [_add_edges(g, p, n_edges, deg, adj, max_degree, "initial")]
    w = [weights(n_edges)]
    t_on = [np.full(n_edges, -never, dtype=np.int64)]
    t_off = [np.full(n_edges, never, dtype=np.int64)]
    adj[pairs[0][:, 0], pairs[0][:, 1]] = True
    live = list(range(n_edges))  # record ids of the current edges, in order of creation
    n_rec = n_edges
    for t0 in rewire_points(T, rewire_every):
        if not n_rewire:
            break
        gone = np.sort(g.choice(len(live), size=n_rewire, replace=False))
        gone_ids = [live[k] for k in gone]
        gone_pairs = []
        for rid in gone_ids:
            blk, k = _locate(pairs, rid)
            t_off[blk][k] = t0
            gone_pairs.append(pairs[blk][k])
        gone_pairs = np.asarray(gone_pairs, dtype=np.int64).reshape(-1, 2)
        # while a disappearing edge ramps down it still counts towards the degrees (ramp = 1: it
        # is gone at t0 already); its pair cannot reappear at the same rewiring point
        if ramp == 1:
            np.subtract.at(deg, gone_pairs.ravel(), 1)
        new = _add_edges(g, p, n_rewire, deg, adj, max_degree, "appearing")
        if ramp > 1:  # gone before the next rewiring point (ramp <= rewire_every)
            np.subtract.at(deg, gone_pairs.ravel(), 1)
        adj[gone_pairs[:, 0], gone_pairs[:, 1]] = False
        adj[new[:, 0], new[:, 1]] = True
        pairs.append(new)
        w.append(weights(n_rewire))
        t_on.append(np.full(n_rewire, t0, dtype=np.int64))
        t_off.append(np.full(n_rewire, never, dtype=np.int64))
        gone_set = set(gone_ids)
        live = [r for r in live if r not in gone_set] + list(range(n_rec, n_rec + n_rewire))
        n_rec += n_rewire

    pairs_a = np.concatenate(pairs)
    w_a, on, off = np.concatenate(w), np.concatenate(t_on), np.concatenate(t_off)
    t = np.arange(T, dtype=np.int64)[:, None]
    # clip the offsets in int64 first (the sentinels +-never are far outside [-1, ramp])
    up = np.clip((np.clip(t - on[None], -1, ramp) + 1) / ramp, 0.0, 1.0)
    down = np.clip(1.0 - (np.clip(t - off[None], -1, ramp) + 1) / ramp, 0.0, 1.0)
    prof = w_a[None] * up * down  # [T, E]
    J = np.zeros((T, p, p), dtype=np.float64)
    for e in range(pairs_a.shape[0]):  # records of one pair never overlap in time; add to be safe
        i, j = pairs_a[e]
        J[:, i, j] += prof[:, e]
    J += J.transpose(0, 2, 1)
    h = np.repeat(h_row[None], T, axis=0).astype(np.float64)
    return GroundTruth(J=J, h=h)


def _locate(blocks, rid):
    for b, arr in enumerate(blocks):
        if rid < arr.shape[0]:
            return b, rid
        rid -= arr.shape[0]
    raise IndexError(rid)


def sample_time_point(
    seed: int, t: int, h_t, J_t, n: int, *, burn_in: int = 200, thin: int | None = None
) -> np.ndarray:
    """The ``n`` samples of time point ``t``: int8 [n, p] (module docstring, "Samples").

    Uses only ``rng.generator(seed, STAGE_TESLA_GIBBS, t)``, so any time point can be generated
    on its own.
    """
    n, burn_in = int(n), int(burn_in)
    if n < 1:
        raise ValueError(f"need at least one sample per time point; got {n}")
    if burn_in < 0:
        raise ValueError(f"burn_in must be >= 0; got {burn_in}")
    h_t, J_t = gibbs.check_parameters(h_t, J_t)
    g = _rng.generator(seed, _rng.STAGE_TESLA_GIBBS, int(t))
    p = h_t.shape[0]
    if thin is None:
        state = gibbs.init(g, p, n)
        state, _ = gibbs.step(g, state, h_t, J_t, burn_in)
        return state.spins
    thin = int(thin)
    if thin < 1:
        raise ValueError(f"thin must be None or >= 1; got {thin}")
    state = gibbs.init(g, p, 1)
    state, _ = gibbs.step(g, state, h_t, J_t, burn_in)
    out = np.empty((n, p), dtype=np.int8)
    out[0] = state.spins[0]
    for k in range(1, n):
        state, _ = gibbs.step(g, state, h_t, J_t, thin)
        out[k] = state.spins[0]
    return out


def time_varying_ising(
    seed: int,
    p: int = 20,
    T: int = 100,
    samples_per_time: int = 1,
    *,
    n_edges: int | None = None,
    rewire_every: int = 10,
    n_rewire: int = 2,
    max_degree: int = 4,
    weight_low: float = 0.5,
    weight_high: float = 1.0,
    ramp: int = 5,
    field=0.0,
    burn_in: int = 200,
    thin: int | None = None,
) -> SyntheticNetwork:
    """A synthetic time-varying Ising network and ``samples_per_time`` samples at each of ``T``
    time points (see the module docstring for every parameter).

    seed: master seed. p: number of nodes (>= 2). T: number of time points.
    n_edges: edges of the graph outside ramps (default ``p``). rewire_every: time points between
    rewiring points. n_rewire: edges that disappear (and as many that appear) at each rewiring
    point. max_degree: bound on every node's degree at every time point. weight_low, weight_high:
    range of |weight|. ramp: time points over which a weight moves between 0 and its value (1 =
    abrupt; at most rewire_every). field: node field h (scalar or [p]). burn_in: Gibbs sweeps per
    sample. thin: None for independent chains per sample, else sweeps between samples of one chain.
    """
    truth = ground_truth(
        seed,
        p,
        T,
        n_edges=n_edges,
        rewire_every=rewire_every,
        n_rewire=n_rewire,
        max_degree=max_degree,
        weight_low=weight_low,
        weight_high=weight_high,
        ramp=ramp,
        field=field,
    )
    X = np.empty((int(T), int(samples_per_time), int(p)), dtype=np.int8)
    for t in range(int(T)):
        X[t] = sample_time_point(seed, t, truth.h[t], truth.J[t], samples_per_time, burn_in=burn_in, thin=thin)
    return SyntheticNetwork(X=X, J=truth.J, h=truth.h, edges=edge_sets(truth.J))
