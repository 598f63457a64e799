"""The three methods together and the marginal bounds, against exact enumeration.

Done-means 1 of the issue: on random graphs and lattices small enough to enumerate (mixed and
frustrated couplings, fields), MF <= exact <= TRW to 1e-9, and the marginal bounds contain the
exact marginals.
"""

from __future__ import annotations

import numpy as np
import pytest

from pgmflow.tasks.bounds import exact, summary, trw
from pgmflow.tasks.bounds import mrf as M


def _random_models(seed, count):
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        kind = rng.integers(4)
        if kind == 0:  # Erdos-Renyi, mixed couplings and fields
            n = int(rng.integers(3, 11))
            iu = np.triu_indices(n, 1)
            keep = rng.random(iu[0].size) < rng.uniform(0.25, 0.6)
            if not keep.any():
                continue
            model = M.make_mrf(
                rng.uniform(-0.8, 0.8, n),
                np.stack([iu[0][keep], iu[1][keep]], 1),
                rng.uniform(-1.2, 1.2, int(keep.sum())),
            )
            name = f"gnp{n}"
        elif kind == 1:  # frustrated: antiferromagnetic triangles and odd cycles
            n = int(rng.choice([3, 5, 7, 9]))
            edges = [(i, (i + 1) % n) for i in range(n)] + [(0, n // 2)]
            model = M.make_mrf(rng.uniform(-0.5, 0.5, n), edges, -rng.uniform(0.3, 1.2, len(edges)))
            name = f"frustrated{n}"
        elif kind == 2:  # +-J spin glass on a small lattice, periodic or open
            L, W = int(rng.choice([3, 4])), 3
            periodic = bool(rng.integers(2))
            model = M.ising_lattice(
                L,
                W,
                beta=float(rng.uniform(0.2, 0.8)),
                h=float(rng.uniform(-0.3, 0.3)),
                periodic=periodic,
                bonds_h=rng.choice([-1.0, 1.0], (L, W)),
                bonds_v=rng.choice([-1.0, 1.0], (L, W)),
            )
            name = f"glass{L}x{W}{'p' if periodic else 'o'}"
        else:  # ferromagnetic lattice through the critical region
            model = M.ising_lattice(3, 4, beta=float(rng.uniform(0.1, 1.0)), h=float(rng.uniform(-0.2, 0.2)))
            name = "ferro3x4"
        out.append((name, model))
    return out


CASES = _random_models(11, 200)


@pytest.mark.slow
def test_mf_below_exact_below_trw_on_200_models():
    for name, model in CASES:
        b = summary.compute_bounds(model, damping=0.5, max_iter=50_000, tol=1e-11)
        z = exact.log_z_enumeration(model)
        assert b.trw_converged and b.mf_converged, name
        assert b.mf <= z + 1e-9, (name, b.mf, z)
        assert z <= b.trw + 1e-9, (name, z, b.trw)


@pytest.mark.parametrize("k", range(0, 200, 8))
def test_marginal_bounds_contain_the_exact_marginals(k):
    name, model = CASES[k]
    mb = summary.marginal_bounds(model, max_iter=50_000, tol=1e-11)
    p = (1.0 + exact.exact_marginals(model).mean) / 2.0
    assert mb.all_converged, name
    assert np.all(mb.lower <= p + 1e-9) and np.all(p <= mb.upper + 1e-9), (name, mb.lower, p, mb.upper)
    assert np.all(mb.upper - mb.lower < 1.0), name  # every bound says something


def test_marginal_bounds_are_tight_on_a_tree():
    """On a tree MF is not exact but TRW is (rho = 1): the upper side of the bounds is exact."""
    model = M.make_mrf([0.3, -0.2, 0.1, 0.5], [(0, 1), (1, 2), (1, 3)], [0.8, -0.6, 0.4])
    p = (1.0 + exact.exact_marginals(model).mean) / 2.0
    mb = summary.marginal_bounds(model)
    assert np.all(mb.lower <= p + 1e-12) and np.all(p <= mb.upper + 1e-12)
    z = exact.log_z_enumeration(model)
    b = summary.compute_bounds(model)
    assert abs(b.trw - z) < 1e-9 and abs(b.bethe - z) < 1e-9


@pytest.mark.parametrize("L,W", [(3, 3), (3, 4), (4, 5)])
def test_the_lattice_path_equals_the_any_graph_path(L, W):
    rng = np.random.default_rng(L * W)
    model = M.ising_lattice(
        L, W, beta=0.45, bonds_h=rng.choice([-1.0, 1.0], (L, W)), bonds_v=rng.choice([-1.0, 1.0], (L, W))
    )._replace(h=rng.uniform(-0.3, 0.3, L * W))
    rho = trw.lattice_rho(L, W)
    a = summary.compute_bounds(model, rho, lattice=(L, W, True))
    b = summary.compute_bounds(model, rho)
    assert a.trw_converged and b.trw_converged
    assert abs(a.trw - b.trw) < 1e-9 and abs(a.bethe - b.bethe) < 1e-9 and a.mf == b.mf
    np.testing.assert_allclose(a.trw_mean, b.trw_mean, atol=1e-9)
