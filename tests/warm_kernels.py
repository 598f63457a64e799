"""Compile pgmflow's numba kernels into numba's on-disk cache before the tests start.

``python -m tests.warm_kernels A|B STORE_DIR`` runs one half of a set of tiny pipeline runs on the
synchronous scheduler; conftest.py starts both halves in parallel at the start of a session. In a
fresh clone the cache is empty, and without this every first use of a kernel, in the test process
or in the worker processes of the many clusters the tests start, compiles it on the spot (measured:
a fresh-clone suite ran 106 s longer than the same suite with a warm cache). After it, those
processes load the compiled kernels from the cache. A failure here only costs time: the tests
compile what they need themselves.
"""

from __future__ import annotations

import io
import sys
import time

RUNS = {
    "A": [
        ["pipeline=tempering", "debug=default"],
        ["pipeline=tempering", "model.L=64", "tempering.n_replicas=4", "tempering.n_rounds=1"],
        ["pipeline=tesla", "debug=default", "tesla.figures=false"],
        ["pipeline=bounds", "model=ising", "model.L=8", "variational.figures=false"],
        ["experiment=lda_seeded", "debug=default", "svi.figures=false"],
    ],
    "B": [
        ["pipeline=svi", "debug=default", "svi.figures=false"],
        ["pipeline=svi", "corpus=synthetic", "debug=default", "svi.figures=false"],
        ["pipeline=sparse_gp", "debug=default", "sparse_gp.figures=false"],  # the RBF exp kernel (tasks/fastexp.py)
        # tempering on a pairwise MRF with its MF/TRW bounds (the MRF sweep kernels and the general-MRF bounds:
        # about 38 s of compiling that the first test to use them paid, the tesla_tempering_study debug run in CI)
        [
            "pipeline=tempering",
            "model=mrf",
            "model.path={store}/mrf.npz",
            "bounds=true",
            "tempering.n_replicas=8",
            "tempering.n_rounds=2",
            "tempering.n_chains=2",
            "tempering.sweeps_per_scan=2",
            "tempering.figures=false",
        ],
    ],
}


def _write_mrf(path) -> None:
    """A 12-node pairwise MRF (dense J, fields) for the MRF warm-up run."""
    import numpy as np

    rng = np.random.default_rng(0)
    J = np.triu(rng.normal(0.0, 0.5, (12, 12)) * (rng.random((12, 12)) < 0.4), 1)
    np.savez(path, J=J + J.T, h=rng.normal(0.0, 0.3, 12))


def main(part: str, store: str) -> int:
    from pgmflow.core.runner import execute
    from tests.conftest import compose

    t0 = time.monotonic()
    _write_mrf(f"{store}/mrf.npz")
    took = []
    for overrides in RUNS[part]:
        cfg = compose(
            [o.format(store=store) for o in overrides]
            + ["progress=false", "cluster.profile=synchronous", f"tracking.uri=sqlite:///{store}/warm_{part}.db"]
        )
        if isinstance(cfg.get("corpus"), dict) and "cache_dir" in cfg["corpus"]:
            cfg["corpus"]["cache_dir"] = f"{store}/corpus_cache_{part}"
        t1 = time.monotonic()
        execute(cfg, stream=io.StringIO())
        took.append(f"{time.monotonic() - t1:.1f} s {' '.join(overrides[:2])}")
    print(f"warm_kernels {part}: {time.monotonic() - t0:.1f} s ({'; '.join(took)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
