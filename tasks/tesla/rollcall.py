"""Roll-call votes as TESLA data: legislators are the nodes, roll calls the samples.

Two sources, one in-memory form (:class:`RollCalls`):

* :func:`read_pscl` -- the ``s109`` roll-call object (109th US Senate, 2005-2006) of the R package
  ``pscl`` (Jackman), as Debian's ``r-cran-pscl`` installs it (``/usr/lib/R/site-library/pscl/data/Rdata.rdb``,
  R's lazy-load database), read without R by the pure-Python ``rdata`` package. Nothing of the package is
  copied into pgmflow (it is GPL-2): the file is read where it is installed.
* :func:`read_voteview` -- Voteview's CSV triple ``<prefix>_votes.csv`` (``rollnumber, icpsr, cast_code``,
  one row per legislator and roll call), ``<prefix>_rollcalls.csv`` (``rollnumber, date`` YYYY-MM-DD) and
  ``<prefix>_members.csv`` (``icpsr, bioname, state_abbrev, party_code``, optional ``chamber``).

Vote codes (both sources): 1-3 yea (+1), 4-6 nay (-1), 7-9 missing (abstention, not voting), 0 not in
office (Voteview: no row). :func:`to_series` turns roll calls into a
:class:`~pgmflow.tasks.tesla.data.BinaryTimeSeries` whose value 0 marks a missing vote (the solver leaves
it out of the node's own likelihood and lets it contribute nothing as a neighbour's value); the
President's row is dropped; a seat held by two legislators one after the other is merged into one node
(or every legislator who missed part of the term is dropped); the time axis has one time point per roll
call, per voting day, or per window of days. Bad input raises :class:`RollCallError` (a
``TeslaDataError``: one line naming the file, the problem and the fix).
"""

from __future__ import annotations

import csv
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

from pgmflow.tasks.tesla.data import BinaryTimeSeries, TeslaDataError

PSCL_PATHS = (
    "/usr/lib/R/site-library/pscl/data/Rdata.rdb",
    "/usr/local/lib/R/site-library/pscl/data/Rdata.rdb",
    "/usr/lib/R/library/pscl/data/Rdata.rdb",
)
PSCL_FIX = "as root: apt-get install -y r-cran-pscl, and pip install rdata (or use network.source=voteview)"
TIME_AXES = ("rollcall", "day", "window")
MISSING = ("skip", "nay")
PARTIAL = ("merge", "drop")
PARTY_CODES = {100: "D", 200: "R", 328: "Indep"}


class RollCallError(TeslaDataError):
    """Bad roll-call input (one line: the file, what is wrong, the fix)."""


class RollCalls(NamedTuple):
    """Roll calls as read: codes int16 [legislators, roll calls] (0-9 as in the module docstring),
    ``names``/``states``/``parties`` per legislator (str lists), ``dates`` datetime64[D] [roll calls],
    ``numbers`` int64 [roll calls] (the roll-call numbers), ``source`` (the file read)."""

    codes: np.ndarray
    names: list
    states: list
    parties: list
    dates: np.ndarray
    numbers: np.ndarray
    source: str


def find_pscl() -> Path | None:
    """The installed pscl lazy-load database, or None."""
    return next((Path(p) for p in PSCL_PATHS if Path(p).is_file()), None)


def _lazyload(rdb: Path, name: str):
    """One object of an R lazy-load database (``.rdx`` index beside the ``.rdb``), converted by rdata."""
    try:
        import rdata
        import rdata.parser
    except ImportError:
        raise RollCallError(rdb, "reading pscl's data needs the Python package rdata", PSCL_FIX) from None
    import gzip
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rdata warns that an index has no RDS header
        try:
            index = rdata.conversion.convert(
                rdata.parser.parse_data(gzip.decompress(rdb.with_suffix(".rdx").read_bytes()))
            )
        except (OSError, ValueError, EOFError) as exc:
            raise RollCallError(
                rdb, f"cannot read the index {rdb.with_suffix('.rdx').name} ({exc})", PSCL_FIX
            ) from None
        where = {str(k): v for k, v in index["variables"].items()}
        if name not in where:
            raise RollCallError(rdb, f"has no object {name!r}", f"use one of {', '.join(sorted(where))}")
        off, size = (int(v) for v in where[name])
        with open(rdb, "rb") as f:
            f.seek(off)
            chunk = f.read(size)
        obj = rdata.parser.parse_data(zlib.decompress(chunk[4:]), expand_altrep=True)
        return rdata.conversion.convert(obj)


