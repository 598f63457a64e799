"""Write ``co2.csv`` (the Mauna Loa weekly CO2 record, 2,225 weeks with a value) from the copy of the data
that ships inside statsmodels, without any network access.

    python tasks/gp/data/make_co2.py      # with an interpreter that has statsmodels installed

Reads ``statsmodels/datasets/co2/co2.csv`` (columns ``date`` as YYYYMMDD, ``co2`` in ppmv; weeks without a
measurement have an empty ``co2``) from the installed statsmodels package, drops the 59 weeks without a
value and writes a comma-separated file with the header ``year,co2``: ``year`` is the decimal year of the
sample date (``year + (day of the year - 1) / days in that year``, six decimals), ``co2`` the value as it
stands. statsmodels itself is not needed at run time. See README.md for the source and the licence.
"""

from __future__ import annotations

import csv
import datetime
import importlib.util
from pathlib import Path

OUT = Path(__file__).resolve().parent / "co2.csv"


def statsmodels_file() -> Path:
    spec = importlib.util.find_spec("statsmodels")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("statsmodels is not installed in this environment (pip install statsmodels)")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "co2" / "co2.csv"


def decimal_year(yyyymmdd: str) -> float:
    d = datetime.date(int(yyyymmdd[:4]), int(yyyymmdd[4:6]), int(yyyymmdd[6:8]))
    start = datetime.date(d.year, 1, 1)
    days = (datetime.date(d.year + 1, 1, 1) - start).days
    return d.year + (d - start).days / days


def main() -> None:
    with statsmodels_file().open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or set(rows[0]) != {"date", "co2"}:
        raise SystemExit(f"unexpected columns: {sorted(rows[0]) if rows else 'no rows'}")
    kept = [(decimal_year(r["date"]), r["co2"]) for r in rows if r["co2"].strip()]
    lines = ["year,co2"] + [f"{t:.6f},{float(v):g}" for t, v in kept]
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT} ({len(kept)} of {len(rows)} weeks: those with a value)")


if __name__ == "__main__":
    main()
