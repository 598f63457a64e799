"""Binary time-series data for TESLA: the in-memory form, loaders, writers and validation.

In memory
---------
:class:`BinaryTimeSeries` holds ``N`` samples of ``p`` binary nodes (values in {-1, +1}), each
taken at one of ``T`` time points: the rows of ``X`` are grouped by time point, in time order.

Inputs
------
* :func:`from_array` -- an array [T, n, p]; :func:`from_arrays` -- a list of T arrays [n_t, p].
* :func:`load_npz` -- a ``.npz`` file with either key ``X`` [T, n, p] or keys ``x_0 .. x_{T-1}``
  each [n_t, p] (n_t may vary); optional keys ``times`` [T] (time labels) and ``node_names`` [p]
  (a string array). No other keys.
* :func:`load_csv` -- long format, a header row naming the columns ``time, sample, node, value``
  (any order, no other columns), one row per (time, sample, node). Time labels are numbers when
  all of them parse as numbers (sorted numerically; ``1`` and ``1.0`` are the same time) and
  strings otherwise (sorted lexicographically). Sample labels are strings local to a time point;
  samples keep their order of first appearance, and so do nodes. Every (time, sample) must give
  exactly one value for every node.

Time points are put in increasing order of their labels (labels must be unique). Values must be
-1/+1; data coded 0/1 (only 0 and 1 present) are recoded 0 -> -1 and the result says so
(``recoded_from_01``). Any other value, NaN or infinity, a shape that does not fit, a time point
without samples or fewer than two nodes raises :class:`TeslaDataError`, whose one-line message
names the file (``<array>`` for in-memory input), what is wrong and where, and how to fix it.

:func:`save_npz` and :func:`save_csv` write the formats above; :func:`constant_nodes` finds
nodes that never change (the pipeline reports them as isolated, with a warning).
"""

from __future__ import annotations

import csv
import math
import os
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = [
    "ARRAY_PATH",
    "CSV_COLUMNS",
    "BinaryTimeSeries",
    "TeslaDataError",
    "constant_nodes",
    "from_array",
    "from_arrays",
    "load",
    "load_csv",
    "load_npz",
    "save_csv",
    "save_npz",
]

CSV_COLUMNS = ("time", "sample", "node", "value")
ARRAY_PATH = "<array>"
_NPZ_OPTIONAL = ("times", "node_names")


class TeslaDataError(ValueError):
    """Bad TESLA input data.

    Attributes: ``path`` (str, the file, or ``"<array>"``), ``problem`` (str), ``fix`` (str).
    ``str(exc) == f"{path}: {problem}; fix: {fix}"``.
    """

    def __init__(self, path, problem, fix):
        self.path = str(path)
        self.problem = str(problem)
        self.fix = str(fix)
        super().__init__(f"{self.path}: {self.problem}; fix: {self.fix}")

    def __reduce__(self):  # picklable (exceptions travel between processes)
        return (type(self), (self.path, self.problem, self.fix))


class BinaryTimeSeries(NamedTuple):
    """Binary samples at T time points.

    X: int8 [N, p], values in {-1, +1}; rows grouped by time point, time points in order (the
        samples of time point t are rows ``offsets[t]:offsets[t+1]``, in input order).
    tix: int64 [N], the time index 0..T-1 of each row (non-decreasing).
    n_per_time: int64 [T], the number of samples of each time point (each >= 1).
    times: numpy array [T], the original time labels, strictly increasing (int64 or float64 for
        numeric labels, str for string labels; ``arange(T)`` when none were given).
    node_names: list[str] of length p, unique (``"0", "1", ...`` when none were given).
    recoded_from_01: bool, True when the input was coded 0/1 and 0 was recoded to -1.
    """

    X: np.ndarray
    tix: np.ndarray
    n_per_time: np.ndarray
    times: np.ndarray
    node_names: list
    recoded_from_01: bool = False

    @property
    def T(self) -> int:
        """Number of time points."""
        return int(self.n_per_time.shape[0])

    @property
    def p(self) -> int:
        """Number of nodes."""
        return int(self.X.shape[1])

    @property
    def N(self) -> int:
        """Total number of samples (rows)."""
        return int(self.X.shape[0])

    @property
    def offsets(self) -> np.ndarray:
        """int64 [T + 1]: the rows of time point t are ``offsets[t]:offsets[t + 1]``."""
        out = np.zeros(self.T + 1, dtype=np.int64)
        np.cumsum(self.n_per_time, out=out[1:])
        return out

    def at(self, t: int) -> np.ndarray:
        """The samples of time point index ``t``: int8 [n_t, p] (a view)."""
        o = self.offsets
        return self.X[o[t] : o[t + 1]]


