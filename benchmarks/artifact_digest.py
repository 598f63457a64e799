"""Digests of every artifact a set of runs logs, to show that a change leaves results bit-identical.

    .venv/bin/python benchmarks/artifact_digest.py --out /tmp/before.json            # at the old commit
    .venv/bin/python benchmarks/artifact_digest.py --out /tmp/after.json             # at the new one
    .venv/bin/python benchmarks/artifact_digest.py --compare /tmp/before.json /tmp/after.json

Each case is a debug-size run (``debug=default`` plus the case's overrides) on the synchronous
scheduler (the bits do not depend on the scheduler: tests/pipelines/test_bit_reproducibility.py),
into a fresh MLflow store in a temporary folder. Every ``.npz`` array is hashed with its dtype and
shape; JSON files are hashed after dropping the fields that measure time (a key naming seconds,
time, rate, per-second figures or memory); text files are hashed whole unless they hold timings; figures
are skipped (their pixels carry no number that the arrays do not). ``--only NAME`` picks cases.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

CASES = {
    "tempering": ["pipeline=tempering"],
    "tempering_bounds": ["pipeline=tempering", "bounds=true"],
    "gaussian_mixture": ["experiment=gaussian_mixture"],
    "spin_glass": ["experiment=spin_glass"],
    "svi": ["pipeline=svi"],
    "lda_seeded": ["experiment=lda_seeded"],
    "tesla": ["pipeline=tesla"],
    "tesla_heldout": ["pipeline=tesla", "tesla.criterion=heldout"],
    "bounds": ["pipeline=bounds"],
    "sparse_gp": ["pipeline=sparse_gp"],
    "sparse_gp_fitc": ["pipeline=sparse_gp", "sparse_gp.method=fitc"],
    "sparse_gp_svgp": ["pipeline=sparse_gp", "sparse_gp.method=svgp"],
    "sparse_gp_exact": ["pipeline=sparse_gp", "sparse_gp.method=exact"],
    "sparse_gp_dtc_matern32": ["pipeline=sparse_gp", "sparse_gp.method=dtc", "sparse_gp.kernel=matern32"],
    "sparse_gp_fitc_matern52": ["pipeline=sparse_gp", "sparse_gp.method=fitc", "sparse_gp.kernel=matern52"],
    "sparse_gp_svgp_matern32": ["pipeline=sparse_gp", "sparse_gp.method=svgp", "sparse_gp.kernel=matern32"],
    "sparse_gp_exact_matern52": ["pipeline=sparse_gp", "sparse_gp.method=exact", "sparse_gp.kernel=matern52"],
}
TIMING = re.compile(
    r"(seconds?|_time$|^time_|_at$|wall|elapsed|duration|per_second|docs_per|throughput|rss|_mb$|memory)", re.I
)
SKIP_SUFFIX = (".png", ".svg", ".pdf", ".html")
SKIP_FILES = {"config.yaml", "run.log", "environment.txt", "MLmodel"}  # MLmodel: its run id and creation time
SKIP_ARRAYS = {"history"}  # the tempering checkpoints' per-round log (wall-clock times in it)


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if not TIMING.search(str(k))}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def digest_file(path: Path) -> dict | str | None:
    if path.suffix in SKIP_SUFFIX or path.name in SKIP_FILES:
        return None
    if path.suffix == ".npz":
        import numpy as np

        with np.load(path, allow_pickle=False) as z:
            return {
                k: hashlib.sha256(f"{z[k].dtype}{z[k].shape}".encode() + z[k].tobytes()).hexdigest()[:16]
                for k in sorted(z.files)
                if k not in SKIP_ARRAYS and not TIMING.search(k)
            }
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except ValueError:
            return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        return hashlib.sha256(json.dumps(_strip(data), sort_keys=True).encode()).hexdigest()[:16]
    text = path.read_bytes()
    if path.suffix in (".csv", ".txt", ".md", ".yaml") and TIMING.search(text.decode(errors="replace")[:400]):
        return None  # a table with a timing column in its header
    return hashlib.sha256(text).hexdigest()[:16]


def run_case(name: str, overrides: list[str], root: Path) -> dict:
    import pgmflow

    work = root / name
    work.mkdir(parents=True)
    cwd = os.getcwd()
    os.chdir(work)
    try:
        res = pgmflow.run(
            *overrides,
            "debug=default",
            "cluster.profile=synchronous",
            "progress=false",
            f"tracking.uri=sqlite:///{work / 'mlflow.db'}",
        )
    finally:
        os.chdir(cwd)
    out = {}
    base = Path(res.artifact_dir)
    for p in sorted(base.rglob("*")):
        if p.is_file():
            d = digest_file(p)
            if d is not None:
                out[str(p.relative_to(base))] = d
    return out


def compare(a: dict, b: dict) -> int:
    bad = 0
    for case in sorted(set(a) | set(b)):
        fa, fb = a.get(case), b.get(case)
        if fa is None or fb is None:
            print(f"{case}: only in {'the second' if fa is None else 'the first'}")
            continue
        diffs = []
        for f in sorted(set(fa) | set(fb)):
            if fa.get(f) != fb.get(f):
                if isinstance(fa.get(f), dict) and isinstance(fb.get(f), dict):
                    keys = sorted(k for k in set(fa[f]) | set(fb[f]) if fa[f].get(k) != fb[f].get(k))
                    diffs.append(f"{f} [{', '.join(keys)}]")
                else:
                    diffs.append(f)
        bad += bool(diffs)
        print(f"{case}: {'identical' if not diffs else 'DIFFERS: ' + '; '.join(diffs)} ({len(fa)} files)")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--only", nargs="*", choices=sorted(CASES))
    ap.add_argument("--compare", nargs=2, type=Path)
    a = ap.parse_args()
    if a.compare:
        return compare(*(json.loads(p.read_text()) for p in a.compare))
    os.environ.setdefault("MPLBACKEND", "Agg")
    digests = {}
    with tempfile.TemporaryDirectory(prefix="pgmflow-digest-") as tmp:
        for name in a.only or CASES:
            print(f"artifact_digest: {name} ...", file=sys.stderr, flush=True)
            digests[name] = run_case(name, CASES[name], Path(tmp))
    text = json.dumps(digests, indent=1, sort_keys=True)
    if a.out:
        a.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
