"""Exact partition functions and moments for the targets of parallel tempering.

Known answers that the samplers and the log-Z estimators are tested against.

Ising convention (shared with :mod:`pgmflow.tasks.tempering.targets`): spins ``s[i, j] = +-1`` on an
``m x n`` periodic lattice (``m`` rows, ``n`` columns); ``bonds_h[i, j]`` couples ``(i, j)`` with
``(i, (j + 1) % n)`` and ``bonds_v[i, j]`` couples ``(i, j)`` with ``((i + 1) % m, j)``;

    E(s) = -sum_bonds J_abs * bond * s_a s_b - sum_i h_i s_i,      Z(beta) = sum_s exp(-beta E(s)).

Bond signs are normally int8 in {+1, -1}; any real array works here. ``h`` is a scalar or an
``[m, n]`` array of site fields. "Per site" means divided by ``N = m n``.

Contents
--------
- :func:`ising_energy` -- E(s) for a batch of configurations.
- :func:`ising_log_z_enumeration` -- brute force over all 2^N states (N <= 24).
- :func:`ising_log_z_transfer_matrix` -- row-to-row transfer matrix, exact for any bonds and
  fields, widths up to ~12 (the shorter side is used as the width).
- :func:`kaufman_log_z`, :func:`kaufman_mean_energy`, :func:`kaufman_specific_heat` -- the
  ferromagnetic zero-field torus of any size (Kaufman 1949), in log space.
- :func:`onsager_log_z_per_site`, :func:`onsager_mean_energy_per_site` -- infinite lattice.
- :func:`critical_temperature` -- T_c = 2 J / ln(1 + sqrt 2).
- :func:`gaussian_mixture_log_z` -- the unnormalised isotropic Gaussian mixture.

Only numpy and scipy are imported.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import integrate, special

__all__ = [
    "ising_energy",
    "ising_log_z_enumeration",
    "ising_log_z_transfer_matrix",
    "kaufman_log_z",
    "kaufman_mean_energy",
    "kaufman_specific_heat",
    "onsager_log_z_per_site",
    "onsager_mean_energy_per_site",
    "critical_temperature",
    "gaussian_mixture_log_z",
]

_MAX_ENUM_SITES = 24
_MAX_TM_WIDTH = 12


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def _lattice(bonds_h, bonds_v, h):
    """Validate and return float arrays ``bonds_h, bonds_v, h`` all of shape [m, n]."""
    bh = np.asarray(bonds_h, dtype=np.float64)
    bv = np.asarray(bonds_v, dtype=np.float64)
    if bh.ndim != 2 or bh.shape != bv.shape:
        raise ValueError(f"bonds_h and bonds_v must be 2-D arrays of one shape [m, n]; got {bh.shape} and {bv.shape}")
    m, n = bh.shape
    if m < 1 or n < 1:
        raise ValueError(f"lattice shape must be at least 1 x 1; got {bh.shape}")
    hf = np.broadcast_to(np.asarray(h, dtype=np.float64), (m, n)).copy()
    return bh, bv, hf


def ising_energy(spins, bonds_h, bonds_v, J_abs, h=0.0):
    """Energy ``E(s) = -sum_bonds J_abs*bond*s_a*s_b - sum_i h_i s_i`` of a batch of states.

    Args:
        spins: [..., m, n] array of +-1.
        bonds_h, bonds_v: [m, n] bond signs (see module docstring).
        J_abs: coupling magnitude.
        h: scalar or [m, n] field.

    Returns:
        float64 array of shape [...].
    """
    bh, bv, hf = _lattice(bonds_h, bonds_v, h)
    s = np.asarray(spins, dtype=np.float64)
    right = np.roll(s, -1, axis=-1)  # s[i, (j+1) % n]
    down = np.roll(s, -1, axis=-2)  # s[(i+1) % m, j]
    pair = (s * right * bh).sum(axis=(-2, -1)) + (s * down * bv).sum(axis=(-2, -1))
    return -float(J_abs) * pair - (s * hf).sum(axis=(-2, -1))


# ----------------------------------------------------------------------------------------------
# 1. brute-force enumeration
# ----------------------------------------------------------------------------------------------


def ising_log_z_enumeration(bonds_h, bonds_v, J_abs, h, beta, chunk_bits=16):
    """Exact log Z and moments by enumerating all ``2^N`` configurations (N = m n <= 24).

    Configurations are generated in chunks of ``2^chunk_bits`` (bit k of the state index is site
    k in row-major order, bit 1 -> spin +1); the sums are accumulated online with a running
    log-sum-exp shift, so any ``beta`` (also negative) is safe.

    Args:
        bonds_h, bonds_v: [m, n] bond signs.
        J_abs: coupling magnitude.
        h: scalar or [m, n] field.
        beta: inverse temperature.

    Returns:
        dict with
            ``log_z``: log Z (total, not per site);
            ``log_z_per_site``: log Z / N;
            ``mean_energy``: <E> / N;
            ``specific_heat``: beta^2 Var(E) / N;
            ``mean_m``: <M> / N with M = sum_i s_i;
            ``mean_abs_m``: <|M|> / N;
            ``mean_m2``: <(M/N)^2>;
            ``susceptibility``: beta Var(M) / N;
            ``n_sites``: N.
    """
    bh, bv, hf = _lattice(bonds_h, bonds_v, h)
    m, n = bh.shape
    N = m * n
    if N > _MAX_ENUM_SITES:
        raise ValueError(
            f"enumeration needs N = m*n <= {_MAX_ENUM_SITES}; got {m}x{n} = {N}; "
            f"use ising_log_z_transfer_matrix instead"
        )
    beta = float(beta)
    total = 1 << N
    chunk = min(total, 1 << int(chunk_bits))
    shifts = np.arange(N, dtype=np.int64)
    shift = -np.inf  # running max of -beta E
    cE = cM = 0.0  # centres: E and M of the current most probable state
    acc = np.zeros(6)  # sum w * [1, E-cE, (E-cE)^2, M-cM, (M-cM)^2, |M|]
    for start in range(0, total, chunk):
        idx = np.arange(start, start + chunk, dtype=np.int64)
        bits = (idx[:, None] >> shifts[None, :]) & 1  # [chunk, N]
        s = (2 * bits - 1).astype(np.float64).reshape(-1, m, n)  # [chunk, m, n]
        E = ising_energy(s, bh, bv, J_abs, hf)  # [chunk]
        M = s.sum(axis=(1, 2))  # [chunk]
        logw = -beta * E
        k = int(np.argmax(logw))
        if logw[k] > shift:
            # rescale to the new shift and re-centre the accumulated central sums
            acc *= math.exp(shift - logw[k]) if np.isfinite(shift) else 0.0
            dE, dM = cE - float(E[k]), cM - float(M[k])
            acc[2] += 2.0 * dE * acc[1] + dE * dE * acc[0]
            acc[1] += dE * acc[0]
            acc[4] += 2.0 * dM * acc[3] + dM * dM * acc[0]
            acc[3] += dM * acc[0]
            shift, cE, cM = float(logw[k]), float(E[k]), float(M[k])
        w = np.exp(logw - shift)
        e, mm = E - cE, M - cM
        acc += [w.sum(), w @ e, w @ (e * e), w @ mm, w @ (mm * mm), w @ np.abs(M)]
    z = acc[0]
    e1, e2, m1, m2 = acc[1] / z, acc[2] / z, acc[3] / z, acc[4] / z
    var_E, var_M = max(e2 - e1 * e1, 0.0), max(m2 - m1 * m1, 0.0)
    mE, mM = cE + e1, cM + m1
    log_z = shift + math.log(z)
    return dict(
        log_z=log_z,
        log_z_per_site=log_z / N,
        mean_energy=mE / N,
        specific_heat=beta * beta * var_E / N,
        mean_m=mM / N,
        mean_abs_m=acc[5] / z / N,
        mean_m2=(var_M + mM * mM) / N**2,
        susceptibility=beta * var_M / N,
        n_sites=N,
    )


# ----------------------------------------------------------------------------------------------
# 2. row-to-row transfer matrix
# ----------------------------------------------------------------------------------------------


def _tm_lattice(bonds_h, bonds_v, h):
    """Validated lattice with the shorter side as the row width n, and the row-state table.

    Returns bh, bv, hf ([m, n] each, transposed if the input had n > m) and sigma [2^n, n]
    (+-1; sigma[a, j] is column j of row state a, index 1 <-> spin +1, consistent with reshaping
    a [2^n, ...] array to [2]*n + [...] in C order).
    """
    bh, bv, hf = _lattice(bonds_h, bonds_v, h)
    if bh.shape[1] > bh.shape[0]:  # use the shorter side as the row width
        bh, bv, hf = bv.T.copy(), bh.T.copy(), hf.T.copy()
    n = bh.shape[1]
    if n > _MAX_TM_WIDTH:
        raise ValueError(
            f"transfer matrix width min(m, n) = {n} exceeds {_MAX_TM_WIDTH} "
            f"(memory grows as 4^width); use a smaller lattice"
        )
    ns = 1 << n
    sigma = np.stack(np.unravel_index(np.arange(ns), (2,) * n), axis=1) * 2.0 - 1.0  # [ns, n]
    return bh, bv, hf, sigma


def _tm_linear(bh, bv, hf, J, beta, sigma, with_energy):
    """Linear-domain transfer matrix with per-column rescaling; returns (log Z, d log Z/dbeta)."""
    m, n = bh.shape
    ns = 1 << n
    horiz = sigma * np.roll(sigma, -1, axis=1)  # [ns, n]
    P = np.eye(ns)  # [ns (current), ns (start)]
    Q = np.zeros((ns, ns)) if with_energy else None  # dP/dbeta
    log_scale = np.zeros(ns)  # [ns] per start state
    for i in range(m):
        # D_i: weight exp(beta r), r = -E_row_i (horizontal bonds + fields)
        r = J * horiz @ bh[i] + sigma @ hf[i]  # [ns]
        lw = beta * r
        lw_max = float(lw.max())
        w = np.exp(lw - lw_max)[:, None]
        if with_energy:
            Q = w * (Q + r[:, None] * P)
        P = w * P
        # V_i: per column j, new[s'] = sum_s exp(K s s') old[s], scaled by exp(-|K|)
        for j in range(n):
            c = J * float(bv[i, j])  # dK/dbeta
            K = beta * c
            a, b = math.exp(K - abs(K)), math.exp(-K - abs(K))
            P3 = P.reshape(1 << j, 2, -1)
            p0, p1 = P3[:, 0, :], P3[:, 1, :]  # spin -1 / +1 halves
            newP = np.empty_like(P3)
            newP[:, 0, :] = a * p0 + b * p1
            newP[:, 1, :] = b * p0 + a * p1
            if with_energy:
                Q3 = Q.reshape(1 << j, 2, -1)
                q0, q1 = Q3[:, 0, :], Q3[:, 1, :]
                newQ = np.empty_like(Q3)
                newQ[:, 0, :] = a * (q0 + c * p0) + b * (q1 - c * p1)
                newQ[:, 1, :] = b * (q0 - c * p0) + a * (q1 + c * p1)
                Q = newQ.reshape(ns, ns)
            P = newP.reshape(ns, ns)
        colmax = P.max(axis=0)  # [ns], entries are > 0
        P = P / colmax
        if with_energy:
            Q = Q / colmax
        log_scale += np.log(colmax) + lw_max + float(np.abs(beta * J * bv[i]).sum())
    lmax = float(log_scale.max())
    e = np.exp(log_scale - lmax)  # [ns]
    z0 = float(e @ np.diagonal(P))
    d1 = float(e @ np.diagonal(Q)) / z0 if with_energy else None
    return lmax + math.log(z0), d1


def _tm_log(bh, bv, hf, J, beta, sigma):
    """Log-domain transfer matrix; returns (log Z, d log Z/dbeta, d2 log Z/dbeta2 = Var E).

    Carries per entry L = log P, R = P'/P (conditional mean of -E) and V = P''/P - R^2
    (conditional variance); a 2x2 factor mixes two entries with weights w, 1-w and updates
    R and V by the law of total variance, so nothing cancels and nothing underflows.
    """
    m, n = bh.shape
    ns = 1 << n
    horiz = sigma * np.roll(sigma, -1, axis=1)
    # rows 0 -> 1 in closed form: f[b, a] = r_0(a) + J sum_j bv[0, j] sigma_j(a) sigma_j(b)
    r0 = J * horiz @ bh[0] + sigma @ hf[0]  # [ns]
    R = r0[None, :] + J * (sigma * bv[0]) @ sigma.T  # [ns (b), ns (a)]
    L = beta * R
    V = np.zeros((ns, ns))
    for i in range(1, m):
        r = J * horiz @ bh[i] + sigma @ hf[i]
        L += beta * r[:, None]
        R += r[:, None]
        for j in range(n):
            c = J * float(bv[i, j])
            K = beta * c
            L3, R3, V3 = (x.reshape(1 << j, 2, -1) for x in (L, R, V))
            l0, l1, r0_, r1, v0, v1 = L3[:, 0], L3[:, 1], R3[:, 0], R3[:, 1], V3[:, 0], V3[:, 1]
            newL, newR, newV = (np.empty_like(L3) for _ in range(3))
            # s' = -1 (index 0): same-spin term from l0 (weight e^K), flip term from l1 (e^-K)
            for out, same_l, same_r, same_v, fl_l, fl_r, fl_v in (
                (0, l0, r0_, v0, l1, r1, v1),
                (1, l1, r1, v1, l0, r0_, v0),
            ):
                d = 2.0 * K + same_l - fl_l
                wgt = special.expit(d)  # share of the same-spin term
                cwgt = special.expit(-d)  # 1 - wgt, no cancellation
                newL[:, out] = np.logaddexp(K + same_l, -K + fl_l)
                rs, rf = same_r + c, fl_r - c
                newR[:, out] = wgt * rs + cwgt * rf
                newV[:, out] = wgt * same_v + cwgt * fl_v + wgt * cwgt * (rs - rf) ** 2
            L, R, V = (x.reshape(ns, ns) for x in (newL, newR, newV))
    dl, dr, dv = np.diagonal(L), np.diagonal(R), np.diagonal(V)
    log_z = float(special.logsumexp(dl))
    p = np.exp(dl - log_z)  # [ns] weights of start states
    d1 = float(p @ dr)
    var = float(p @ dv + p @ (dr - d1) ** 2)
    return log_z, d1, var


def ising_log_z_transfer_matrix(bonds_h, bonds_v, J_abs, h, beta, derivatives=1, method="auto"):
    """Exact log Z of the periodic ``m x n`` Ising model by the row-to-row transfer matrix.

    ``Z = Tr prod_{i=0}^{m-1} V_i D_i`` where ``D_i = diag(exp(-beta E_row_i(sigma)))`` holds row
    ``i``'s horizontal bonds and fields and ``V_i[sigma', sigma] = exp(beta J_abs sum_j
    bonds_v[i, j] sigma_j sigma'_j)`` couples row ``i`` to row ``(i+1) % m`` (periodic in both
    directions; the textbook construction of Kramers & Wannier, Phys. Rev. 60, 252 (1941), see
    Baxter, *Exactly Solved Models in Statistical Mechanics* (1982), chs. 2 and 7, here with
    row-dependent matrices for arbitrary bonds and fields). ``V_i`` is a Kronecker product of
    ``n`` 2x2 factors and is applied one column at a time, so one row costs ``O(n 4^n)``. The
    lattice is transposed so the width is ``min(m, n)`` (<= 12); each [2^n, 2^n] array takes
    8 * 4^n bytes (128 MiB at width 12). Linear method on 2 cores: ~0.03 s at width 8, ~1-2 s at
    width 10 (10 x 10), ~45 s at width 12; the log method is ~3-15x slower.

    Methods:
        ``"linear"``: the running product with each column (start row state) rescaled to max 1
        after every row and its log scale accumulated; row weights exponentiated after subtracting
        their maximum. Exact to round-off as long as no entry falls below ~1e-304 of its column
        maximum, which is guaranteed when the total log dynamic range
        ``R = sum_i [beta (max r_i - min r_i) + 2 |beta| J_abs sum_j |bonds_v[i, j]|]`` is <= 700.
        Mean energy by forward-mode differentiation (the pair (P, dP/dbeta) is pushed through
        every factor; scaling both by one constant leaves Z'/Z unchanged).
        ``"log"``: the same products in log space, carrying per entry the conditional mean and
        variance of -E (law of total variance at each 2x2 mixing), so it never underflows and the
        variance never cancels; ~5x slower.
        ``"auto"`` (default): ``"linear"`` if ``derivatives <= 1`` and ``R <= 700``, else ``"log"``.

    Args:
        bonds_h, bonds_v: [m, n] bond signs.
        J_abs: coupling magnitude.
        h: scalar or [m, n] field.
        beta: inverse temperature (any real).
        derivatives: 0 (log Z only), 1 (+ mean energy, default) or 2 (+ specific heat).
        method: "auto" | "linear" | "log" (``derivatives=2`` needs "log" or "auto").

    Returns:
        dict with ``log_z`` (total), ``log_z_per_site``, ``n_sites``, ``method`` and, as
        requested, ``mean_energy`` (<E>/N) and ``specific_heat`` (beta^2 Var(E)/N).
    """
    if derivatives not in (0, 1, 2):
        raise ValueError(f"derivatives must be 0, 1 or 2; got {derivatives!r}")
    if method not in ("auto", "linear", "log"):
        raise ValueError(f"method must be 'auto', 'linear' or 'log'; got {method!r}")
    if method == "linear" and derivatives == 2:
        raise ValueError(
            "derivatives=2 needs method='log' or 'auto' (the linear method would lose the variance to cancellation)"
        )
    bh, bv, hf, sigma = _tm_lattice(bonds_h, bonds_v, h)
    m, n = bh.shape
    beta, J = float(beta), float(J_abs)
    if method == "auto":
        horiz = sigma * np.roll(sigma, -1, axis=1)
        r_all = J * horiz @ bh.T + sigma @ hf.T  # [ns, m]
        dyn = float(
            (abs(beta) * (r_all.max(axis=0) - r_all.min(axis=0))).sum() + 2.0 * abs(beta) * J * np.abs(bv).sum()
        )
        method = "linear" if (derivatives <= 1 and dyn <= 700.0) else "log"
    N = m * n
    if method == "linear":
        log_z, d1 = _tm_linear(bh, bv, hf, J, beta, sigma, derivatives >= 1)
        var = None
    else:
        log_z, d1, var = _tm_log(bh, bv, hf, J, beta, sigma)
    out = dict(log_z=log_z, log_z_per_site=log_z / N, n_sites=N, method=method)
    if derivatives >= 1:
        out["mean_energy"] = -d1 / N
    if derivatives == 2:
        out["specific_heat"] = beta * beta * var / N
    return out


# ----------------------------------------------------------------------------------------------
# 3. Kaufman's finite torus
# ----------------------------------------------------------------------------------------------


def critical_temperature(J=1.0):
    """Onsager's critical temperature ``T_c = 2 J / ln(1 + sqrt 2)`` (k_B = 1), ~2.269185 J."""
    return 2.0 * float(J) / math.log1p(math.sqrt(2.0))


def _log1mexp(a):
    """log(1 - exp(-a)) for a >= 0, accurate for small and large a (Maechler 2012)."""
    a = np.asarray(a, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.where(a < math.log(2.0), np.log(-np.expm1(-a)), np.log1p(-np.exp(-a)))


def _log_abs_tanh(x):
    """log|tanh x| = log(1 - e^{-2|x|}) - log(1 + e^{-2|x|}), elementwise; x = 0 gives -inf."""
    ax = np.abs(x)
    return _log1mexp(2.0 * ax) - np.log1p(np.exp(-2.0 * ax))


def _kaufman_modes(n, K):
    """Kaufman's gamma_k (k = 0 .. 2n-1) and the well-conditioned g_k = log(sinh 2K) + |gamma_k|.

    cosh gamma_k = cosh 2K coth 2K - cos(pi k / n)   (Kaufman 1949, eq. 75 with equal couplings),
    gamma_k > 0 for k != 0, and gamma_0 = 2K + ln tanh K = 2(K - K*) (tanh K* = e^{-2K}) *with
    its sign*: negative above T_c, zero at T_c, positive below.

    Splitting ``|gamma_k| = g_k - log sinh 2K`` lets ``log Z`` cancel the prefactor
    ``(mn/2) log sinh 2K`` analytically (both blow up as K -> 0; g_k -> log 2 stays finite), which
    keeps the mean energy accurate at high temperature. With S = sinh 2K, theta = pi k / n:
      y_k = cosh gamma_k - 1 = (S - 1)^2 / S + 2 sin^2(theta/2)   (no cancellation),
      gamma_k = log1p(y + sqrt(y (y + 2))),
      S e^{gamma_k} = S + u + sqrt(u (u + 2S)),  u = S y = (S - 1)^2 + 2 S sin^2(theta/2),
      k = 0: S e^{|gamma_0|} = 2 sinh^2 K e^{2K} (gamma_0 >= 0) or 2 cosh^2 K e^{-2K} (gamma_0 < 0).
    For K > 20 (e^{-4K} < 1e-34): gamma_k = 2K + log1p(-2 cos(theta) e^{-2K}) exactly in doubles.

    Returns:
        gam, dgam, g, dg: four [2n] arrays (values and d/dK).
    """
    k = np.arange(2 * n)
    theta = np.pi * k / n
    sin2 = np.sin(0.5 * theta) ** 2
    if K > 20.0:
        q = 2.0 * np.cos(theta) * math.exp(-2.0 * K)
        gam = 2.0 * K + np.log1p(-q)
        dgam = 2.0 + 2.0 * q / (1.0 - q)
        e4 = math.exp(-4.0 * K)
        log_s = 2.0 * K - math.log(2.0) + math.log1p(-e4)
        dlog_s = 2.0 * (1.0 + e4) / (1.0 - e4)  # 2 coth 2K
        g, dg = log_s + gam, dlog_s + dgam
    else:
        S, dS = math.sinh(2.0 * K), 2.0 * math.cosh(2.0 * K)
        u = (S - 1.0) ** 2 + 2.0 * S * sin2  # [2n]
        du = dS * (2.0 * (S - 1.0) + 2.0 * sin2)
        v = np.sqrt(u * (u + 2.0 * S))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            dv = (du * (u + 2.0 * S) + u * (du + 2.0 * dS)) / (2.0 * v)  # k = 0 replaced below
            y = u / S
            gam = np.log1p(y + np.sqrt(y * (y + 2.0)))
            gam = np.where(y > 1e8, math.log(2.0) + np.log1p(y), gam)
        W = S + u + v
        g = np.log(W)
        dg = (dS + du + dv) / W
        dgam = dg - dS / S
    # k = 0 in closed form, gamma_0 with its sign
    gam[0] = 2.0 * K + math.log(math.tanh(K))
    dgam[0] = 2.0 + (2.0 / math.sinh(2.0 * K) if K < 350.0 else 0.0)
    if gam[0] >= 0:
        g[0] = math.log(2.0) + 2.0 * (K + float(_log1mexp(2.0 * K)) - math.log(2.0)) + 2.0 * K
        dg[0] = 2.0 / math.tanh(K) + 2.0
    else:
        g[0] = math.log(2.0) + 2.0 * (K + math.log1p(math.exp(-2.0 * K)) - math.log(2.0)) - 2.0 * K
        dg[0] = 2.0 * math.tanh(K) - 2.0
    return gam, dgam, g, dg


def _kaufman_remainder(x, dx):
    """R = log(prod_k 2cosh x_k + prod_k 2sinh x_k) - sum_k |x_k|, and dR/dK.   x, dx: [n]

    ``prod 2cosh x_k + prod 2sinh x_k = e^{sum |x_k|} prod(1 + e^{-2|x_k|}) (1 + p)`` with
    ``p = prod tanh x_k`` (|p| < 1); ``log|p|`` is a sum of accurate ``log|tanh x_k|`` and
    ``log(1 + p)`` is ``log1p(e^L)`` or ``log(-expm1(L))``. So the cancellation of the sinh
    product against the cosh product when p -> -1 (gamma_0 < 0, i.e. above T_c) is exact to
    relative round-off instead of being lost in a subtraction.

    dR = sum_k (tanh x_k - sgn_k) dx_k + dp / (1 + p), with sgn_k the sign used for |x_k|
    (+1 at x_k = 0, matching the gamma_0 >= 0 branch of g_0) and
    dp = sum_k dx_k sech^2(x_k) prod_{j != k} tanh x_j (a zero x_k, gamma_0 at T_c exactly, is
    evaluated in this form; the others as p * 2 dx_k / sinh 2x_k).
    Returns (R, dR); R = -inf when 1 + p underflows (then dR = 0; the term carries no weight).
    """
    ax = np.abs(x)
    sgn = np.where(x >= 0, 1.0, -1.0)
    e2 = np.exp(-2.0 * ax)
    R = float(np.log1p(e2).sum())
    dR = float(((np.tanh(x) - sgn) * dx).sum())
    lt = _log_abs_tanh(x)
    L = float(lt.sum())
    zero = x == 0.0
    sp = float(np.prod(np.sign(x)))
    if sp == 0.0:
        log1pp = 0.0  # p = 0 (a zero x_k)
    elif sp > 0:
        log1pp = math.log1p(math.exp(L))
    else:
        log1pp = float(_log1mexp(-L))  # log(1 - e^L), L <= 0; -inf if p == -1 in doubles
    if not np.isfinite(log1pp):
        return -math.inf, 0.0
    dp = 0.0
    if sp != 0.0:
        p = sp * math.exp(L)
        with np.errstate(over="ignore"):
            inv_sinh2 = 2.0 * e2 / -np.expm1(-4.0 * ax)  # 1 / sinh(2|x|), no overflow
        dp += p * float((2.0 * dx * sgn * inv_sinh2).sum())
    for k in np.flatnonzero(zero):
        others = np.delete(np.arange(x.size), k)
        if np.any(zero[others]) or dx[k] == 0.0:
            continue
        dp += (
            math.copysign(1.0, dx[k])
            * float(np.prod(sgn[others]))
            * math.exp(math.log(abs(dx[k])) + float(lt[others].sum()))
        )  # sech^2(0) = 1
    return R + log1pp, dR + dp / math.exp(log1pp)


def _check_kaufman(m, n, J, beta):
    m, n = int(m), int(n)
    if m < 1 or n < 1:
        raise ValueError(f"lattice must be at least 1 x 1; got m={m}, n={n}")
    K = float(beta) * float(J)
    if not (np.isfinite(K) and K >= 0):
        raise ValueError(
            f"Kaufman's formula needs K = beta*J >= 0 and finite (ferromagnet, beta >= 0); got beta={beta}, J={J}"
        )
    return m, n, K


def _kaufman(m, n, K):
    """(log Z, d log Z / dK) on the m x n torus, K > 0; see :func:`kaufman_log_z`."""
    gam, dgam, g, dg = _kaufman_modes(n, K)
    half = 0.5 * m
    parts = []
    for sl in (slice(1, None, 2), slice(0, None, 2)):  # odd k: Y_1, Y_2; even k: Y_3, Y_4
        R, dR = _kaufman_remainder(half * gam[sl], half * dgam[sl])
        parts.append((R, half * float(dg[sl].sum()) + dR))
    (Ro, do), (Re, de) = parts
    log_odd = half * float(g[1::2].sum()) + Ro  # log(prefactor * (Y_1 + Y_2)) + ...
    # log(Y_1 + Y_2) - log(Y_3 + Y_4), with the large g_k differenced term by term so that the
    # weights of the two pairs stay accurate when log Z ~ 1e7 (weights normalised by expit).
    delta = half * float((g[1::2] - g[0::2]).sum()) + Ro - Re
    lsum = log_odd + float(np.logaddexp(0.0, -delta))
    log_z = 0.5 * m * n * math.log(2.0) - math.log(2.0) + lsum
    w_even = float(special.expit(-delta))
    return log_z, do + w_even * (de - do) if w_even > 0 else do


def kaufman_log_z(m, n, J, beta):
    """log Z of the ferromagnetic zero-field Ising model on the periodic ``m x n`` torus.

    Kaufman's exact finite-lattice formula (B. Kaufman, "Crystal Statistics. II. Partition
    Function Evaluated by Spinor Analysis", Phys. Rev. 76, 1232 (1949); cosh gamma_k is her
    eq. 75), in the form quoted by P. D. Beale, "Exact Distribution of Energies in the
    Two-Dimensional Ising Model", Phys. Rev. Lett. 76, 78 (1996) (see also McCoy & Wu, *The
    Two-Dimensional Ising Model*, ch. IV), for equal horizontal and vertical couplings:

        Z = 1/2 (2 sinh 2K)^{mn/2} (Y_1 + Y_2 + Y_3 + Y_4),   K = beta J,
        Y_1 = prod_{r=1}^{n} 2 cosh(m gamma_{2r-1} / 2),
        Y_2 = prod_{r=1}^{n} 2 sinh(m gamma_{2r-1} / 2),
        Y_3 = prod_{r=0}^{n-1} 2 cosh(m gamma_{2r} / 2),
        Y_4 = prod_{r=0}^{n-1} 2 sinh(m gamma_{2r} / 2),
        cosh gamma_k = cosh 2K coth 2K - cos(pi k / n)   (gamma_k > 0 for k != 0),
        gamma_0 = 2K + ln tanh K.

    The sign of gamma_0 matters: gamma_0 < 0 above T_c, so Y_4 < 0 there; gamma_0 > 0 below T_c;
    0 at T_c. Taking gamma_0 = +arccosh(...) instead gives wrong answers above T_c (a test checks
    the formula against the transfer matrix on both sides).

    Numerics: everything is in log space; ``Y_1 + Y_2`` and ``Y_3 + Y_4`` are each evaluated as
    ``prod 2cosh * (1 + prod tanh)`` with ``log(1 + p)`` by log1p/expm1, so the near-cancellation
    of ``Y_3`` against a negative ``Y_4`` is exact to relative round-off, and the two positive
    pairs are combined by logaddexp; the prefactor's ``log sinh 2K`` is cancelled analytically
    against ``|gamma_k|`` (see ``_kaufman_modes``). 256 x 256 at any temperature, including
    T_c exactly and T -> 0, works without overflow. ``beta = 0`` gives ``m n log 2``. The formula
    is symmetric in m and n (checked in the tests).

    Args:
        m, n: rows and columns (>= 1).
        J: coupling (> 0; J = 0 is allowed and gives m n log 2).
        beta: inverse temperature (>= 0).

    Returns:
        float log Z (total, not per site).
    """
    m, n, K = _check_kaufman(m, n, J, beta)
    if K == 0.0:
        return m * n * math.log(2.0)
    return float(_kaufman(m, n, K)[0])


def kaufman_mean_energy(m, n, J, beta):
    """Mean energy per site ``<E>/N = -(J/N) d log Z / dK`` on the ferromagnetic ``m x n`` torus.

    Analytic derivative of :func:`kaufman_log_z` (same reference and numerics), accurate to
    ~1e-12 absolute at all temperatures (including T_c exactly, where gamma_0 = 0, and
    T -> infinity, where the prefactor's 1/K divergence is cancelled analytically). Checked in
    the tests against finite differences of ``kaufman_log_z`` and against the transfer matrix.
    ``beta = 0`` returns 0.

    Returns:
        float, <E>/N.
    """
    m, n, K = _check_kaufman(m, n, J, beta)
    if K == 0.0:
        return 0.0
    return float(-float(J) * _kaufman(m, n, K)[1] / (m * n))


def kaufman_specific_heat(m, n, J, beta, rel_step=1e-4):
    """Specific heat per site ``C/N = -beta^2 d<E/N>/dbeta`` on the ferromagnetic torus.

    Five-point central difference of the analytic :func:`kaufman_mean_energy` in beta with step
    ``h = rel_step * beta`` (truncation O(h^4), round-off ~1e-12/h): about 1e-8 absolute for the
    default step. Returns 0 at beta = 0.
    """
    beta = float(beta)
    if beta == 0.0:
        return 0.0
    h = rel_step * beta
    u = [kaufman_mean_energy(m, n, J, beta + k * h) for k in (-2, -1, 1, 2)]
    du = (u[0] - 8.0 * u[1] + 8.0 * u[2] - u[3]) / (12.0 * h)
    return float(-beta * beta * du)


# ----------------------------------------------------------------------------------------------
# 4. Onsager's infinite lattice
# ----------------------------------------------------------------------------------------------


def onsager_log_z_per_site(J, beta):
    """Infinite-lattice ``lim log Z / N`` of the zero-field ferromagnet (Onsager 1944).

    Onsager, Phys. Rev. 65, 117 (1944), in the standard one-integral form (e.g. Huang,
    *Statistical Mechanics*, 2nd ed., ch. 15; the tests check it against Onsager's double
    integral ``ln 2 + (1/(2 pi^2)) int_0^pi int_0^pi ln[cosh^2 2K - sinh 2K (cos a + cos b)]``):

        log Z / N = ln(2 cosh 2K)
                    + (1/pi) int_0^{pi/2} ln[(1 + sqrt(1 - kappa^2 sin^2 phi)) / 2] dphi,
        kappa = 2 sinh 2K / cosh^2 2K,   K = beta J.

    Evaluated with ``scipy.integrate.quad``; 0.9296953983... at T_c (J = 1).
    """
    K = float(beta) * float(J)
    K = abs(K)  # Z(K) = Z(-K) on the infinite bipartite lattice
    kappa = 2.0 * math.sinh(2 * K) / math.cosh(2 * K) ** 2 if K < 300 else 0.0
    kappa = min(kappa, 1.0)

    def f(phi):
        return math.log(0.5 * (1.0 + math.sqrt(max(1.0 - (kappa * math.sin(phi)) ** 2, 0.0))))

    val, _ = integrate.quad(f, 0.0, 0.5 * math.pi, epsabs=1e-14, epsrel=1e-13, limit=200)
    return float(2.0 * K + math.log1p(math.exp(-4.0 * K)) + val / math.pi)  # ln(2 cosh 2K) + ...


def onsager_mean_energy_per_site(J, beta):
    """Infinite-lattice ``<E>/N`` of the zero-field ferromagnet (Onsager 1944).

    ``u = -J coth 2K [1 + (2/pi)(2 tanh^2 2K - 1) K_1(kappa)]`` with ``K_1`` the complete
    elliptic integral of the first kind with modulus kappa (scipy's ``ellipk`` takes
    ``kappa^2``); Onsager (1944), e.g. Huang, *Statistical Mechanics*, ch. 15. At T_c the second
    term vanishes and u = -sqrt(2) J. The leading ``coth 2K`` cancels against the bracket as
    K -> 0, so the absolute error grows like 1e-16 / K there (1e-11 at K = 1e-5); the finite-lattice
    :func:`kaufman_mean_energy` has no such cancellation.
    """
    K = float(beta) * float(J)
    if K == 0.0:
        return 0.0
    t = math.tanh(2 * K)
    kappa = 2.0 * math.sinh(2 * K) / math.cosh(2 * K) ** 2 if abs(K) < 300 else 0.0
    kappa2 = min(kappa * kappa, 1.0)
    a = 2.0 * t * t - 1.0
    if kappa2 >= 1.0:  # at T_c: a = 0 exactly in theory, K_1 diverges only logarithmically
        return float(-J / t)
    return float(-J / t * (1.0 + (2.0 / math.pi) * a * special.ellipk(kappa2)))


# ----------------------------------------------------------------------------------------------
# 5. Gaussian mixture
# ----------------------------------------------------------------------------------------------


def gaussian_mixture_log_z(weights, sigmas, dim):
    """log of ``int gamma(x) dx`` for ``gamma(x) = sum_k w_k exp(-|x - mu_k|^2 / (2 sigma_k^2))``.

    ``= log sum_k w_k (2 pi sigma_k^2)^{d/2}`` (the Gaussian integral), by log-sum-exp.

    Args:
        weights: [K] non-negative (need not sum to 1).
        sigmas: [K] or scalar, > 0.
        dim: dimension d.

    Returns:
        float.
    """
    w = np.atleast_1d(np.asarray(weights, dtype=np.float64))
    s = np.broadcast_to(np.asarray(sigmas, dtype=np.float64), w.shape)
    if np.any(w < 0) or not np.any(w > 0):
        raise ValueError(f"weights must be non-negative with at least one positive; got {w}")
    if np.any(s <= 0):
        raise ValueError(f"sigmas must be > 0; got {s}")
    with np.errstate(divide="ignore"):
        terms = np.log(w) + 0.5 * dim * np.log(2.0 * np.pi * s * s)
    return float(special.logsumexp(terms))


def reference_log_z(target) -> tuple[float | None, str]:
    """The exact log Z of a tempering target where one is known, and how it was obtained:
    ``(value, "kaufman" | "transfer_matrix" | "enumeration" | "analytic")`` or ``(None, "none")``.

    Ising targets with uniform bonds and no field use Kaufman's finite-lattice formula (an
    antiferromagnet on an even periodic lattice maps onto the ferromagnet by flipping one
    sublattice); other Ising targets up to 10 x 10 use the transfer matrix; continuous targets
    report their own ``exact_log_z`` when they have one.
    """
    if target.kind == "ising":
        uniform_bonds = bool(
            np.all(target.bonds_h == target.bonds_h.flat[0]) and np.all(target.bonds_v == target.bonds_h.flat[0])
        )
        if uniform_bonds and target.h == 0.0:
            return float(kaufman_log_z(target.L, target.L, target.J_abs, target.beta_model)), "kaufman"
        if target.L <= 10:
            res = ising_log_z_transfer_matrix(target.bonds_h, target.bonds_v, target.J_abs, target.h, target.beta_model)
            return float(res["log_z"] if isinstance(res, dict) else res), "transfer_matrix"
        return None, "none"
    if target.kind == "mrf":  # any graph: enumeration up to 20 nodes; independent spins in closed form
        val = target.exact_log_z
        if val is None:
            return None, "none"
        return val, ("analytic" if not np.any(target.J != 0) else "enumeration")
    val = getattr(target, "exact_log_z", None)
    return (float(val), "analytic") if val is not None else (None, "none")