def constant_nodes(data: BinaryTimeSeries) -> np.ndarray:
    """int64 indices of the nodes whose value is the same in every row where it is observed (0 marks a
    missing value, as roll-call data has: ``pgmflow.tasks.tesla.rollcall``)."""
    X = data.X
    if X.shape[0] == 0:
        return np.arange(X.shape[1], dtype=np.int64)
    return np.flatnonzero(~(X == 1).any(axis=0) | ~(X == -1).any(axis=0)).astype(np.int64)


# ------------------------------------------------------------------------------------------------
# Validation shared by the array and npz inputs
# ------------------------------------------------------------------------------------------------


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return repr(int(f)) if f.is_integer() and abs(f) < 2**53 else repr(f)
    if isinstance(v, (np.integer, np.bool_)):
        return repr(int(v))
    return repr(v.item() if isinstance(v, np.generic) else v)


def _labels(path, values, n, what, unit) -> np.ndarray | None:
    """Validate optional labels (times or node names) of length n: returns a 1-D numpy array."""
    if values is None:
        return None
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise TeslaDataError(
            path,
            f"{what} has shape {arr.shape} but the data have {n} {unit}s",
            f"give {what} as a vector with one entry per {unit}",
        )
    return arr


def _check_times(path, times, T):
    arr = _labels(path, times, T, "times", "time point")
    if arr is None:
        return np.arange(T, dtype=np.int64), np.arange(T)
    if arr.dtype.kind in "iub":
        arr = arr.astype(np.int64)
    elif arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            k = int(np.flatnonzero(~np.isfinite(arr))[0])
            raise TeslaDataError(
                path, f"time label {_fmt(arr[k])} (time point {k}) is not finite", "give finite numeric time labels"
            )
        arr = arr.astype(np.float64)
    elif arr.dtype.kind in "US":
        arr = arr.astype(str)
    else:
        raise TeslaDataError(path, f"time labels have dtype {arr.dtype}", "give numbers or strings as time labels")
    order = np.argsort(arr, kind="stable")
    s = arr[order]
    dup = np.flatnonzero(s[1:] == s[:-1])
    if dup.size:
        k = order[dup[0] + 1]
        raise TeslaDataError(
            path,
            f"time label {_fmt(arr[k])} appears more than once (time point {int(k)})",
            "give each time point a unique label",
        )
    return s, order


def _check_node_names(path, names, p):
    arr = _labels(path, names, p, "node_names", "node")
    if arr is None:
        return [str(j) for j in range(p)]
    out = [str(x) for x in arr.tolist()]
    seen = {}
    for j, name in enumerate(out):
        if name in seen:
            raise TeslaDataError(
                path, f"node name {name!r} is used by nodes {seen[name]} and {j}", "give every node a unique name"
            )
        seen[name] = j
    return out


def _check_values(path, X, where):
    """Check that the numeric array X [N, p] is finite and binary; returns (int8 X, recoded)."""
    if X.dtype.kind not in "biuf":
        raise TeslaDataError(
            path, f"values have dtype {X.dtype}, not a number type", "store the values as numbers -1/+1 (or 0/1)"
        )
    if X.dtype.kind == "f":
        bad = ~np.isfinite(X)
        if bad.any():
            r, j = (int(v) for v in np.argwhere(bad)[0])
            what = "NaN" if np.isnan(X[r, j]) else f"infinite value {_fmt(X[r, j])}"
            raise TeslaDataError(
                path,
                f"{what} at {where(r, j)}",
                "remove or impute missing values; TESLA needs every value to be -1 or +1",
            )
    is_pm = (X == 1) | (X == -1)
    if is_pm.all():
        return X.astype(np.int8), False
    is01 = (X == 0) | (X == 1)
    if is01.all():
        return np.where(X == 0, -1, 1).astype(np.int8), True
    binary = is_pm | (X == 0)
    if not binary.all():
        r, j = (int(v) for v in np.argwhere(~binary)[0])
        raise TeslaDataError(
            path, f"value {_fmt(X[r, j])} at {where(r, j)} is not binary", "code every value as -1/+1 (or 0/1)"
        )
    r0, j0 = (int(v) for v in np.argwhere(X == 0)[0])
    r1, j1 = (int(v) for v in np.argwhere(X == -1)[0])
    raise TeslaDataError(
        path,
        f"values mix the codings -1/+1 and 0/1: value 0 at {where(r0, j0)} and value -1 at {where(r1, j1)}",
        "code every value as -1/+1, or every value as 0/1",
    )


