"""Philox4x32-10: Random123 known answers, and the numba device function against NumPy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pgmflow.tasks.philox import numba_philox4x32, philox4x32_numpy

REPO = Path(__file__).resolve().parents[2]

# Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter[4] key[2] -> output[4].
KAT = [
    (
        (0x00000000, 0x00000000, 0x00000000, 0x00000000),
        (0x00000000, 0x00000000),
        (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8),
    ),
    (
        (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF),
        (0xFFFFFFFF, 0xFFFFFFFF),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_numpy_known_answers(ctr, key, expected):
    out = philox4x32_numpy(np.array(ctr, dtype=np.uint32), np.array(key, dtype=np.uint32))
    assert out.dtype == np.uint32 and out.shape == (4,)
    assert [int(x) for x in out] == list(expected)


def test_numpy_known_answers_batched():
    ctr = np.array([k[0] for k in KAT], dtype=np.uint32)  # [3, 4]
    key = np.array([k[1] for k in KAT], dtype=np.uint32)  # [3, 2]
    out = philox4x32_numpy(ctr, key)
    assert out.shape == (3, 4)
    np.testing.assert_array_equal(out, np.array([k[2] for k in KAT], dtype=np.uint32))


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_numba_known_answers(ctr, key, expected):
    f = numba_philox4x32()
    assert [int(x) for x in f(*ctr, *key)] == list(expected)


def test_numba_equals_numpy_on_random_inputs():
    nb = pytest.importorskip("numba")
    f = numba_philox4x32()

    @nb.njit
    def many(ctr, key):  # called from another njit function, as the kernels do
        out = np.empty((ctr.shape[0], 4), np.uint32)
        for n in range(ctr.shape[0]):
            x = f(ctr[n, 0], ctr[n, 1], ctr[n, 2], ctr[n, 3], key[n, 0], key[n, 1])
            for w in range(4):
                out[n, w] = np.uint32(x[w])
        return out

    rng = np.random.default_rng(20240611)
    ctr = rng.integers(0, 2**32, size=(2000, 4), dtype=np.uint64).astype(np.uint32)
    key = rng.integers(0, 2**32, size=(2000, 2), dtype=np.uint64).astype(np.uint32)
    ctr[:8] = 0xFFFFFFFF  # edge words
    key[:4] = 0
    ref = philox4x32_numpy(ctr, key)
    np.testing.assert_array_equal(many(ctr.astype(np.int64), key.astype(np.int64)), ref)
    # any integer type holding a 32-bit word is accepted
    np.testing.assert_array_equal(many(ctr, key), ref)


def test_numpy_broadcasts_key_and_distinguishes_counters():
    ctr = np.zeros((5, 4), dtype=np.uint32)
    ctr[:, 0] = np.arange(5)
    key = np.array([1, 2], dtype=np.uint32)
    out = philox4x32_numpy(ctr, key)
    assert out.shape == (5, 4)
    for n in range(5):
        np.testing.assert_array_equal(out[n], philox4x32_numpy(ctr[n], key))
    assert len({tuple(r) for r in out.tolist()}) == 5


def test_numpy_rejects_bad_input():
    with pytest.raises(ValueError, match="counter"):
        philox4x32_numpy(np.zeros(3, dtype=np.uint32), np.zeros(2, dtype=np.uint32))
    with pytest.raises(ValueError, match="key"):
        philox4x32_numpy(np.zeros(4, dtype=np.uint32), np.zeros(3, dtype=np.uint32))
    with pytest.raises(ValueError, match="2\\*\\*32"):
        philox4x32_numpy(np.array([0, 0, 0, 2**32], dtype=np.int64), np.zeros(2, dtype=np.uint32))
    with pytest.raises(TypeError):
        philox4x32_numpy(np.zeros(4), np.zeros(2, dtype=np.uint32))


def test_import_does_not_import_numba():
    code = (
        "import sys; import pgmflow.tasks.philox, pgmflow.tasks.tempering.ising_kernels; "
        "assert 'numba' not in sys.modules, 'numba imported'; "
        "assert 'cupy' not in sys.modules, 'cupy imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
