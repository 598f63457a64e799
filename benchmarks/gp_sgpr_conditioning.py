"""Why SGPR with m = n on the CO2 record needs a jitter of 1e-4..1e-3 (issue 37): the summed statistics square
Kuu's condition number.

SGPR's chunked form (tasks/gp/stats.py) summed, before the fix of issue 37, ``psi2 = sum_c Kuf_c Kfu_c`` over the
chunks and formed
``B = I + L^-1 psi2 L^-T / sigma^2`` in the driver (``L = chol(Kuu + jitter s I)``). With the inducing inputs at
the training inputs (Z = X) and the Rasmussen-Williams kernel at `experiment=gp_co2`'s starting point, Kuu
factors at a relative jitter of 1e-12, but ``psi2 = Kuu Kuu`` has the square of its condition number, and
``L^-1 psi2 L^-T`` comes out indefinite at every jitter below ~1e-4. The GPflow-style form ``A = L^-1 Kuf``,
``B = I + A A^T / sigma^2`` (one triangular solve per chunk, given L) factors at the jitter Kuu needs; it is what
the chunks compute now (statistics ``Ay``, ``AAT``), so this script documents the old route.

Prints, for each relative jitter, whether Kuu factors, whether B factors by each route, and B's smallest
eigenvalue by the psi2 route. Run: ``.venv/bin/python benchmarks/gp_sgpr_conditioning.py`` (about 10 s).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import scipy.linalg as sl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main():
    from pgmflow.core import preflight
    from tests.conftest import compose

    cfg = compose(["experiment=gp_co2", "cluster.profile=synchronous"])
    plan = preflight.preflight_checks(cfg)
    ks = plan.kernel_setup
    X = np.asarray(plan.data.X, dtype=np.float64)[: plan.data.n_train]
    Xs = (X - X.mean(0)) / X.std(0)
    K = ks.kernel.K(np.asarray(ks.theta0, dtype=np.float64), Xs)
    s = float(K.diagonal().mean())
    noise = float(cfg["sparse_gp"]["noise"])
    n = K.shape[0]
    w = np.linalg.eigvalsh(K)
    print(f"CO2 training rows n = m = {n}; kernel {ks.kernel.spec}; scale s = {s:.4g}; noise {noise:.3g}")
    print(f"Kuu eigenvalues: smallest {w[0]:.3g} (rounding level: numerically singular), largest {w[-1]:.3g}")
    print(f"{'relative jitter':>16s} {'Kuu':>5s} {'B = I + AA^T/s2':>16s} {'B from psi2':>12s} {'min eig (psi2)':>15s}")
    y = np.asarray(plan.data.y, dtype=np.float64)[: plan.data.n_train]
    y = (y - y.mean()) / y.std()
    P2 = K @ K  # sum_c Kuf_c Kfu_c with Z = X
    for rel in (1e-12, 1e-10, 1e-8, 1e-6, 1e-5, 1e-4, 1e-3):
        try:
            L = np.linalg.cholesky(K + rel * s * np.eye(n))
        except np.linalg.LinAlgError:
            print(f"{rel:16.0e} {'no':>5s}")
            continue
        A = sl.solve_triangular(L, K, lower=True)
        ok_a = _factors(np.eye(n) + A @ A.T / noise)
        if rel == 1e-12:
            bounds = (_titsias(A, K, y, noise), _exact(K, y, noise))
        Bq = np.eye(n) + sl.solve_triangular(L, sl.solve_triangular(L, P2, lower=True).T, lower=True).T / noise
        Bq = 0.5 * (Bq + Bq.T)
        print(
            f"{rel:16.0e} {'yes':>5s} {'yes' if ok_a else 'no':>16s} {'yes' if _factors(Bq) else 'no':>12s} "
            f"{np.linalg.eigvalsh(Bq)[0]:15.4g}"
        )

    print(
        f"at relative jitter 1e-12, the stable route's SGPR bound with Z = X is {bounds[0]:.6f}; the exact log "
        f"marginal likelihood {bounds[1]:.6f} (difference {bounds[0] - bounds[1]:.2e})"
    )


def _titsias(A, Kff, y, noise) -> float:
    """Titsias's bound from ``A = L^-1 Kuf``: log N(y | 0, A^T A + noise I) - tr(Kff - A^T A) / (2 noise)."""
    n = y.shape[0]
    B = np.eye(A.shape[0]) + A @ A.T / noise
    LB = np.linalg.cholesky(B)
    c = sl.solve_triangular(LB, A @ y, lower=True) / noise
    quad = y @ y / noise - c @ c
    logdet = 2 * np.log(np.diag(LB)).sum() + n * np.log(noise)
    trace = (np.trace(Kff) - np.einsum("ij,ij->", A, A)) / noise
    return float(-0.5 * (quad + logdet + n * np.log(2 * np.pi)) - 0.5 * trace)


def _exact(K, y, noise) -> float:
    n = y.shape[0]
    L = np.linalg.cholesky(K + noise * np.eye(n))
    a = sl.solve_triangular(L, y, lower=True)
    return float(-0.5 * a @ a - np.log(np.diag(L)).sum() - 0.5 * n * np.log(2 * np.pi))


def _factors(M) -> bool:
    try:
        np.linalg.cholesky(M)
        return True
    except np.linalg.LinAlgError:
        return False


if __name__ == "__main__":
    main()
