"""The PT engine: swap decisions, layout independence, and the stationary distribution of
every level against exact enumeration."""

import numpy as np
import pytest

from pgmflow.tasks import rng
from pgmflow.tasks.tempering import engine, exact, targets


def _stats(ll):
    K = len(ll)
    z = np.zeros(K)
    return engine.BlockStats(replica_ids=np.arange(K), loglik=np.asarray(ll, float), energy=z, abs_m=z, accept=z)


def test_deo_swaps_proposed_pairs_only_and_swaps_levels():
    betas = np.array([0.0, 0.3, 0.6, 1.0])
    # l decreasing with level index => every log_alpha = (b_{k+1}-b_k)(l_k - l_{k+1}) > 0: always accepted
    rec0 = engine.initial_record(4)
    rec = engine.communicate(rec0, betas, "deo", 0, 0, 0, _stats([3.0, 2.0, 1.0, 0.0]))
    assert rec.proposed.tolist() == [True, False, True]
    assert rec.accepted.tolist() == [True, False, True]
    assert rec.levels.tolist() == [1, 0, 3, 2]  # replicas 0<->1 and 2<->3 exchanged levels
    np.testing.assert_allclose(rec.accept_prob, 1.0)
    rec2 = engine.communicate(rec, betas, "deo", 0, 0, 1, _stats([3.0, 2.0, 1.0, 0.0]))
    assert rec2.proposed.tolist() == [False, True, False]


def test_swap_probability_formula_and_rejection():
    betas = np.array([0.0, 0.5, 1.0])
    ll = np.array([-10.0, 0.0, 5.0])  # by replica == by level initially
    rec = engine.communicate(engine.initial_record(3), betas, "deo", 7, 0, 0, _stats(ll))
    expect = np.minimum(1, np.exp((betas[1:] - betas[:-1]) * (ll[:-1] - ll[1:])))
    np.testing.assert_allclose(rec.accept_prob, expect)
    assert rec.accept_prob[0] == pytest.approx(np.exp(-5.0))


def test_seo_parity_is_random_but_reproducible():
    par = [engine.swap_parity("seo", 5, 0, s) for s in range(64)]
    assert par == [engine.swap_parity("seo", 5, 0, s) for s in range(64)]
    assert 10 < sum(par) < 54


def test_nan_loglik_is_an_error():
    with pytest.raises(FloatingPointError, match="non-finite"):
        engine.communicate(engine.initial_record(3), np.array([0, 0.5, 1.0]), "deo", 0, 0, 0, _stats([0, np.nan, 1]))


def _params(method, n_steps=2, chain=0):
    return engine.ExploreParams(
        method=method,
        n_steps=n_steps,
        n_leapfrog=5,
        seed=11,
        chain=chain,
        philox_key=rng.philox_key(11, rng.STAGE_ISING_KEY, chain),
    )


@pytest.mark.parametrize("kind", ["ising", "gmm"])
def test_chain_layout_equals_blocks_layout(kind):
    K = 6
    if kind == "ising":
        target, p = targets.make_ising(8, 2.2, h=0.1), _params("metropolis")
    else:
        target, p = targets.make_gaussian_mixture(3, 3, 4.0, 0.7, 5.0), _params("hmc")
    betas = np.linspace(0, 1, K) ** 2
    steps = np.full(K, 0.3)
    whole = engine.init_block(target, np.arange(K), p)
    st_chain, recs_chain = engine.run_scans(whole, [engine.initial_record(K)], betas, steps, target, p, "deo", 0, 12)
    blocks = [engine.init_block(target, ids, p) for ids in (np.array([0, 1]), np.array([2, 3, 4]), np.array([5]))]
    rec = engine.initial_record(K)
    for s in range(12):
        outs = [engine.explore_block(b, rec, betas, steps, target, p, s) for b in blocks]
        blocks = [o[0] for o in outs]
        rec = engine.communicate(rec, betas, "deo", p.seed, p.chain, s, *[o[1] for o in outs])
        r_chain = recs_chain[s]
        for f in engine.SwapRecord._fields:
            np.testing.assert_array_equal(np.asarray(getattr(rec, f)), np.asarray(getattr(r_chain, f)), err_msg=f)
    np.testing.assert_array_equal(np.concatenate([b.x for b in blocks]), st_chain.x)


@pytest.mark.slow
def test_every_level_samples_its_boltzmann_distribution():
    """4x4 Ising with a field, 5 levels: the mean energy at each level matches enumeration."""
    target = targets.make_ising(4, 1.6, h=0.2)
    K = 5
    betas = np.linspace(0, 1, K)
    p = _params("heatbath", n_steps=1)
    st = engine.init_block(target, np.arange(K), p)
    st, recs = engine.run_scans(st, [engine.initial_record(K)], betas, np.ones(K), target, p, "deo", 0, 6000)
    trace = engine.stack_records(recs)
    e = trace.energy[500:]  # [T, K]
    for k in range(K):
        ex = exact.ising_log_z_enumeration(
            target.bonds_h, target.bonds_v, target.J_abs, target.h, betas[k] * target.beta_model
        )
        x = e[:, k] / 16
        nb = 50
        se = x[: len(x) // nb * nb].reshape(nb, -1).mean(1).std(ddof=1) / np.sqrt(nb)
        assert abs(x.mean() - ex["mean_energy"]) < 4 * se + 1e-12, (k, x.mean(), ex["mean_energy"], se)
    assert trace.accepted.any() and not trace.accepted.all()
