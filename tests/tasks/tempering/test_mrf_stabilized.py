"""reference=stabilized on an MRF target, task side: the product reference fitted to spins, the explorer's
per-leg log-likelihoods (the uniform leg's bits are the single path's), the same bits for any blocking of the
replicas, log Z of both legs of a two-leg chain against enumeration, and the product reference in the
checkpoint arrays."""

from __future__ import annotations

import numpy as np
import pytest

from pgmflow.tasks import rng
from pgmflow.tasks.bounds import exact
from pgmflow.tasks.bounds import mrf as M
from pgmflow.tasks.tempering import engine, explorers, variational
from pgmflow.tasks.tempering import mrf_target as T
from pgmflow.tempering import reference as ref_mod


def frustrated(n=10, seed=2):
    g = np.random.default_rng(seed)
    J = np.triu(g.normal(0.0, 0.9, (n, n)) * (g.random((n, n)) < 0.5), 1)
    return M.from_dense(J + J.T, g.normal(0.3, 0.4, n))


def params(chain=0, method="heatbath", n_steps=2):
    return engine.ExploreParams(
        method=method,
        n_steps=n_steps,
        n_leapfrog=1,
        seed=5,
        chain=chain,
        philox_key=rng.philox_key(5, rng.STAGE_ISING_KEY, chain),
    )


def two_legs(target, model, k0=4, k1=4):
    legs = variational.leg_sizes_to_legs(k0, k1)
    q = T.ProductReference(field=T.mean_field_reference(model)[0])
    path = variational.Path(legs=legs, references=(T.ProductReference(field=target.ref_field), q))
    betas = variational.stabilized_betas(np.linspace(0, 1, k0) ** 2, np.linspace(0, 1, k1) ** 2)
    return legs, path, betas


def test_fit_product_matches_the_means_and_clips():
    x = np.array([[1, 1, -1], [1, -1, -1], [1, 1, -1], [1, -1, -1]], dtype=np.int8)
    q, min_var = T.fit_product(x)
    m = np.tanh(q.field)
    np.testing.assert_allclose(m, [0.8, 0.0, -0.8])  # +-1 clipped to +-(1 - 1/(N+1))
    assert min_var == pytest.approx(1 - 0.64)
    assert q.log_z == pytest.approx(float(np.sum(np.log(2 * np.cosh(q.field)))))
    with pytest.raises(ValueError, match="spins"):
        T.fit_product(np.zeros((0, 3), dtype=np.int8))