def _assemble(path, blocks, block_names, times, node_names, kind):
    """Build a BinaryTimeSeries from T numeric blocks [n_t, p] (already 2-D)."""
    T = len(blocks)
    if T == 0:
        raise TeslaDataError(path, "there are no time points", "give at least one time point with samples")
    p = blocks[0].shape[1]
    for k, b in enumerate(blocks):
        if b.shape[1] != p:
            raise TeslaDataError(
                path,
                f"{block_names[k]} has {b.shape[1]} columns (nodes) while {block_names[0]} has {p}",
                "give every time point the same nodes, one column each",
            )
    for k, b in enumerate(blocks):
        if b.shape[0] == 0:
            raise TeslaDataError(
                path, f"{block_names[k]} has zero samples (shape {b.shape})", "drop time points without samples"
            )
    if p < 2:
        raise TeslaDataError(
            path,
            f"the data have p={p} node{'s' if p != 1 else ''}; a network needs at least 2",
            "give at least two nodes",
        )
    times_sorted, order = _check_times(path, times, T)
    names = _check_node_names(path, node_names, p)
    n = np.array([b.shape[0] for b in blocks], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(n)])
    dtypes = {b.dtype for b in blocks}
    X = (
        np.concatenate(blocks, axis=0)
        if len(dtypes) == 1
        else np.concatenate([b.astype(np.result_type(*dtypes)) for b in blocks], axis=0)
    )

    def where(r, j):
        t = int(np.searchsorted(starts, r, side="right") - 1)
        label = _fmt(times[t]) if times is not None else str(t)
        if kind == "list":
            return f"{block_names[t]} row {r - starts[t]}, column {j} (time {label}, node {names[j]!r})"
        return f"X[{t}, {r - starts[t]}, {j}] (time {label}, sample {r - starts[t]}, node {names[j]!r})"

    Xb, recoded = _check_values(path, X, where)
    if not np.array_equal(order, np.arange(T)):
        Xb = np.concatenate([Xb[starts[t] : starts[t + 1]] for t in order], axis=0)
        n = n[order]
    tix = np.repeat(np.arange(T, dtype=np.int64), n)
    return BinaryTimeSeries(
        X=np.ascontiguousarray(Xb), tix=tix, n_per_time=n, times=times_sorted, node_names=names, recoded_from_01=recoded
    )


def _as_numeric(path, a, name):
    a = np.asarray(a)
    if a.dtype == object:
        raise TeslaDataError(path, f"{name} is an object array", "store the values as a numeric array of -1/+1")
    return a


def from_array(
    X_tnp, node_names: Sequence[str] | None = None, times=None, *, path: str = ARRAY_PATH
) -> BinaryTimeSeries:
    """Validate an array [T, n, p] of -1/+1 (or 0/1) values; ``times`` [T] and ``node_names`` [p]
    are optional. ``path`` only names the source in error messages."""
    X = _as_numeric(path, X_tnp, "X")
    if X.ndim != 3:
        raise TeslaDataError(
            path,
            f"X has shape {X.shape} ({X.ndim}-D); expected [T, n, p] (3-D)",
            "give an array [time points, samples, nodes], or a list of [n_t, p] arrays",
        )
    if X.shape[1] == 0:
        raise TeslaDataError(
            path,
            f"every time point has zero samples (X has shape {X.shape})",
            "give at least one sample per time point",
        )
    return _assemble(path, list(X), [f"X[{t}]" for t in range(X.shape[0])], times, node_names, "array")


