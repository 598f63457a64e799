"""Bernoulli SVGP on the shipped breast cancer data: pgmflow's ``experiment=gp_breast_cancer`` against GPyTorch's
variational GP with the same inducing points and settings, in one run (issue 37, done-means 3).

    .venv/bin/python benchmarks/gp_classification.py [--seeds 0 1 2 3 4] [--steps 1500] [--out benchmarks/results/...md]
    (the peer: pip install torch gpytorch -- pgmflow does not depend on either)

For each seed, both fits see:

* the same rows: pgmflow's seeded held-out split (``sparse_gp.test_fraction`` 0.2; row ``i`` held out by a hash
  of ``(seed, i)``), inputs standardised by the training rows' means and standard deviations, labels 0/1 as
  they are;
* the same starting point: pgmflow's initial inducing inputs (``pgmflow.sparse_gp.evaluations.initial_inducing``:
  k-means++ and Lloyd iterations, seeded; what the run itself starts from), ``m`` = 32, an RBF kernel with ARD
  lengthscales 3.0 and scale 4.0, zero mean, ``q(u)`` = the prior (whitened, both);
* the same minibatches: step ``t`` uses the training rows ``pgmflow.tasks.gp.svgp.minibatch_indices(seed, t, n,
  128)``;
* the same optimisers: a natural-gradient step of ``q(u)`` with step 0.1 and Adam (lr 0.01) on the kernel's
  log-hyperparameters and the inducing inputs, 1,500 steps (GPyTorch: ``NaturalVariationalDistribution`` with
  ``gpytorch.optim.NGD(lr=0.1)``, ``VariationalStrategy`` (whitened) with learnt inducing locations,
  ``BernoulliLikelihood`` (probit; 20-point Gauss-Hermite quadrature, as pgmflow's), ``VariationalELBO``, and
  ``torch.optim.Adam(lr=0.01)`` with the lengthscales and the scale constrained by ``exp`` as pgmflow's are;
  float64). GPyTorch takes both steps from the gradients at one point; pgmflow takes the natural-gradient step
  first and Adam's at the updated ``q(u)``.

It prints, per seed and on average, the held-out accuracy, log loss (mean negative log predictive probability)
and Brier score of both, the full-data ELBO of both fitted models (evaluated by the same function, pgmflow's
``svgp_elbo``: the objective both maximise), and the ratios pgmflow / GPyTorch (accuracy: >= 0.99 is within 1 %; log loss and
Brier: lower is better, <= 1.01 is within 1 %).
"""

from __future__ import annotations

import argparse
import io
import math
import os
import platform
import sys
import tempfile
import time

import numpy as np

M, LENGTHSCALE, VARIANCE, BATCH, RHO, LR = 32, 3.0, 4.0, 128, 0.1, 0.01


def overrides(seed: int, steps: int) -> list[str]:
    return [
        "experiment=gp_breast_cancer",
        f"seed={seed}",
        f"sparse_gp.svgp_steps={steps}",
        f"sparse_gp.m={M}",
        f"sparse_gp.lengthscale={LENGTHSCALE}",
        f"sparse_gp.variance={VARIANCE}",
        f"sparse_gp.svgp_batch_size={BATCH}",
        f"sparse_gp.svgp_rho={RHO}",
        f"sparse_gp.svgp_lr={LR}",
        "sparse_gp.figures=false",
        "progress=false",
    ]


def setup(seed: int, steps: int):
    """The run's plan and what both fits start from: standardised training and held-out rows, Z0."""
    from pgmflow.core.api import compose
    from pgmflow.sparse_gp.evaluations import inducing_pool, initial_inducing
    from pgmflow.sparse_gp.validate import check_sparse_gp
    from pgmflow.tasks.gp.data import heldout_rows, split_key

    cfg = compose(*overrides(seed, steps))
    plan = check_sparse_gp(cfg)
    data, std = plan.data, plan.data.standardizer
    test = heldout_rows(split_key(seed), 0, data.n, plan.test_fraction)
    X, y = std.apply_X(data.X), data.y
    pool = inducing_pool(data, plan.seed, plan.test_fraction, plan.kmeans_points)
    Z0 = initial_inducing(std.apply_X(pool), plan.m, plan.seed, plan.kmeans_iter, plan.kmeans_points)
    return X[~test], y[~test], X[test], y[test], Z0


