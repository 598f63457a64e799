"""``chunks.packed``: a group task's per-chunk results travel as one array per field and come back as the
same values, so the chunk-order sums made from them are the same bits."""

from __future__ import annotations

import pickle

import numpy as np

from pgmflow.tasks.gp import chunks
from pgmflow.tasks.gp import stats as gstats


def test_packed_results_come_back_as_the_same_values_and_sum_to_the_same_bits():
    rng = np.random.default_rng(0)
    stats = [
        gstats.Stats(10 + i, float(rng.random()), float(rng.random()), rng.random(4), rng.random((4, 4)))
        for i in range(3)
    ]
    grads = [gstats.Grad(rng.random(2), float(i), 0.0, rng.random((4, 2)), 0.0) for i in range(3)]
    for parts in (stats, grads):
        p = pickle.loads(pickle.dumps(chunks.packed(parts), protocol=5))  # as between two processes
        assert [stacked for stacked, _ in p.fields] == [isinstance(v, np.ndarray) for v in parts[0]]
        back = chunks.unpacked(p)
        assert [type(b) for b in back] == [type(a) for a in parts]
        for a, b in zip(parts, back):
            for x, y in zip(a, b):
                assert type(x) is type(y) or isinstance(y, np.ndarray)
                assert np.array_equal(x, y)
        order = [[2, 0], [1]]  # two groups: chunks 2 and 0, and chunk 1
        split = [chunks.packed([parts[2], parts[0]]), chunks.packed([parts[1]])]
        got = gstats.sum_in_order(chunks.in_chunk_order(order, split))
        want = gstats.sum_in_order(parts)
        assert all(np.array_equal(x, y) for x, y in zip(got, want))


def test_packed_keeps_fields_of_unequal_shapes_and_lists_pass_through():
    parts = [
        gstats.Grad(np.zeros(2), 0.0, 0.0, np.zeros((3, 2)), np.zeros((3, 3))),
        gstats.Grad(np.ones(2), 1.0, 0.0, np.ones((3, 2)), 0.0),
    ]  # Kuu: an array, then a scalar
    p = chunks.packed(parts)
    assert p.fields[4][0] is False and chunks.unpacked(p)[1].Kuu == 0.0
    assert chunks.unpacked(parts) == parts and chunks.unpacked(chunks.packed([])) == []