def test_explorer_per_leg_loglik():
    """Leg 0 (the target's own uniform reference) has exactly the single path's l(x) and spins; leg 1's l is
    h.x + sum J x x - a.x + log Z_q - n log 2, so each leg estimates log Z - n log 2."""
    model = frustrated()
    target = T.make_mrf_target(model)
    legs, path, betas = two_legs(target, model)
    R, n = len(legs), target.n_sites
    x0 = explorers.mrf_initial_spins(target, np.arange(R), 5, 0)
    b = betas
    p = params()
    x1, info = explorers.explore_mrf(target, x0, b, np.arange(R), p.philox_key, 0, 0, 3, "heatbath", path, legs)
    x_single, single = explorers.explore_mrf(target, x0, b, np.arange(R), p.philox_key, 0, 0, 3, "heatbath")
    on0 = legs == 0
    same = on0 | (b == 1.0)  # the uniform leg, and the target (where the reference has no weight)
    np.testing.assert_array_equal(x1[same], x_single[same])  # same reference, same bits
    np.testing.assert_array_equal(info.loglik_legs[same, 0], single.loglik[same])
    assert not np.array_equal(x1[~same], x_single[~same])  # the product leg's levels move under their own reference
    a = path.references[1].field
    pot = M.energy_terms(model, x1)
    want = pot - x1 @ a + path.references[1].log_z - n * np.log(2.0)
    np.testing.assert_allclose(info.loglik_legs[:, 1], want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(info.loglik, np.where(legs == 0, info.loglik_legs[:, 0], info.loglik_legs[:, 1]))


def test_blocks_give_the_same_bits_with_a_path():
    model = frustrated(40, seed=3)
    target = T.make_mrf_target(model)
    legs, path, betas = two_legs(target, model, 3, 5)
    R = len(legs)
    p = params(chain=2, method="metropolis")
    whole = engine.init_block(target, np.arange(R), p)
    rec = engine.initial_record(R)
    st_w, stats_w = engine.explore_block(whole, rec, betas, np.ones(R), target, p, 7, path)
    parts = [engine.init_block(target, ids, p) for ids in (np.arange(3), np.arange(3, R))]
    outs = [engine.explore_block(s, rec, betas, np.ones(R), target, p, 7, path) for s in parts]
    np.testing.assert_array_equal(np.concatenate([o[0].x for o in outs]), st_w.x)
    np.testing.assert_array_equal(np.concatenate([o[1].loglik_legs for o in outs]), stats_w.loglik_legs)
    r_w = engine.communicate(rec, betas, "deo", 5, 2, 7, stats_w, legs=legs)
    r_p = engine.communicate(rec, betas, "deo", 5, 2, 7, *[o[1] for o in outs], legs=legs)
    np.testing.assert_array_equal(r_w.levels, r_p.levels)
    np.testing.assert_array_equal(r_w.target_x, r_p.target_x)
    assert r_w.target_x.dtype == np.int8 and r_w.target_x.shape == (2, 40)  # the two levels at b = 1


@pytest.mark.slow
def test_both_legs_estimate_log_z_of_enumeration():
    """A two-leg chain of 16 levels (linear ladders) on a frustrated 10-node model, 3000 scans: each leg's
    stepping stone and their combination (variational.leg_estimates, what the pipeline reports) within 3 SE of
    enumeration."""
    model = frustrated()
    target = T.make_mrf_target(model)
    legs, path, _ = two_legs(target, model, 8, 8)
    betas = variational.stabilized_betas(np.linspace(0, 1, 8), np.linspace(0, 1, 8))
    R = len(legs)
    p = params()
    st = engine.init_block(target, np.arange(R), p)
    _, records = engine.run_scans(st, [engine.initial_record(R)], betas, np.ones(R), target, p, "deo", 0, 3000, path)
    trace = engine.stack_records(records[200:])
    est = variational.leg_estimates(betas, legs, trace.loglik.T, 1.0 - trace.accept_prob.mean(axis=0))
    truth = float(exact.log_z_enumeration(model)) - target.log_z_reference
    for leg in est["legs"]:
        assert abs(leg["log_z_ss"] - truth) < 3 * leg["log_z_ss_se"], (leg, truth)
    assert abs(est["log_z_ss"] - truth) < 3 * est["log_z_ss_se"], (est, truth)


def test_product_reference_in_the_checkpoint_arrays():
    legs = variational.leg_sizes_to_legs(2, 3)
    q = T.ProductReference(field=np.array([0.3, -1.2, 0.0]))
    arrs = ref_mod.to_arrays([q, None], [None, None], [legs, legs], 3)
    qs, rts, back = ref_mod.from_arrays(arrs, 2, legs)
    assert isinstance(qs[0], T.ProductReference) and qs[1] is None
    np.testing.assert_array_equal(qs[0].field, q.field)
    np.testing.assert_array_equal(back[0], legs)


def test_initial_reference_is_the_mean_field_product_on_two_legs_only():
    model = frustrated()
    target = T.make_mrf_target(model)
    assert ref_mod.initial_reference(target, None) is None
    q = ref_mod.initial_reference(target, variational.leg_sizes_to_legs(2, 2))
    np.testing.assert_array_equal(q.field, T.mean_field_reference(model)[0])
    p = ref_mod.path(target, variational.leg_sizes_to_legs(2, 2), q)
    assert np.all(p.references[0].field == 0) and p.references[1] is q