def from_arrays(
    xs: Sequence,
    node_names: Sequence[str] | None = None,
    times=None,
    *,
    path: str = ARRAY_PATH,
    names: Sequence[str] | None = None,
) -> BinaryTimeSeries:
    """Validate a list of T arrays [n_t, p] (n_t may vary). ``names`` name the arrays in error
    messages (default ``x_0, x_1, ...``)."""
    names = [f"x_{t}" for t in range(len(xs))] if names is None else list(names)
    blocks = []
    for t, x in enumerate(xs):
        a = _as_numeric(path, x, names[t])
        if a.ndim != 2:
            raise TeslaDataError(
                path,
                f"{names[t]} has shape {a.shape}; expected [n_t, p] (2-D)",
                "give each time point as a 2-D array [samples, nodes]",
            )
        blocks.append(a)
    return _assemble(path, blocks, names, times, node_names, "list")


# ------------------------------------------------------------------------------------------------
# Files
# ------------------------------------------------------------------------------------------------


def _check_file(path: Path):
    if not path.exists():
        raise TeslaDataError(path, "file not found", "check the path")
    if path.is_dir():
        raise TeslaDataError(path, "is a folder, not a file", "give the path of a .npz or .csv file")
    if path.stat().st_size == 0:
        raise TeslaDataError(path, "file is empty", "write the data again; the file has no content")