def read_pscl(path: str | None = None, name: str = "s109") -> RollCalls:
    """pscl's roll-call object ``name`` from the lazy-load database ``path`` (None: the installed package)."""
    rdb = Path(path) if path else find_pscl()
    if rdb is None or not rdb.is_file():
        raise RollCallError(path or "pscl", "the R package pscl (Debian: r-cran-pscl) is not installed", PSCL_FIX)
    obj = _lazyload(rdb, name)
    votes = obj["votes"]
    codes = np.asarray(votes, dtype=np.float64)
    legis, vd = obj["legis.data"], obj["vote.data"]
    names = [str(s) for s in votes.coords[votes.dims[0]].values]
    dates = np.asarray(vd["date"], dtype=np.float64).astype("int64").astype("datetime64[D]")
    numbers = np.arange(1, codes.shape[1] + 1, dtype=np.int64)
    return _checked(
        rdb, codes, names, [str(s) for s in legis["state"]], [str(s) for s in legis["party"]], dates, numbers
    )


def _checked(src, codes, names, states, parties, dates, numbers) -> RollCalls:
    bad = ~np.isin(codes, np.arange(10))
    if bad.any():
        i, k = (int(v) for v in np.argwhere(bad)[0])
        raise RollCallError(
            src,
            f"unknown vote code {codes[i, k]:g} ({names[i]}, roll call {numbers[k]})",
            "use codes 1-3 yea, 4-6 nay, 7-9 missing, 0 not in office",
        )
    order = np.lexsort((numbers, dates))
    return RollCalls(codes.astype(np.int16)[:, order], names, states, parties, dates[order], numbers[order], str(src))


def _rows(path: Path, need: tuple) -> tuple[list, dict]:
    if not path.is_file():
        raise RollCallError(path, "file not found", "give the folder of the Voteview CSV files and their prefix")
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise RollCallError(path, "file is empty", "download the file again")
    col = {h.strip(): k for k, h in enumerate(rows[0])}
    absent = [c for c in need if c not in col]
    if absent:
        raise RollCallError(path, f"has no column {', '.join(absent)}", f"give a Voteview file with {', '.join(need)}")
    return rows[1:], col


def _members(path: Path) -> dict:
    rows, c = _rows(path, ("icpsr", "bioname", "state_abbrev", "party_code"))
    out = {}
    for r in rows:
        chamber = r[c["chamber"]] if "chamber" in c else ""
        last = r[c["bioname"]].split(",")[0].strip().upper()
        code = int(float(r[c["party_code"]]))
        party = PARTY_CODES.get(code, str(code))
        out[int(float(r[c["icpsr"]]))] = (
            f"{last} ({party} {r[c['state_abbrev']]})",
            r[c["state_abbrev"]],
            party,
            chamber,
        )
    return out


def read_voteview(folder: str, prefix: str = "S109") -> RollCalls:
    """Voteview's CSV triple ``<folder>/<prefix>_{votes,rollcalls,members}.csv``."""
    base = Path(folder)
    members = _members(base / f"{prefix}_members.csv")
    rpath = base / f"{prefix}_rollcalls.csv"
    rrows, rc = _rows(rpath, ("rollnumber", "date"))
    numbers = np.array([int(float(r[rc["rollnumber"]])) for r in rrows], np.int64)
    try:
        dates = np.array([r[rc["date"]] for r in rrows], dtype="datetime64[D]")
    except ValueError as exc:
        raise RollCallError(rpath, f"a date is not YYYY-MM-DD ({exc})", "write dates as YYYY-MM-DD") from None
    vpath = base / f"{prefix}_votes.csv"
    vrows, vc = _rows(vpath, ("rollnumber", "icpsr", "cast_code"))
    col_of = {int(n): k for k, n in enumerate(numbers)}
    voted = {int(float(r[vc["icpsr"]])) for r in vrows}
    unknown = sorted(i for i in voted if i not in members)
    seen = [i for i in members if i in voted]  # in the members file's order
    if unknown:
        raise RollCallError(
            vpath,
            f"legislator(s) {', '.join(map(str, unknown[:5]))} (icpsr) are not in {prefix}_members.csv",
            "use the votes and members files of the same congress and chamber",
        )
    row_of = {i: k for k, i in enumerate(seen)}
    codes = np.zeros((len(seen), numbers.size))
    for ln, r in enumerate(vrows, start=2):
        n = int(float(r[vc["rollnumber"]]))
        if n not in col_of:
            raise RollCallError(
                vpath, f"line {ln}: roll call {n} is not in {prefix}_rollcalls.csv", "use matching files"
            )
        codes[row_of[int(float(r[vc["icpsr"]]))], col_of[n]] = float(r[vc["cast_code"]])
    info = [members[i] for i in seen]
    return _checked(vpath, codes, [m[0] for m in info], [m[1] for m in info], [m[2] for m in info], dates, numbers)


