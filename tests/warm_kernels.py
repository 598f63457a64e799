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
    ],
    "B": [
        ["pipeline=svi", "debug=default", "svi.figures=false"],
        ["pipeline=svi", "corpus=synthetic", "debug=default", "svi.figures=false"],
        ["experiment=lda_seeded", "debug=default", "svi.figures=false"],
        ["pipeline=sparse_gp", "debug=default", "sparse_gp.figures=false"],
    ],  # the RBF exp kernel (tasks/fastexp.py)
}


def main(part: str, store: str) -> int:
    from pgmflow.core.runner import execute
    from tests.conftest import compose

    t0 = time.monotonic()
    for overrides in RUNS[part]:
        cfg = compose(
            overrides
            + ["progress=false", "cluster.profile=synchronous", f"tracking.uri=sqlite:///{store}/warm_{part}.db"]
        )
        if isinstance(cfg.get("corpus"), dict) and "cache_dir" in cfg["corpus"]:
            cfg["corpus"]["cache_dir"] = f"{store}/corpus_cache_{part}"
        execute(cfg, stream=io.StringIO())
    print(f"warm_kernels {part}: {time.monotonic() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