def scores(p, y) -> dict:
    p = np.clip(p, 1e-300, 1 - 1e-16)
    return {
        "accuracy": float(np.mean((p > 0.5) == (y == 1))),
        "log_loss": float(-np.mean(np.log(np.where(y == 1, p, 1 - p)))),
        "brier": float(np.mean((p - y) ** 2)),
    }


def full_elbo(log_lengthscale, log_variance, Z, mean_v, cov_v, Xtr, ytr) -> float:
    """The full-data ELBO of a fitted Bernoulli (probit) SVGP, by pgmflow's ``svgp_elbo`` (the same function
    for both fits): the objective both optimise, so the higher one is the better fit of it."""
    from pgmflow.tasks.gp import kernels as kern
    from pgmflow.tasks.gp import svgp
    from pgmflow.tasks.gp.likelihoods import Likelihood

    params = kern.GPParams(np.asarray(log_lengthscale, dtype=np.float64), float(log_variance), 0.0)
    state = svgp.svgp_init(Z.shape[0], mean_v, cov_v)
    lik = Likelihood("bernoulli", "probit")
    return float(svgp.svgp_elbo("rbf", params, Z, state, Xtr, ytr, len(ytr), likelihood=lik))


def run_pgmflow(seed: int, steps: int, store: str, Xtr, ytr) -> tuple[dict, float]:
    import pgmflow
    from pgmflow.sparse_gp.model import GPPredictor

    t0 = time.perf_counter()
    r = pgmflow.run(*overrides(seed, steps), cluster="synchronous", tracking_uri=store, stream=io.StringIO())
    sec = time.perf_counter() - t0
    res = r.result
    gp = GPPredictor.from_npz(r.artifact("model.npz"))
    prec = -2.0 * np.asarray(gp.state.theta2)
    cov_v = np.linalg.inv(prec)
    elbo = full_elbo(gp.params.log_lengthscale, gp.params.log_variance, gp.Z, cov_v @ gp.state.theta1, cov_v, Xtr, ytr)
    got = {"accuracy": res["test_accuracy"], "log_loss": res["test_log_loss"], "brier": res["test_brier"]}
    return got | {"elbo": elbo}, sec