def load(path) -> BinaryTimeSeries:
    """Load a ``.npz`` or ``.csv`` file (by extension)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return load_npz(path)
    if suffix in (".csv", ".txt"):
        return load_csv(path)
    raise TeslaDataError(
        path,
        f"unknown file type {suffix or '(no extension)'!r}",
        "give a .npz file (key X or x_0, x_1, ...) or a long-format .csv file",
    )


def load_npz(path) -> BinaryTimeSeries:
    """Load an ``.npz`` file: key ``X`` [T, n, p] or keys ``x_0 .. x_{T-1}`` [n_t, p]; optional
    ``times`` [T] and ``node_names`` [p]."""
    path = Path(path)
    _check_file(path)
    if not zipfile.is_zipfile(path):
        raise TeslaDataError(
            path,
            "is not an .npz file (not a zip archive)",
            "save the data with numpy.savez or pgmflow.tasks.tesla.data.save_npz",
        )
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = list(z.files)
            arrays = {k: z[k] for k in keys}
    except ValueError as exc:
        if "pickle" in str(exc):
            raise TeslaDataError(
                path,
                "holds object arrays (pickled data), which are not loaded",
                "save node_names and times as plain arrays, e.g. np.array(names, dtype=str)",
            ) from None
        raise TeslaDataError(path, f"cannot be read as .npz ({exc})", "write the file again") from None
    except (OSError, zipfile.BadZipFile, EOFError, KeyError, zlib.error) as exc:
        raise TeslaDataError(path, f"is corrupt ({type(exc).__name__}: {exc})", "write the file again") from None
    times = arrays.get("times")
    node_names = arrays.get("node_names")
    listed = {k for k in keys if k.startswith("x_") and k[2:].isdigit()}
    other = sorted(set(keys) - listed - {"X", *_NPZ_OPTIONAL})
    if other:
        raise TeslaDataError(
            path, f"has unexpected keys {other}", "keep only X (or x_0, x_1, ...), times and node_names"
        )
    if "X" in arrays and listed:
        raise TeslaDataError(
            path,
            f"has both key X and keys {sorted(listed, key=lambda k: int(k[2:]))[:3]}...",
            "keep one layout: X [T, n, p] or x_0, x_1, ... [n_t, p]",
        )
    if "X" in arrays:
        return from_array(arrays["X"], node_names=node_names, times=times, path=str(path))
    if not listed:
        raise TeslaDataError(
            path,
            f"has no data keys (found {sorted(keys)})",
            "store the samples under X [T, n, p] or x_0, x_1, ... [n_t, p]",
        )
    idx = sorted(int(k[2:]) for k in listed)
    expected = list(range(len(idx)))
    if idx != expected or any(k != f"x_{int(k[2:])}" for k in listed):
        missing = sorted(set(range(max(idx) + 1)) - set(idx))
        problem = (
            f"key x_{missing[0]} is missing (found {len(idx)} keys up to x_{max(idx)})"
            if missing
            else f"keys {sorted(listed)} are not numbered x_0, x_1, ... without leading zeros"
        )
        raise TeslaDataError(path, problem, "number the time points x_0, x_1, ..., x_{T-1} without gaps")
    names = [f"x_{t}" for t in expected]
    return from_arrays([arrays[k] for k in names], node_names=node_names, times=times, path=str(path), names=names)


def _parse_float(s: str):
    try:
        return float(s)
    except ValueError:
        return None


def load_csv(path) -> BinaryTimeSeries:
    """Load a long-format CSV file with the columns ``time, sample, node, value`` (module docstring)."""
    path = Path(path)
    _check_file(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f))
    except UnicodeDecodeError as exc:
        raise TeslaDataError(
            path, f"is not a UTF-8 text file (byte {exc.start})", "give a plain-text CSV file"
        ) from None
    except csv.Error as exc:
        raise TeslaDataError(path, f"is not a valid CSV file ({exc})", "give a plain-text CSV file") from None
    # (line number, fields) of the non-blank lines
    lines = [(k + 1, r) for k, r in enumerate(rows) if r and any(c.strip() for c in r)]
    if not lines:
        raise TeslaDataError(path, "has no header and no data", "write a header row: time,sample,node,value")
    hline, header = lines[0]
    header = [c.strip().lower() for c in header]
    dup = sorted({c for c in header if header.count(c) > 1})
    if dup:
        raise TeslaDataError(
            path, f"header (line {hline}) repeats columns {dup}", "name each of time, sample, node, value once"
        )
    missing = [c for c in CSV_COLUMNS if c not in header]
    extra = [c for c in header if c not in CSV_COLUMNS]
    if extra:
        raise TeslaDataError(
            path,
            f"header (line {hline}) has unexpected columns {extra}",
            "keep exactly the columns time, sample, node, value",
        )
    if missing:
        raise TeslaDataError(
            path,
            f"header (line {hline}) lacks columns {missing} (found {header})",
            "write a header row naming the columns time, sample, node, value",
        )
    col = [header.index(c) for c in CSV_COLUMNS]
    data = lines[1:]
    if not data:
        raise TeslaDataError(path, "has a header but no data rows", "add one row per (time, sample, node)")
    n = len(data)
    lineno = np.empty(n, dtype=np.int64)
    tcol, scol, ncol, vcol = [], [], [], []
    for k, (ln, r) in enumerate(data):
        if len(r) != len(header):
            raise TeslaDataError(
                path,
                f"line {ln} has {len(r)} fields, the header has {len(header)}",
                "give every row a time, sample, node and value",
            )
        lineno[k] = ln
        tcol.append(r[col[0]].strip())
        scol.append(r[col[1]].strip())
        ncol.append(r[col[2]].strip())
        vcol.append(r[col[3]].strip())

    def at(k):
        return f"line {lineno[k]} (time {tcol[k]!r}, sample {scol[k]!r}, node {ncol[k]!r})"

    for k in range(n):
        if not tcol[k] or not scol[k] or not ncol[k]:
            empty = [c for c, v in zip(CSV_COLUMNS, (tcol[k], scol[k], ncol[k])) if not v]
            raise TeslaDataError(path, f"empty {', '.join(empty)} at {at(k)}", "fill in every time, sample and node")

    # values
    try:
        vals = np.array(vcol, dtype=np.float64)
    except ValueError:
        k = next(i for i, s in enumerate(vcol) if _parse_float(s) is None)
        raise TeslaDataError(
            path, f"value {vcol[k]!r} at {at(k)} is not a number", "code every value as -1/+1 (or 0/1)"
        ) from None
    Xv, recoded = _check_values(path, vals[:, None], lambda r, j: at(r))
    Xv = Xv[:, 0]

    # time labels: numeric when all parse as finite numbers, else strings
    uniq_t, inv_t = np.unique(np.array(tcol, dtype=str), return_inverse=True)
    num = [_parse_float(s) for s in uniq_t]
    if all(v is not None and math.isfinite(v) for v in num):
        numv = np.array(num, dtype=np.float64)
        times, inv2 = np.unique(numv, return_inverse=True)
        tid = inv2.reshape(-1)[inv_t.reshape(-1)]
        if np.all(times == np.round(times)) and np.all(np.abs(times) < 2**53):
            times = times.astype(np.int64)
    else:
        times, tid = uniq_t, inv_t.reshape(-1)
    T = times.shape[0]

    # nodes in order of first appearance
    uniq_n, first_n, inv_n = np.unique(np.array(ncol, dtype=str), return_index=True, return_inverse=True)
    order_n = np.argsort(first_n, kind="stable")
    rank_n = np.empty_like(order_n)
    rank_n[order_n] = np.arange(order_n.size)
    nid = rank_n[inv_n.reshape(-1)]
    node_names = [str(x) for x in uniq_n[order_n]]
    p = len(node_names)

    # samples: (time, sample label) groups, time-major, samples in order of first appearance
    skey = np.array([f"{t}\x00{s}" for t, s in zip(tid.tolist(), scol)], dtype=str)
    _, first_s, inv_s = np.unique(skey, return_index=True, return_inverse=True)
    inv_s = inv_s.reshape(-1)
    g_time = tid[first_s]
    order_g = np.lexsort((first_s, g_time))  # by time, then first appearance
    rank_g = np.empty_like(order_g)
    rank_g[order_g] = np.arange(order_g.size)
    gid = rank_g[inv_s]
    G = order_g.size
    n_per_time = np.bincount(g_time, minlength=T).astype(np.int64)

    if p < 2:
        raise TeslaDataError(
            path,
            f"the data have p={p} node (node {node_names[0]!r}); a network needs at least 2",
            "give at least two nodes",
        )
    cell = gid * p + nid
    counts = np.bincount(cell, minlength=G * p)
    if np.any(counts > 1):
        c = int(np.flatnonzero(counts > 1)[0])
        ks = np.flatnonzero(cell == c)
        raise TeslaDataError(
            path,
            f"time {tcol[ks[0]]!r}, sample {scol[ks[0]]!r} has {ks.size} values for node "
            f"{ncol[ks[0]]!r} (lines {', '.join(str(lineno[k]) for k in ks[:5])})",
            "give exactly one value per (time, sample, node)",
        )
    if np.any(counts == 0):
        c = int(np.flatnonzero(counts == 0)[0])
        g = c // p
        k = int(np.flatnonzero(gid == g)[0])
        absent = [node_names[m] for m in range(p) if counts[g * p + m] == 0]
        more = f" (and {len(absent) - 5} more)" if len(absent) > 5 else ""
        raise TeslaDataError(
            path,
            f"time {tcol[k]!r}, sample {scol[k]!r} (first at line {lineno[k]}) has no value "
            f"for node{'s' if len(absent) > 1 else ''} {', '.join(map(repr, absent[:5]))}{more}",
            "give every (time, sample) one value for every node",
        )
    X = np.empty(G * p, dtype=np.int8)
    X[cell] = Xv
    X = X.reshape(G, p)
    tix = np.repeat(np.arange(T, dtype=np.int64), n_per_time)
    return BinaryTimeSeries(
        X=X, tix=tix, n_per_time=n_per_time, times=times, node_names=node_names, recoded_from_01=recoded
    )


# ------------------------------------------------------------------------------------------------
# Writers
# ------------------------------------------------------------------------------------------------


def save_npz(data: BinaryTimeSeries, path, layout: str = "auto") -> None:
    """Write ``data`` as ``.npz``: ``layout="stacked"`` (key ``X`` [T, n, p]; needs the same n at
    every time point), ``"list"`` (keys ``x_0 ..``) or ``"auto"`` (stacked when possible). Values
    are written as -1/+1 int8, with ``times`` and ``node_names``."""
    if layout not in ("auto", "stacked", "list"):
        raise ValueError(f"layout must be auto, stacked or list; got {layout!r}")
    same_n = bool(np.all(data.n_per_time == data.n_per_time[0]))
    if layout == "stacked" and not same_n:
        raise ValueError("layout='stacked' needs the same number of samples at every time point; use 'list'")
    extra = {"times": np.asarray(data.times), "node_names": np.array(data.node_names, dtype=str)}
    if layout == "stacked" or (layout == "auto" and same_n):
        np.savez(path, X=data.X.reshape(data.T, -1, data.p), **extra)
    else:
        np.savez(path, **{f"x_{t}": data.at(t) for t in range(data.T)}, **extra)


def save_csv(data: BinaryTimeSeries, path) -> None:
    """Write ``data`` in long format (``time,sample,node,value``; sample = index within the time
    point, values -1/+1)."""
    o = data.offsets
    with open(os.fspath(path), "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for t in range(data.T):
            label = data.times[t]
            label = repr(float(label)) if isinstance(label, (float, np.floating)) else str(label)
            for s in range(o[t + 1] - o[t]):
                row = data.X[o[t] + s]
                for j, name in enumerate(data.node_names):
                    w.writerow((label, s, name, int(row[j])))
