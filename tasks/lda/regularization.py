"""Posterior regularization (PR) of the local LDA E-step: seed words and a topic cap.

Reference: K. Ganchev, J. Graca, J. Gillenwater, B. Taskar, "Posterior regularization for
structured latent variable models", JMLR 11 (2010) 2001-2049 (sec. 2-3 for the KL projection and
its dual, sec. 7 for the L1/Linf "posterior sparsity" constraint used by the topic cap).

Setting
-------
One document with ``N`` unique words (ids ``w_n``, counts ``c_n > 0``) and ``K`` topics. The
unconstrained mean-field token posteriors are the rows ``p_n`` of an ``[N, K]`` matrix,
``p_n(k) ∝ exp(E[log theta_k] + E[log beta_{k, w_n}])``. All ``c_n`` tokens of word ``n`` share one
distribution ``q_n``, so the PR E-step is the count-weighted KL projection

    (P)   minimise   sum_n c_n KL(q_n || p_n)      over q_n in the simplex Delta_K,
          subject to q_n(k) >= l_nk                           (seed words)
                     q_n(k) <= xi_k,  sum_k xi_k <= cap        (topic cap, slack xi)

``l_nk`` is the largest seed mass ``m`` of an entry ``(w_n, k, m)`` (0 when word ``w_n`` is not
seeded to ``k``); in PR notation the seed constraint is ``E_q[-1(z_n = k)] <= -m``. The cap says
``sum_k max_n q_n(k) <= cap`` (at the optimum ``xi_k = max_n q_n(k)``); since the left side is
at least 1, ``cap >= 1`` is needed.

Dual (derivation)
-----------------
Multipliers ``alpha_nk >= 0`` (seeds; 0 where ``l_nk = 0``), ``lambda_nk >= 0`` (for
``q_n(k) <= xi_k``) and ``mu >= 0`` (budget). The Lagrangian is

    sum_n c_n KL(q_n||p_n) + sum_nk alpha_nk (l_nk - q_n(k)) + sum_nk lambda_nk (q_n(k) - xi_k)
                           + mu (sum_k xi_k - cap).

* ``xi`` (``xi >= 0`` may be added, it is implied by ``q >= 0``): ``inf_xi sum_k xi_k (mu -
  sum_n lambda_nk)`` is 0 if ``sum_n lambda_nk <= mu`` for every ``k`` and ``-inf`` otherwise.
* ``q_n``: ``inf_{q in Delta} c_n KL(q||p_n) + q . g_n = -c_n log Z_n`` with
  ``g_nk = lambda_nk - alpha_nk``, attained at

      q*_n(k) = p_n(k) exp(-(lambda_nk - alpha_nk) / c_n) / Z_n,
      Z_n     = sum_k p_n(k) exp(-(lambda_nk - alpha_nk) / c_n),

  i.e. the multipliers are divided by the count (one shared ``q_n`` carries ``c_n`` tokens).

So the dual is

    (D)   maximise  D(alpha, lambda, mu) = sum_nk alpha_nk l_nk - mu cap - sum_n c_n log Z_n
          over      alpha >= 0,  lambda >= 0,  mu >= 0,  sum_n lambda_nk <= mu  (every k)

with ``dD/dalpha_nk = l_nk - q_n(k)``, ``dD/dlambda_nk = q_n(k)``, ``dD/dmu = -cap``. Because
``dD/dlambda > 0``, every optimum has ``sum_n lambda_nk = mu``: for fixed ``mu`` the ``lambda``
of each topic lives on the scaled simplex ``mu Delta_N``, and by the envelope theorem the value
``D*(mu)`` of the inner problem is concave with ``D*'(mu) = sum_k max_n q_n(k; mu) - cap``.
Projected gradient on (D) would project each ``lambda_{., k}`` onto ``mu Delta_N`` and ``alpha``
onto the orthant and search ``mu`` in 1-D; that is correct but converges slowly, so the code
solves the same optimality conditions exactly as follows.

Exact reformulation used here (levels ``t``)
--------------------------------------------
The KKT conditions of (P)/(D) give, with ``t_k = xi_k`` and a row scale ``s_n = exp(nu_n) > 0``,

    q_n(k)     = clip(p_n(k) s_n, l_nk, t_k)                  (s_n normalises the row)
    lambda_nk  = c_n log(p_n(k) s_n / t_k)   where q_n(k) = t_k  ("capped"), else 0
    alpha_nk   = c_n log(l_nk / (p_n(k) s_n)) where q_n(k) = l_nk ("at its seed"), else 0
    S_k := sum_n lambda_nk = mu  for every topic with t_k > L_k := max_n l_nk,
    mu (sum_k t_k - cap) = 0.

For fixed levels ``t`` the rows decouple: ``q_n`` is the KL projection of ``p_n`` onto the box
``[l_n, t]`` intersected with the simplex, found exactly by a 1-D "water filling" of ``s_n``
(``sum_k clip(p_n(k) s, l_nk, t_k)`` is continuous, piecewise linear and nondecreasing in ``s``).
Its value ``G(t) = sum_n c_n KL(q_n(t)||p_n)`` is convex in ``t``, C^1 where every row keeps a
free entry, with

    dG/dt_k          = -S_k(t)
    d2G/dt_k dt_j    = delta_kj D_k / t_k + sum_{n: k, j in C_n} c_n / F_n

(``C_n``: capped topics of row ``n``, ``D_k = sum_{n: k in C_n} c_n``, ``F_n``: mass of the free
entries of row ``n``). The cap part of (P) is therefore ``min G(t)`` over
``{sum_k t_k = cap, t_k >= L_k}`` (the budget binds whenever the seed-only projection violates the
cap), whose KKT conditions are exactly the dual ones above, ``mu`` being the multiplier of the
sum. This K-dimensional problem is solved by a (semismooth) Newton method:

* direction: the Newton system restricted to ``sum d = 0`` (Jacobi-scaled Cholesky); topics on
  their seed bound ``t_k = L_k`` stay there unless ``S_k`` exceeds the estimate of ``mu`` and the
  direction moves them up; a topic that no token reaches (``D_k = 0``) moves down to its maximum
  ``max_n q_n(k)`` (``G`` does not change on the way) and the freed budget goes to the others;
* Hessian metric: on a seeded row ``F_n`` is replaced by the free mass above the seed bounds, which
  tends to 0 at the kink of ``G`` where all entries of the row sit on bounds (so Newton does not
  step across that kink back and forth);
* step: additive for topics moving down to a seed bound (they may land on it), multiplicative
  (``t_k exp(a d_k / t_k)``, then rescaled to ``sum t = cap``) for the others, which suits the
  ``t log t`` terms whose optimum may lie decades below the start; Armijo backtracking on ``G``,
  and a doubling extension of full steps whose slope stays steep (curvature overestimated);
* stop: Newton step ``max_k |d_k| <= 1e-2 tol`` with the relative KKT residual
  ``max_k |S_k - mu| / (mu + sum c) <= 1e-6`` (or ``G`` at its floating-point floor).

Every iterate is primal feasible (``q`` from the water filling of levels with ``sum t = cap``)
and ``G`` never increases; ``(alpha, lambda, mu = max_k S_k)`` is dual feasible, so the duality
gap ``P - D = mu cap - sum_k t_k S_k`` is a certificate (``info["gap"]``). Where a token sits on
both its seed and the cap (``l_nk = t_k``) only ``lambda_nk - alpha_nk`` is determined; the
reported multipliers raise both so that ``S_k = mu``.

Convergence and cost: typically 3-10 Newton iterations, each one O(N K) water filling plus an
O(K^3) solve (N = 100, K = 20: ~20-40 us per iteration in the kernel). Rows squeezed to a tiny
free mass (``cap`` within ~0.1 of 1 with very peaked ``p``) make ``G`` behave like ``F log F`` and
the method slows down (tens of iterations); the iterate stays feasible and is returned after
``max_iter`` iterations. ``p`` is floored at 1e-300.

Special cases
-------------
* Fast path: if ``p`` satisfies every constraint, ``q = p`` exactly and all multipliers are 0.
* Seeds only (or a cap the seed-only projection already meets): rows are independent,
  ``q_n = max(l_n, p_n s_n)`` with one water filling per row; ``lambda = 0``, ``mu = 0``.
* ``cap == 1``: every row must equal one distribution ``t``; then ``t`` is the KL projection of
  the count-weighted geometric mean ``g ∝ prod_n p_n^(c_n / C)`` onto ``{t >= L}`` (``C = sum c``).
* ``sum_k L_k == cap``: the levels are forced, ``t = L`` (topics without a seed get no mass;
  their multipliers are infinite).

Feasibility (what is checked)
-----------------------------
:func:`make_pr_config` rejects: topics or word ids out of range, masses outside ``(0, 1]``, a
word whose seed masses sum to more than 1, ``0 < cap < 1``, and seeds that a document containing
every seed word could not satisfy under the cap, i.e. ``sum_k max_{entries of topic k} m > cap``
(a document needs ``sum_k max_n q_n(k) >= sum_k L_k``). With ``allow_doc_infeasible=True`` that
last check is skipped; then a document whose own seeds need ``sum_k L_k > cap`` is projected with
its cap raised to ``sum_k L_k`` (the smallest feasible one), and ``project_numpy`` reports
``info["cap_relaxed"] = True``. The kernel applies the same rules (it raises nothing); it also
treats ``0 < cap < 1`` as ``cap = 1``.

Functions
---------
:func:`project_numpy` is the NumPy reference, :func:`project_kernel` returns the numba kernel
(same algorithm and decisions, for use inside a numba E-step), :func:`primal_solve_scipy` solves
(P) directly with SLSQP (the independent check of the tests), :func:`dual_value` evaluates (D).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from pgmflow.tasks import backend
from pgmflow.tasks.lda import pr_kernels  # the numba kernels, compiled on first use
from pgmflow.tasks.lda.pr_kernels import _SUM_TOL, _T_FLOOR, _TINY  # shared with the kernels

__all__ = [
    "PRConfig",
    "constraint_values",
    "doc_lower_bounds",
    "dual_value",
    "empty_pr_config",
    "is_active",
    "make_pr_config",
    "primal_solve_scipy",
    "project_kernel",
    "project_numpy",
]


class PRConfig(NamedTuple):
    """Constraints of the PR E-step (see the module docstring)."""

    seed_word_ids: np.ndarray  # int64 [S] sorted ascending (word ids), may be empty
    seed_topics: np.ndarray  # int64 [S] topic of each seed entry
    seed_mass: np.ndarray  # float64 [S] minimum mass m of each entry
    cap: float  # topic cap (sum_k max_n q_n(k) <= cap); <= 0 or inf means no cap
    max_iter: int = 200  # Newton iterations on the levels (the dual optimality conditions)
    tol: float = 1e-6  # stop when the Newton step in t is <= 1e-2 tol (and the KKT residual small)


def empty_pr_config() -> PRConfig:
    """A configuration without constraints (the projection is the identity)."""
    return PRConfig(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64), math.inf, 200, 1e-6)


def _cap_active(cap: float) -> bool:
    return bool(cap > 0.0 and math.isfinite(cap))


def is_active(pr: PRConfig) -> bool:
    """Whether ``pr`` constrains anything (some seed entry, or a finite positive cap)."""
    return len(pr.seed_word_ids) > 0 or _cap_active(float(pr.cap))


def make_pr_config(
    seed_words: dict | None,
    seed_mass: float | dict,
    cap: float | None,
    n_topics: int,
    n_words: int,
    max_iter: int = 200,
    tol: float = 1e-6,
    *,
    allow_doc_infeasible: bool = False,
) -> PRConfig:
    """Validate and pack PR settings.

    ``seed_words`` maps topic -> list of word ids (``None`` or ``{}``: no seeds). ``seed_mass``
    is one mass for every entry, or a dict keyed by topic (``{k: m}``) or by ``(topic, word)``.
    ``cap`` is the topic cap; ``None``, ``0`` or ``inf`` means no cap. A word listed twice for one
    topic keeps its largest mass. Raises ``ValueError`` for malformed or infeasible settings (see
    the module docstring, "Feasibility").
    """
    n_topics = int(n_topics)
    n_words = int(n_words)
    if n_topics < 1 or n_words < 1:
        raise ValueError(f"n_topics and n_words must be >= 1 (got {n_topics}, {n_words})")
    if int(max_iter) < 1:
        raise ValueError(f"max_iter must be >= 1 (got {max_iter})")
    if not (tol > 0 and math.isfinite(tol)):
        raise ValueError(f"tol must be a positive number (got {tol})")

    # --- cap
    if cap is None:
        capv = math.inf
    else:
        capv = float(cap)
        if math.isnan(capv) or capv < 0:
            raise ValueError(f"topic cap must be >= 1 (or None/0/inf for no cap), got {cap}")
        if capv == 0:
            capv = math.inf
        elif capv < 1.0:
            raise ValueError(
                f"topic cap {cap} < 1: no distribution can satisfy sum_k max_n q_n(k) <= cap, "
                "since that sum is always >= 1"
            )

    # --- seeds
    entries: dict[tuple[int, int], float] = {}
    for topic, words in (seed_words or {}).items():
        k = int(topic)
        if not 0 <= k < n_topics:
            raise ValueError(f"seed topic {topic} out of range [0, {n_topics})")
        for w in words:
            w = int(w)
            if not 0 <= w < n_words:
                raise ValueError(f"seed word id {w} (topic {k}) out of range [0, {n_words})")
            if isinstance(seed_mass, dict):
                if (k, w) in seed_mass:
                    m = seed_mass[(k, w)]
                elif k in seed_mass:
                    m = seed_mass[k]
                else:
                    raise ValueError(f"seed_mass has no entry for topic {k} (word {w})")
            else:
                m = seed_mass
            m = float(m)
            if not (0.0 < m <= 1.0):
                raise ValueError(f"seed mass {m} of word {w} on topic {k} is outside (0, 1]")
            entries[(w, k)] = max(m, entries.get((w, k), 0.0))
    keys = sorted(entries)
    wids = np.array([w for w, _ in keys], dtype=np.int64)
    tops = np.array([k for _, k in keys], dtype=np.int64)
    mass = np.array([entries[key] for key in keys], dtype=np.float64)
    if len(wids):
        per_word = np.zeros(n_words)
        np.add.at(per_word, wids, mass)
        bad = np.flatnonzero(per_word > 1.0 + _SUM_TOL)
        if len(bad):
            w = int(bad[0])
            raise ValueError(
                f"seed masses of word {w} sum to {per_word[w]:.6g} > 1: no distribution can satisfy "
                f"all of them (topics {tops[wids == w].tolist()})"
            )
        if math.isfinite(capv) and not allow_doc_infeasible:
            top_max = np.zeros(n_topics)
            np.maximum.at(top_max, tops, mass)
            need = float(top_max.sum())
            if need > capv + _SUM_TOL:
                raise ValueError(
                    f"seeds force mass on {int((top_max > 0).sum())} topics totalling sum_k max m = {need:.6g} > cap = "
                    f"{capv:.6g}: no distribution can satisfy both the seeds and the cap in a document containing "
                    "all seed words (raise the cap, lower the masses, or pass allow_doc_infeasible=True)"
                )
    return PRConfig(wids, tops, mass, capv, int(max_iter), float(tol))


# ------------------------------------------------------------------------------------------------
# NumPy reference
# ------------------------------------------------------------------------------------------------


def doc_lower_bounds(word_ids, pr: PRConfig, n_topics: int) -> np.ndarray:
    """The seed lower bounds ``l`` [N, K] of a document (0 where a word is not seeded)."""
    word_ids = np.asarray(word_ids, dtype=np.int64)
    lo = np.zeros((len(word_ids), n_topics))
    sw = np.asarray(pr.seed_word_ids, dtype=np.int64)
    if len(sw) == 0:
        return lo
    i0 = np.searchsorted(sw, word_ids, side="left")
    i1 = np.searchsorted(sw, word_ids, side="right")
    for n in np.flatnonzero(i1 > i0):
        for j in range(i0[n], i1[n]):
            k = int(pr.seed_topics[j])
            if 0 <= k < n_topics:
                lo[n, k] = max(lo[n, k], float(pr.seed_mass[j]))
    return lo


def _waterfill_np(p, lo, up):
    """Row-wise KL projection of ``p`` onto ``{lo <= q <= up, sum q = 1}``: ``q = clip(p s, lo, up)``.

    ``h(s) = sum_k clip(p_k s, lo_k, up_k)`` is continuous, piecewise linear and nondecreasing with
    breakpoints ``lo/p`` and ``up/p``: find the first breakpoint where ``h >= 1``, classify the
    entries in the interval before it, and solve the linear piece. Returns ``(q, s)``.
    """
    N, K = p.shape
    X = np.sort(np.concatenate([lo / p, up / p], axis=1), axis=1)  # [N, 2K]
    H = np.clip(p[:, None, :] * X[:, :, None], lo[:, None, :], up[:, None, :]).sum(axis=2)
    hit = H >= 1.0
    j = np.where(hit.any(axis=1), np.argmax(hit, axis=1), 2 * K - 1)
    rows = np.arange(N)
    hi = X[rows, j]
    lo_x = np.where(j > 0, X[rows, np.maximum(j - 1, 0)], 0.0)
    pm = p * (0.5 * (lo_x + hi))[:, None]
    at_lo = pm <= lo
    at_up = ~at_lo & (pm >= up)
    free = ~at_lo & ~at_up
    fixed = np.where(at_lo, lo, 0.0).sum(axis=1) + np.where(at_up, up, 0.0).sum(axis=1)
    fp = np.where(free, p, 0.0).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(fp > 0, (1.0 - fixed) / fp, hi)
    s = np.where(H[rows, j] == 1.0, hi, s)
    s = np.clip(s, lo_x, hi)
    q = np.clip(p * s[:, None], lo, up)
    return q, s


def _kl_rows(q, p):
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(q > 0, q * np.log(q / p), 0.0)
    return v.sum(axis=1)


def _info(N, K, **kw):
    out = {
        "lambda": np.zeros((N, K)),
        "alpha": np.zeros((N, K)),
        "mu": 0.0,
        "t": None,
        "iterations": 0,
        "violation": 0.0,
        "converged": True,
        "gap": 0.0,
        "cap_relaxed": False,
        "history": [],
    }
    out.update(kw)
    return out


def _multipliers_np(p, c, lo, t, q, s):
    """Dual point ``(lambda, alpha, mu)`` from water-filled rows ``q = clip(p s, l, t)`` (module
    docstring) and its duality gap. ``t`` is None without a cap. Topics where a token sits on both
    its seed and the cap get ``lambda`` (and ``alpha``) of that token raised until ``S_k = mu``."""
    N, K = p.shape
    ps = p * s[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha = np.where((lo > 0) & (q <= lo) & (ps < lo), c[:, None] * np.log(lo / ps), 0.0)
        if t is None:
            return np.zeros((N, K)), alpha, 0.0, 0.0
        capped = (q >= t[None, :]) & (ps >= t[None, :])
        lam = np.where(capped, c[:, None] * np.log(ps / t[None, :]), 0.0)
    S = lam.sum(axis=0)
    mu = float(S.max()) if K else 0.0
    both = (lo > 0) & (q <= lo) & (lo >= t[None, :] * (1 - 1e-12))  # on its seed and on the cap
    for k in np.flatnonzero(both.any(axis=0) & (S < mu)):
        n = int(np.flatnonzero(both[:, k])[0])
        add = mu - S[k]
        lam[n, k] += add
        alpha[n, k] += add
        S[k] = mu
    M = q.max(axis=0)
    gap = float(mu * t.sum() - (M * S).sum()) if np.isfinite(mu) else 0.0
    return lam, alpha, mu, max(gap, 0.0)


def _evaluate_np(p, c, lo, t):
    """Rows for levels ``t``: ``q``, ``s``, ``G``, ``S``, ``D``, capped indicator, ``c / F~``
    (``F~``: free mass above the seed bounds) and ``M = max_n q``."""
    if not np.all(np.isfinite(t)) or np.minimum(t, 1.0).sum() < 1.0 - 1e-12:
        return {"G": math.inf}
    q, s = _waterfill_np(p, lo, np.broadcast_to(t, p.shape))
    if not np.all(np.isfinite(s)):  # a row squeezed beyond floating point: reject the point
        return {"G": math.inf}
    ps = p * s[:, None]
    capped = ps >= t[None, :] * (1 - 1e-12)  # on the level (to rounding): beta >= 0
    with np.errstate(divide="ignore", invalid="ignore"):
        beta = np.where(capped, np.maximum(np.log(ps / t[None, :]), 0.0), 0.0)
    S = (c[:, None] * beta).sum(axis=0)
    D = (c[:, None] * capped).sum(axis=0)
    at_lo = (lo > 0) & (q <= lo) & ~capped
    # Hessian metric: free mass above the seed bounds. Without seeds it is the free mass F_n of the
    # exact Hessian; on a seeded row it tends to 0 when the row approaches the kink where all its
    # entries sit on bounds, so that the Newton model treats that hyperplane like a barrier
    # instead of stepping across the kink back and forth.
    Ft = np.where(capped | at_lo, 0.0, q - lo).sum(axis=1)
    cF = c / np.maximum(Ft, 1e-12)
    G = float((c * _kl_rows(q, p)).sum())
    return {"q": q, "s": s, "G": G, "S": S, "D": D, "capped": capped.astype(float), "cF": cF, "M": q.max(axis=0)}


def _newton_direction_np(t, S, D, capped, cF, L, slack, M):
    """Newton direction for ``min G(t)`` s.t. ``sum t = cap``, ``t >= L`` (module docstring).

    Slack topics (no token on their level) move down to ``M``; the budget they free goes to the
    others. Topics on their seed bound stay there unless their ``S_k`` exceeds the estimate of
    ``mu`` and the resulting direction moves them up. Returns ``(d, theta, n_free)``; ``theta``
    estimates ``mu``.
    """
    K = len(t)
    d = np.zeros(K)
    d[slack] = M[slack] - t[slack]
    r = -d[slack].sum()
    at_bound = ~slack & (L > 0) & (t <= L * (1 + 1e-12))
    pinned = at_bound.copy()
    no_release = np.zeros(K, dtype=bool)
    Hfull = (capped.T * cF) @ capped + np.diag(D / t)
    theta = 0.0
    for _ in range(2 * K + 2):
        idx = np.flatnonzero(~slack & ~pinned)
        d[~slack] = 0.0
        if len(idx) == 0:
            release = pinned & ~no_release & (S > 0)
            if r > 0 and release.any():  # budget freed by slack topics goes to bound topics that want it
                pinned &= ~release
                continue
            return d, theta, 0
        Hf = Hfull[np.ix_(idx, idx)]
        sc = 1.0 / np.sqrt(np.maximum(np.diag(Hf), 1e-300))  # Jacobi scaling: the diagonal spans decades
        Hs = Hf * sc[:, None] * sc[None, :] + np.eye(len(idx)) * 1e-14
        a = sc * np.linalg.solve(Hs, sc * S[idx])  # H^{-1} (-grad)
        b = sc * np.linalg.solve(Hs, sc)  # H^{-1} 1
        theta = (a.sum() - r) / b.sum()
        d[idx] = a - theta * b
        down = at_bound & ~pinned & (d < 0)
        if down.any():
            pinned |= down
            no_release |= down
            continue
        release = pinned & ~no_release & (S > theta * (1 + 1e-12) + 1e-300)
        if release.any():
            pinned &= ~release
            continue
        break
    return d, theta, int((~slack & ~pinned).sum())


def _path_np(t, d, a, L, slack, cap):
    """Point at step ``a`` along ``d``: additive for slack topics and for topics moving down towards
    a positive seed bound (they may land on it), multiplicative (``t exp(a d / t)``) for the others,
    whose part above ``L`` is then rescaled so that ``sum t = cap``. Relative moves suit the
    ``t log t`` terms of ``G``, whose optimum may lie many decades below the start."""
    add = slack | ((L > 0) & (d < 0))
    mult = ~add
    tn = t.copy()
    # slack topics move to their maximum M = t + d and no further (a > 1 only extends the rest)
    tn[add] = np.maximum(t[add] + np.where(slack[add], min(a, 1.0), a) * d[add], np.maximum(L[add], _T_FLOOR))
    if mult.any():
        lm = np.log(t[mult]) + np.clip(a * d[mult] / t[mult], -700.0, 700.0)
        lmax = lm.max()
        ex = np.maximum(np.exp(lm - lmax) - L[mult] * math.exp(min(-lmax, 700.0)), 0.0)
        room = cap - tn[add].sum() - L[mult].sum()
        tot = ex.sum()
        tn[mult] = L[mult] + (ex * (room / tot) if tot > 0 else 0.0)
        tn[mult] = np.maximum(tn[mult], np.maximum(L[mult], _T_FLOOR))
    return tn


def _newton_np(p, c, lo, L, q0, cap, max_iter, tol):
    """Minimise ``G(t)`` over ``{sum t = cap, t >= L}`` (see the module docstring)."""
    M0 = q0.max(axis=0)
    t = L + (M0 - L) * ((cap - L.sum()) / (M0.sum() - L.sum()))
    t = np.maximum(t, np.maximum(L, _T_FLOOR))
    ev = _evaluate_np(p, c, lo, t)
    tol_t = max(1e-2 * tol, 1e-14)
    csum = float(c.sum())
    history = [ev["G"]]
    converged = False
    it = 0
    G_prev = math.inf
    n_stag = 0
    while it < max_iter:
        it += 1
        fixed = ev["D"] == 0  # no token on the level: moves (down) to its maximum M, G unchanged
        slack = fixed & (ev["M"] < t * (1 - 1e-12))
        d, theta, nfree = _newton_direction_np(t, ev["S"], ev["D"], ev["capped"], ev["cF"], L, fixed, ev["M"])
        if nfree == 0 and not slack.any():
            converged = True
            break
        if not np.all(np.isfinite(d)):
            break
        step = float(np.abs(d).max())
        slope = -float(ev["S"] @ d)
        neg = (d < 0) & ~fixed & (L > 0)
        a_lim = float(((t[neg] - L[neg]) / -d[neg]).min()) if neg.any() else math.inf
        amax = min(1.0, a_lim)
        free = ~fixed & ((L == 0) | (t > L * (1 + 1e-12)) | (d != 0))
        resid = float(np.abs(ev["S"][free] - theta).max(initial=0.0)) / (abs(theta) + csum)
        stagnant = G_prev - ev["G"] <= 2e-15 * (abs(ev["G"]) + csum)
        if slope >= 0 or (step <= tol_t and not slack.any() and (resid <= 1e-6 or stagnant)):
            if slope < 0:
                tn = _path_np(t, d, amax, L, fixed, cap)
                evn = _evaluate_np(p, c, lo, tn)
                if evn["G"] <= ev["G"]:
                    t, ev = tn, evn
                    history.append(ev["G"])
            converged = step <= tol_t or resid <= 1e-6
            break
        a = amax
        ok = False
        for _ in range(60):
            tn = _path_np(t, d, a, L, fixed, cap)
            evn = _evaluate_np(p, c, lo, tn)
            if evn["G"] <= ev["G"] + 1e-4 * a * slope:
                ok = True
                break
            a *= 0.5
        if not ok:
            converged = resid <= 1e-6
            break
        if a == 1.0 and -float(evn["S"] @ d) <= 0.5 * slope:
            # the quadratic model overestimates the curvature (x log x terms far from their
            # optimum): extend the step while G keeps decreasing
            for _ in range(60):
                if 2.0 * a > a_lim:
                    break
                tx = _path_np(t, d, 2.0 * a, L, fixed, cap)
                evx = _evaluate_np(p, c, lo, tx)
                if not evx["G"] < evn["G"]:
                    break
                a, tn, evn = 2.0 * a, tx, evx
        G_prev = ev["G"]
        moved = float(np.abs(tn - t).max())
        t, ev = tn, evn
        history.append(ev["G"])
        # at the floating-point floor of G (e.g. rows squeezed to a free mass near 0): stop after
        # three iterations without a measurable decrease once t has stopped moving
        n_stag = n_stag + 1 if G_prev - ev["G"] <= 2e-15 * (abs(ev["G"]) + csum) else 0
        if n_stag >= 3:
            converged = moved <= tol_t
            break
    return t, ev["q"], ev["s"], it, converged, history


def project_numpy(p, counts, word_ids, pr: PRConfig):
    """Reference PR projection (NumPy). Returns ``(q [N, K], info)``.

    ``info``: ``lambda`` [N, K] (cap multipliers), ``alpha`` [N, K] (seed multipliers, per word
    and topic), ``mu`` (budget multiplier), ``t`` (levels of the cap, or None), ``iterations``
    (Newton iterations), ``violation`` (largest constraint violation of ``q``), ``converged``,
    ``gap`` (duality gap of ``(q, lambda, alpha, mu)``, count-weighted KL units), ``cap_relaxed``
    and ``history`` (``G`` along the iterations; nonincreasing).
    """
    p = np.asarray(p, dtype=np.float64)
    c = np.asarray(counts, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError("p must be a 2-D array [N, K]")
    N, K = p.shape
    if c.shape != (N,) or len(word_ids) != N:
        raise ValueError("counts and word_ids must have one entry per row of p")
    if N == 0 or K == 0:
        return p.copy(), _info(N, K)
    pf = np.maximum(p, _TINY)
    lo = doc_lower_bounds(word_ids, pr, K)
    capv = float(pr.cap) if _cap_active(float(pr.cap)) else math.inf
    viol_rows = (p < lo).any(axis=1)

    # fast path: p satisfies everything
    if not viol_rows.any() and (capv == math.inf or p.max(axis=0).sum() <= capv):
        return p.copy(), _info(N, K)

    # seeds only (rows are independent)
    q = p.copy()
    s = np.ones(N)
    if viol_rows.any():
        q[viol_rows], s[viol_rows] = _waterfill_np(pf[viol_rows], lo[viol_rows], np.ones((int(viol_rows.sum()), K)))
    if capv == math.inf or q.max(axis=0).sum() <= capv:
        _, alpha, _, _ = _multipliers_np(pf, c, lo, None, q, s)
        return q, _info(N, K, alpha=alpha, violation=_violation(q, lo, capv))

    # the cap binds
    L = lo.max(axis=0)
    sumL = float(L.sum())
    capE = max(capv, 1.0)
    relaxed = sumL > capE
    if relaxed:
        capE = sumL
    it, converged, history = 0, True, []
    if capE - sumL <= _SUM_TOL * capE:  # levels forced: t = L
        t = L.copy()
        q, s = _waterfill_np(pf, lo, np.broadcast_to(t, pf.shape))
    elif capE <= 1.0 + _SUM_TOL:  # cap == 1: all rows equal t = projected geometric mean
        g = np.exp(
            (c[:, None] * np.log(pf)).sum(axis=0) / c.sum() - (c[:, None] * np.log(pf)).sum(axis=0).max() / c.sum()
        )
        t, _ = _waterfill_np((g / g.sum())[None, :], L[None, :], np.ones((1, K)))
        t = t[0]
        q = np.broadcast_to(t, (N, K)).copy()
        s = (t[None, :] / pf).max(axis=1)
    else:
        t, q, s, it, converged, history = _newton_np(pf, c, lo, L, q, capE, int(pr.max_iter), float(pr.tol))
    lam, alpha, mu, gap = _multipliers_np(pf, c, lo, t, q, s)
    return q, _info(
        N,
        K,
        **{"lambda": lam},
        alpha=alpha,
        mu=mu,
        t=t,
        iterations=it,
        converged=converged,
        gap=gap,
        cap_relaxed=relaxed,
        violation=_violation(q, lo, capE),
        history=history,
    )


def _violation(q, lo, cap):
    v = float(np.max(lo - q, initial=0.0)) if lo.size else 0.0
    if math.isfinite(cap):
        v = max(v, float(q.max(axis=0).sum() - cap))
    return max(v, 0.0)


def constraint_values(q, counts, word_ids, pr: PRConfig) -> dict:
    """``seed_min_violation``: ``max(0, max_{seeded n,k} l_nk - q_n(k))``; ``topics_used``:
    ``sum_k max_n q_n(k)``; ``cap_violation``: ``max(0, topics_used - cap)`` (0 without a cap)."""
    q = np.asarray(q, dtype=np.float64)
    lo = doc_lower_bounds(word_ids, pr, q.shape[1])
    used = float(q.max(axis=0).sum()) if q.shape[0] else 0.0
    seed_v = float(np.max(np.where(lo > 0, lo - q, 0.0), initial=0.0))
    cap_v = max(0.0, used - float(pr.cap)) if _cap_active(float(pr.cap)) else 0.0
    return {"seed_min_violation": max(seed_v, 0.0), "topics_used": used, "cap_violation": cap_v}


def dual_value(p, counts, word_ids, pr: PRConfig, lam, alpha, mu) -> float:
    """The dual objective ``D(alpha, lambda, mu)`` of the module docstring (``lam``, ``alpha``:
    [N, K]; only ``alpha`` on seeded (n, k) counts). Any feasible point bounds the primal optimum
    from below."""
    p = np.maximum(np.asarray(p, dtype=np.float64), _TINY)
    c = np.asarray(counts, dtype=np.float64)
    lo = doc_lower_bounds(word_ids, pr, p.shape[1])
    alpha = np.where(lo > 0, alpha, 0.0)
    cap = float(pr.cap) if _cap_active(float(pr.cap)) else 0.0
    e = -(lam - alpha) / c[:, None]
    mx = e.max(axis=1, keepdims=True)
    logz = np.log((p * np.exp(e - mx)).sum(axis=1)) + mx[:, 0]
    return float((alpha * lo).sum() - mu * cap - (c * logz).sum())


def primal_solve_scipy(p, counts, word_ids, pr: PRConfig) -> np.ndarray:
    """Solve (P) directly with SLSQP (small N, K only): variables ``q`` [N*K] (bounds ``[l, 1]``)
    and, with a cap, ``xi`` [K]; the independent check of the tests."""
    from scipy.optimize import minimize

    p = np.maximum(np.asarray(p, dtype=np.float64), _TINY)
    c = np.asarray(counts, dtype=np.float64)
    N, K = p.shape
    lo = doc_lower_bounds(word_ids, pr, K)
    capv = float(pr.cap) if _cap_active(float(pr.cap)) else math.inf
    use_cap = math.isfinite(capv)
    nq = N * K
    nx = nq + (K if use_cap else 0)
    logp = np.log(p)
    floor = 1e-14
    scale = 1.0 / c.sum()

    def f(x):
        qq = np.maximum(x[:nq].reshape(N, K), floor)
        return scale * float((c[:, None] * qq * (np.log(qq) - logp)).sum())

    def grad(x):
        qq = np.maximum(x[:nq].reshape(N, K), floor)
        g = np.zeros(nx)
        g[:nq] = (scale * c[:, None] * (np.log(qq) - logp + 1.0)).ravel()
        return g

    A_eq = np.zeros((N, nx))
    for n in range(N):
        A_eq[n, n * K : (n + 1) * K] = 1.0
    cons = [{"type": "eq", "fun": lambda x: A_eq @ x - 1.0, "jac": lambda x: A_eq}]
    bounds = [(max(lo[n, k], floor), 1.0) for n in range(N) for k in range(K)]
    x0 = np.zeros(nx)
    q0 = np.maximum(p, lo)
    x0[:nq] = (q0 / q0.sum(axis=1, keepdims=True)).ravel()
    if use_cap:
        A_in = np.zeros((nq + 1, nx))
        for n in range(N):
            for k in range(K):
                A_in[n * K + k, nq + k] = 1.0
                A_in[n * K + k, n * K + k] = -1.0
        A_in[nq, nq:] = -1.0
        b_in = np.zeros(nq + 1)
        b_in[nq] = capv
        cons.append({"type": "ineq", "fun": lambda x: A_in @ x + b_in, "jac": lambda x: A_in})
        bounds += [(0.0, 1.0)] * K
        x0[nq:] = x0[:nq].reshape(N, K).max(axis=0)
    res = minimize(
        f, x0, jac=grad, method="SLSQP", bounds=bounds, constraints=cons, options={"ftol": 1e-15, "maxiter": 5000}
    )
    q = np.maximum(res.x[:nq].reshape(N, K), 0.0)
    return q / q.sum(axis=1, keepdims=True)


# ------------------------------------------------------------------------------------------------
# numba kernel
# ------------------------------------------------------------------------------------------------


def project_kernel():
    """The numba kernel ``project(p, counts, word_ids, seed_word_ids, seed_topics, seed_mass, cap,
    max_iter, tol, q_out) -> int``.

    Same algorithm and decisions as :func:`project_numpy` (``p`` [N, K] float64 with rows summing
    to 1, ``counts`` float64 [N], ``word_ids`` int64 [N], the three seed arrays of a
    :class:`PRConfig`, ``cap`` float, ``max_iter`` int, ``tol`` float; writes ``q_out`` [N, K]).
    Returns the number of Newton iterations: 0 when no cap binds (fast path ``q = p`` or seed-only
    projection), ``max_iter`` when the stopping test was not met (``q_out`` is then still feasible:
    the best iterate). Raises nothing; allocates only small work arrays (a few [N, K] buffers when
    a cap binds). ``q_out`` may be ``p`` itself (in place). Pass C-contiguous arrays (another layout
    compiles another specialisation). Callable from other njit code, e.g. once per document and
    E-step iteration; compiled once per process (cached on disk).
    """
    return _numba_kernels()["project"]


@functools.cache
def _numba_kernels():
    """The numba kernels of :mod:`pgmflow.tasks.lda.pr_kernels`, compiled on first use by
    :func:`pgmflow.tasks.backend.compile_kernels`; a dict of njit dispatchers."""
    k = backend.compile_kernels(pr_kernels)
    return {
        "project": k["_project_nb"],
        "wf_upper": k["_wf_upper"],
        "wf_lower": k["_wf_lower"],
        "wf_general": k["_wf_general"],
        "evaluate": k["_evaluate_nb"],
    }