def run_gpytorch(seed: int, steps: int, Xtr, ytr, Xte, yte, Z0) -> tuple[dict, float]:
    import gpytorch
    import torch

    from pgmflow.tasks.gp.svgp import minibatch_indices

    torch.set_num_threads(2)
    torch.manual_seed(seed)
    exp_positive = gpytorch.constraints.Positive(transform=torch.exp, inv_transform=torch.log)

    class SVGP(gpytorch.models.ApproximateGP):
        def __init__(self, Z):
            q = gpytorch.variational.NaturalVariationalDistribution(Z.shape[0])
            s = gpytorch.variational.VariationalStrategy(self, Z, q, learn_inducing_locations=True)
            super().__init__(s)
            self.mean_module = gpytorch.means.ZeroMean()
            base = gpytorch.kernels.RBFKernel(ard_num_dims=Z.shape[1], lengthscale_constraint=exp_positive)
            self.covar_module = gpytorch.kernels.ScaleKernel(base, outputscale_constraint=exp_positive)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    X = torch.from_numpy(np.ascontiguousarray(Xtr))
    y = torch.from_numpy(np.ascontiguousarray(ytr))
    model = SVGP(torch.from_numpy(Z0.copy())).double()
    lik = gpytorch.likelihoods.BernoulliLikelihood().double()
    model.covar_module.base_kernel.lengthscale = torch.full((1, Xtr.shape[1]), LENGTHSCALE, dtype=torch.float64)
    model.covar_module.outputscale = torch.tensor(VARIANCE, dtype=torch.float64)
    n = X.shape[0]
    elbo = gpytorch.mlls.VariationalELBO(lik, model, num_data=n)
    ngd = gpytorch.optim.NGD(model.variational_parameters(), num_data=n, lr=RHO)
    adam = torch.optim.Adam(model.hyperparameters(), lr=LR)
    model.train()
    lik.train()
    t0 = time.perf_counter()
    with gpytorch.settings.cholesky_jitter(double_value=1e-6):
        for t in range(steps):
            idx = torch.from_numpy(minibatch_indices(seed, t, n, min(BATCH, n)))
            ngd.zero_grad()
            adam.zero_grad()
            loss = -elbo(model(X[idx]), y[idx])
            loss.backward()
            ngd.step()
            adam.step()
        sec = time.perf_counter() - t0
        model.eval()
        lik.eval()
        with torch.no_grad():
            p = lik(model(torch.from_numpy(np.ascontiguousarray(Xte)))).probs.numpy()
            q = model.variational_strategy._variational_distribution()  # whitened q(v), as pgmflow's
            elbo = full_elbo(
                np.log(model.covar_module.base_kernel.lengthscale.numpy().ravel()),
                math.log(float(model.covar_module.outputscale)),
                model.variational_strategy.inducing_points.numpy().copy(),
                q.mean.numpy(),
                q.covariance_matrix.numpy(),
                Xtr,
                ytr,
            )
    return scores(p, yte) | {"elbo": elbo}, sec


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--out", default=None, help="also write the table (markdown) to this file")
    a = ap.parse_args(argv)
    import gpytorch
    import torch

    lines = [
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, torch {torch.__version__}, gpytorch {gpytorch.__version__}; command: "
        f"`.venv/bin/python benchmarks/gp_classification.py --seeds {' '.join(map(str, a.seeds))} --steps {a.steps}`",
        f"breast cancer (569 x 30, 20 % held out), Bernoulli probit SVGP, m={M}, {a.steps} steps of {BATCH} rows, "
        f"natural-gradient step {RHO}, Adam lr {LR}",
        "",
        "| seed | test rows | accuracy pgmflow | accuracy GPyTorch | ratio | log loss pgmflow | log loss GPyTorch | "
        "ratio | Brier pgmflow | Brier GPyTorch | ratio | ELBO pgmflow | ELBO GPyTorch | s pgmflow | s GPyTorch |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ours_all, peer_all = [], []
    with tempfile.TemporaryDirectory() as tmp:
        store = f"sqlite:///{tmp}/mlflow.db"
        for seed in a.seeds:
            Xtr, ytr, Xte, yte, Z0 = setup(seed, a.steps)
            ours, s_ours = run_pgmflow(seed, a.steps, store, Xtr, ytr)
            peer, s_peer = run_gpytorch(seed, a.steps, Xtr, ytr, Xte, yte, Z0)
            ours_all.append(ours)
            peer_all.append(peer)
            lines.append(
                f"| {seed} | {len(yte)} | {ours['accuracy']:.4f} | {peer['accuracy']:.4f} | "
                f"{ours['accuracy'] / peer['accuracy']:.4f} | {ours['log_loss']:.4f} | {peer['log_loss']:.4f} | "
                f"{ours['log_loss'] / peer['log_loss']:.4f} | {ours['brier']:.4f} | {peer['brier']:.4f} | "
                f"{ours['brier'] / peer['brier']:.4f} | {ours['elbo']:.2f} | {peer['elbo']:.2f} | {s_ours:.1f} | "
                f"{s_peer:.1f} |"
            )
            print(lines[-1], flush=True)
    mean = {k: np.mean([o[k] for o in ours_all]) for k in ours_all[0]}
    pmean = {k: np.mean([o[k] for o in peer_all]) for k in peer_all[0]}
    lines.append(
        f"| mean | | {mean['accuracy']:.4f} | {pmean['accuracy']:.4f} | {mean['accuracy'] / pmean['accuracy']:.4f} | "
        f"{mean['log_loss']:.4f} | {pmean['log_loss']:.4f} | {mean['log_loss'] / pmean['log_loss']:.4f} | "
        f"{mean['brier']:.4f} | {pmean['brier']:.4f} | {mean['brier'] / pmean['brier']:.4f} | {mean['elbo']:.2f} | "
        f"{pmean['elbo']:.2f} | | |"
    )
    ok_acc = mean["accuracy"] / pmean["accuracy"] >= 0.99
    ok_ll = mean["log_loss"] / pmean["log_loss"] <= 1.01
    lines += [
        "",
        f"accuracy within 1 % of GPyTorch's or better: {ok_acc}; log loss within 1 % or better: {ok_ll}",
    ]
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    if not math.isfinite(mean["log_loss"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
