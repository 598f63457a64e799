"""A ``model.npz`` written before issue 37 (statistics ``psi2 = Kuf Kfu``, ``psi1y = Kuf y``) still loads: its
statistics are whitened by the factor the predictor makes, and it predicts as the new statistics do."""

import numpy as np
import pytest

from pgmflow.sparse_gp.model import GPPredictor
from pgmflow.tasks.gp import kernels as kern
from pgmflow.tasks.gp import stats


@pytest.mark.parametrize("method", ["sgpr", "fitc"])
def test_a_model_file_with_the_old_statistics_predicts_as_the_new_one(tmp_path, method):
    rng = np.random.default_rng(4)
    X = rng.standard_normal((60, 2))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(60)
    Z = X[:8].copy()
    p = kern.make_params([1.2, 0.8], 1.1, 0.05)
    L, jit = kern.inducing_cholesky("matern52", p, Z)
    new = stats.chunk_stats(method, "matern52", p, Z, X, y, L=L)
    Kuf = kern.K("matern52", p, Z, X)
    if method == "fitc":
        lam = p.variance - np.sum(np.linalg.solve(L, Kuf) ** 2, axis=0) + p.noise
        psi1y, psi2 = Kuf @ (y / lam), (Kuf / lam) @ Kuf.T
    else:
        psi1y, psi2 = Kuf @ y, Kuf @ Kuf.T
    common = {
        "method": np.array(method),
        "kernel": np.array("matern52"),
        "log_lengthscale": p.log_lengthscale,
        "log_variance": np.float64(p.log_variance),
        "log_noise": np.float64(p.log_noise),
        "x_mean": np.zeros(2),
        "x_std": np.ones(2),
        "y_mean": np.float64(0.0),
        "y_std": np.float64(1.0),
        "input_names": np.array(["a", "b"]),
        "target_name": np.array("t"),
        "jitter": np.float64(jit),
        "Z": Z,
    }
    rest = {k: np.asarray(v) for k, v in new._asdict().items() if k not in ("Ay", "AAT")}
    np.savez(tmp_path / "new.npz", **common, **{f"stats_{k}": v for k, v in new._asdict().items()})
    np.savez(
        tmp_path / "old.npz", **common, **{f"stats_{k}": v for k, v in rest.items()}, stats_psi1y=psi1y, stats_psi2=psi2
    )
    got_new = GPPredictor.from_npz(tmp_path / "new.npz")
    got_old = GPPredictor.from_npz(tmp_path / "old.npz")
    np.testing.assert_allclose(got_old.stats.AAT, new.AAT, rtol=1e-8, atol=1e-10)
    Xs = rng.standard_normal((5, 2))
    for a, b in zip(got_old.predict(Xs), got_new.predict(Xs)):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-9)