def _seats(rc: RollCalls, partial: str) -> tuple[list, list]:
    """Rows of ``rc.codes`` per node (one row, or the rows of a seat held in turn), and notes."""
    serving = rc.codes != 0
    full = serving.all(axis=1)
    keep = [i for i, s in enumerate(rc.states) if s != "USA"]  # the President's row (pscl) is not a senator
    notes = [f"dropped the President's row ({rc.names[i]})" for i in range(len(rc.names)) if rc.states[i] == "USA"]
    part = [i for i in keep if not full[i]]
    if partial == "drop":
        if part:
            notes.append(
                f"dropped {len(part)} legislator(s) who served part of the term: {', '.join(rc.names[i] for i in part)}"
            )
        return [[i] for i in keep if full[i]], notes
    nodes = [[i] for i in keep if full[i]]
    used = set()
    for i in part:  # join legislators of one state whose terms do not overlap: one seat held in turn
        if i in used:
            continue
        group = [i]
        for j in part:
            if j != i and j not in used and rc.states[j] == rc.states[i]:
                if not (serving[group].any(axis=0) & serving[j]).any():
                    group.append(j)
        used.update(group)
        nodes.append(group)
        if len(group) > 1:
            notes.append(f"merged one seat held in turn: {' then '.join(rc.names[g] for g in group)}")
    nodes.sort(key=lambda g: min(g))
    return nodes, notes


def _time_points(rc: RollCalls, axis: str, window_days: int):
    """(time index per roll call int64 [m], time labels [T] str)."""
    iso = np.datetime_as_string(rc.dates, unit="D")
    if axis == "rollcall":
        return np.arange(iso.size, dtype=np.int64), np.array([f"{d} #{n:04d}" for d, n in zip(iso, rc.numbers)])
    if axis == "day":
        labels, tix = np.unique(iso, return_inverse=True)
        return tix.astype(np.int64), labels
    start = rc.dates.min()
    k = ((rc.dates - start).astype(np.int64) // window_days).astype(np.int64)
    n_win = int(k.max()) + 1
    empty = np.setdiff1d(np.arange(n_win), k)
    if empty.size:
        a = start + np.timedelta64(int(empty[0]) * window_days, "D")
        gap = int(np.diff(np.unique(rc.dates)).astype(np.int64).max())
        raise RollCallError(
            rc.source,
            f"time axis: the window {a}..{a + np.timedelta64(window_days - 1, 'D')} has no roll call "
            f"({empty.size} of {n_win} windows of {window_days} days are empty)",
            f"use network.window_days={gap} or more (the longest gap between voting days), or network.time_axis=day",
        )
    labels = np.datetime_as_string(start + np.arange(n_win) * np.timedelta64(window_days, "D"), unit="D")
    return k, labels


def to_series(rc: RollCalls, time_axis="rollcall", window_days=30, missing="skip", partial="merge"):
    """``(BinaryTimeSeries, parties per node, notes)`` of the roll calls (module docstring)."""
    nodes, notes = _seats(rc, partial)
    codes = np.stack([rc.codes[g].max(axis=0) for g in nodes])  # a seat: the one code of whoever served
    X = np.where((codes >= 1) & (codes <= 3), 1, np.where((codes >= 4) & (codes <= 6), -1, 0)).astype(np.int8)
    dead = np.flatnonzero(~(X != 0).any(axis=0))
    if dead.size:
        k = int(dead[0])
        raise RollCallError(
            rc.source,
            f"roll call {rc.numbers[k]} ({rc.dates[k]}) has every vote missing ({dead.size} such roll calls)",
            "drop the roll calls without votes from the files",
        )
    n_missing = int(((codes >= 7) | (codes == 0)).sum())
    if missing == "nay":
        X[codes >= 7] = -1  # not in office (code 0) stays missing
    notes.append(
        f"{n_missing} missing votes ({100 * n_missing / codes.size:.1f} %) "
        + (
            "left out of the likelihood (network.missing=skip)"
            if missing == "skip"
            else "read as nay (network.missing=nay)"
        )
    )
    tix, labels = _time_points(rc, time_axis, int(window_days))
    order = np.argsort(tix, kind="stable")
    names = [
        "/".join(rc.names[g].split(" (")[0] for g in grp) + " (" + rc.names[grp[0]].split(" (")[1] for grp in nodes
    ]
    parties = ["/".join(sorted({rc.parties[g] for g in grp})) for grp in nodes]
    series = BinaryTimeSeries(
        X=np.ascontiguousarray(X.T[order]),
        tix=tix[order],
        n_per_time=np.bincount(tix, minlength=labels.size).astype(np.int64),
        times=labels,
        node_names=names,
    )
    return series, parties, notes
