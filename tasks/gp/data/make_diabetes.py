"""Write ``diabetes.csv`` (442 rows: ten baseline variables and the target) from the copy of the
diabetes data that ships inside scikit-learn, without any network access.

    .venv/bin/python tasks/gp/data/make_diabetes.py

Reads ``sklearn/datasets/data/diabetes_data_raw.csv.gz`` (the unscaled variables, space
separated) and ``diabetes_target.csv.gz`` from the installed scikit-learn package and writes them
as one comma-separated file with a header: ``age,sex,bmi,bp,s1,s2,s3,s4,s5,s6,target``. The
values are copied as they are (the raw data, not scikit-learn's scaled version); the target is
written as an integer (every value is whole). See README.md for the source and the licence.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

COLUMNS = ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6")
OUT = Path(__file__).resolve().parent / "diabetes.csv"


def sklearn_data_dir() -> Path:
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("scikit-learn is not installed in this environment (pip install scikit-learn)")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data"


def main() -> None:
    src = sklearn_data_dir()
    with gzip.open(src / "diabetes_data_raw.csv.gz", "rt") as f:
        rows = [line.split() for line in f if line.strip()]
    with gzip.open(src / "diabetes_target.csv.gz", "rt") as f:
        target = [float(line) for line in f if line.strip()]
    if len(rows) != len(target) or any(len(r) != len(COLUMNS) for r in rows):
        raise SystemExit(f"unexpected shape: {len(rows)} rows of data, {len(target)} targets")
    lines = [",".join((*COLUMNS, "target"))]
    for r, t in zip(rows, target):
        if t != int(t):
            raise SystemExit(f"target {t} is not a whole number")
        lines.append(",".join((*r, str(int(t)))))
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT} ({len(rows)} rows, {len(COLUMNS)} inputs + target)")


if __name__ == "__main__":
    main()
