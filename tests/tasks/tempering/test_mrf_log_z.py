"""Parallel tempering on MRF targets estimates log Z: within 3 SE of enumeration on 20 random models of at most
20 nodes, and inside the mean-field / TRW bracket (3 SE) on 200 random models of 30-100 nodes.

The chains are run in this process with the engine's own block functions (``engine.run_scans``: the same
arithmetic the pipeline farms out; bit-identical to it for any layout) and the pipeline's ladder rules:
rounds of 2^r scans, the ladder re-spaced between rounds, stepping stone on the last round.
"""

from __future__ import annotations

import numpy as np
import pytest

from pgmflow.tasks import rng as _rng
from pgmflow.tasks.bounds import mrf as M
from pgmflow.tasks.bounds import summary, trw
from pgmflow.tasks.tempering import engine, estimators, schedule
from pgmflow.tasks.tempering import mrf_target as T


def random_model(rng, n, density, scale, field) -> M.PairwiseMRF:
    """G(n, density) with N(0, scale^2) couplings (a frustrated model) and N(0, field^2) fields."""
    J = np.triu(rng.normal(0.0, scale, (n, n)) * (rng.random((n, n)) < density), 1)
    if not np.any(J):
        J[0, 1] = scale
    return M.from_dense(J + J.T, rng.normal(0.0, field, n) if field else None)


def pt_log_z(target, K=10, rounds=9, seed=0, chains=2, sweeps=2, method="heatbath"):
    """log Z and its SE from ``chains`` independent PT chains (stepping stone over the last round's ladder)."""
    est, var = [], []
    for chain in range(chains):
        key = _rng.philox_key(seed, _rng.STAGE_ISING_KEY, chain)
        params = engine.ExploreParams(method, sweeps, 1, seed, chain, key)
        state = engine.init_block(target, np.arange(K), params)
        betas = schedule.initial_schedule(K, kind="power", power=2.0)
        prev = [engine.initial_record(K)]
        for r in range(1, rounds + 1):
            state, recs = engine.run_scans(state, prev, betas, np.ones(K), target, params, "deo", 2**r - 2, 2**r)
            prev, trace = recs[-1:], engine.stack_records(recs)
            if r < rounds:
                betas = schedule.adapt_schedule(betas, 1.0 - trace.accept_prob.mean(axis=0))
        e = estimators.stepping_stone_joint(betas, trace.loglik.T)
        est.append(target.log_z_reference + float(e.estimate))
        var.append(float(e.se) ** 2)
    return float(np.mean(est)), float(np.sqrt(np.sum(var)) / chains)


def small_models():
    """20 models, n in 8..20: densities 0.15-0.9, coupling scales 0.1-1.2, fields on and off."""
    rng = np.random.default_rng(2024)
    out = []
    for k in range(20):
        n = int(rng.integers(8, 21))
        out.append(
            random_model(rng, n, [0.15, 0.3, 0.6, 0.9][k % 4], [0.1, 0.4, 0.8, 1.2][(k // 4) % 4], (k % 2) * 0.5)
        )
    return out


@pytest.mark.slow
def test_twenty_small_models_against_enumeration():
    z = []
    for i, model in enumerate(small_models()):
        target = T.make_mrf_target(model)
        exact = target.exact_log_z
        est, se = pt_log_z(target, seed=i)
        z.append((est - exact) / se)
        assert abs(est - exact) < 3 * se, (i, model.n, est, exact, se)
    print(f"\n20 models: max |error| / SE = {np.max(np.abs(z)):.2f}, mean {np.mean(z):+.2f}")


def test_mean_field_reference_estimates_the_same_log_z():
    """With the mean-field reference (log Z_ref = sum log 2 cosh a) the path is different, the answer not."""
    model = small_models()[9]
    a, mf = T.mean_field_reference(model)
    target = T.make_mrf_target(model, a)
    assert target.log_z_reference == pytest.approx(float(np.sum(np.log(2 * np.cosh(a)))), rel=1e-12)
    for method in ("heatbath", "metropolis"):
        est, se = pt_log_z(target, seed=5, method=method)
        assert abs(est - target.exact_log_z) < 3 * se
    assert mf.log_z_lower <= target.exact_log_z


def bracket_models(count=200):
    """``count`` models of 30-100 nodes: mean degree 3-12, coupling scales 0.05-0.5 (per coupling, so the
    local fields reach |sum J| ~ 1.5), fields on and off."""
    rng = np.random.default_rng(7)
    for k in range(count):
        n = int(rng.integers(30, 101))
        degree = float(rng.uniform(3, 12))
        scale = float(rng.uniform(0.05, 0.5))
        yield random_model(rng, n, degree / (n - 1), scale, (k % 2) * 0.5)


@pytest.mark.slow
def test_two_hundred_models_inside_the_mean_field_trw_bracket():
    failures, gaps = [], []
    for i, model in enumerate(bracket_models()):
        target = T.make_mrf_target(model)
        est, se = pt_log_z(target, K=12, rounds=8, seed=i)
        b = summary.compute_bounds(model, trw.spanning_tree_rho(model, n_trees=50, seed=0), mf_restarts=2)
        gaps.append((est - b.mf, b.trw - est))
        if not (b.mf - 3 * se <= est <= b.trw + 3 * se):
            failures.append((i, model.n, b.mf, est, se, b.trw))
    assert not failures, failures
    gaps = np.array(gaps)
    print(
        f"\n200 models: PT - MF in [{gaps[:, 0].min():.3g}, {gaps[:, 0].max():.3g}], TRW - PT in "
        f"[{gaps[:, 1].min():.3g}, {gaps[:, 1].max():.3g}]"
    )
