"""Write ``breast_cancer.csv`` (569 rows: 30 features of a breast mass and the class) from the copy of the
Wisconsin diagnostic breast cancer data that ships inside scikit-learn, without any network access.

    .venv/bin/python tasks/gp/data/make_breast_cancer.py

Reads ``sklearn/datasets/data/breast_cancer.csv`` (a first line ``569,30,malignant,benign``, then one row
per sample: 30 values and the class, 0 = malignant, 1 = benign) from the installed scikit-learn package
and writes it as one comma-separated file with a header: the feature names of
``sklearn.datasets.load_breast_cancer`` with underscores for spaces, then ``benign`` (1: benign, 0:
malignant, scikit-learn's coding). The values are copied as they are. See README.md for the source and
the licence.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

KINDS = ("radius", "texture", "perimeter", "area", "smoothness", "compactness", "concavity",
         "concave_points", "symmetry", "fractal_dimension")  # fmt: skip
COLUMNS = (*(f"mean_{k}" for k in KINDS), *(f"{k}_error" for k in KINDS), *(f"worst_{k}" for k in KINDS))
OUT = Path(__file__).resolve().parent / "breast_cancer.csv"


def sklearn_data_dir() -> Path:
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("scikit-learn is not installed in this environment (pip install scikit-learn)")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data"


def main() -> None:
    lines = (sklearn_data_dir() / "breast_cancer.csv").read_text().splitlines()
    n, d = (int(v) for v in lines[0].split(",")[:2])
    rows = [line.split(",") for line in lines[1:] if line.strip()]
    if len(rows) != n or d != len(COLUMNS) or any(len(r) != d + 1 for r in rows):
        raise SystemExit(f"unexpected shape: {len(rows)} rows (header says {n}), {d} features")
    if any(r[-1] not in ("0", "1") for r in rows):
        raise SystemExit("a class that is not 0 or 1")
    OUT.write_text("\n".join([",".join((*COLUMNS, "benign"))] + [",".join(r) for r in rows]) + "\n")
    print(f"wrote {OUT} ({len(rows)} rows, {d} inputs + the class)")


if __name__ == "__main__":
    main()
