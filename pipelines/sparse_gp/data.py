"""The data of a sparse-GP run: inputs ``X`` [n, d] and a target ``y`` [n], from a generator or a file.

``gp_data.kind`` selects the source (``conf/gp_data/*.yaml``):

* ``synthetic`` -- Friedman #1 or a 1-D sine from the master seed (``pgmflow.tasks.gp.data``);
* ``diabetes`` -- the shipped ``tasks/gp/data/diabetes.csv`` (442 rows, 10 inputs);
* ``co2`` -- the shipped ``tasks/gp/data/co2.csv``: the Mauna Loa weekly CO2 record (2,225 weeks, input
  ``year``, target ``co2``);
* ``csv`` -- a file with a header row, all columns numbers, one of them the target;
* ``npz`` -- arrays ``X`` [n, d] and ``y`` [n] (names set by ``gp_data.x_key`` / ``y_key``);
* ``npy`` -- one 2-D array [n, d + 1] with a target column, memory-mapped: never loaded whole. The
  checks below stream it block by block (bounded memory) and the chunk tasks read their own rows
  from the file by path.

The held-out split is per row and independent of chunks and workers: row ``i`` is a test row when
a counter-based hash (splitmix64) of ``(key, i)`` falls below ``test_fraction``, ``key`` drawn from
``pgmflow.tasks.rng.seed_sequence(seed, STAGE_GP, GP_STREAM_SPLIT)``. The standardisation (means and
standard deviations of the training rows) is computed here too, in the same pass that checks every
value is finite.

Every problem with the data is a :class:`ConfigError` naming the field or file, the value and the
fix, raised by the preflight checks before any MLflow run starts. The data is read once per run, there:
:func:`resolve` returns it (an ``.npy`` file as its memory map, opened once) and the validation puts it in
the run's plan, from which the run takes it.
"""

from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

import pgmflow.tasks.gp
from pgmflow.core.errors import ConfigError
from pgmflow.tasks.gp.data import Standardizer, heldout_rows, open_npy, split_key  # noqa: F401  (part of this module's API)

KINDS = ("synthetic", "diabetes", "co2", "breast_cancer", "csv", "npz", "npy")
FUNCTIONS = ("friedman1", "sine_1d")
KEYS = {
    "synthetic": {"kind", "function", "n", "d", "noise_std", "test_path"},
    "diabetes": {"kind", "test_path"},
    "co2": {"kind", "test_path", "forecast_from"},
    "breast_cancer": {"kind", "test_path"},
    "csv": {"kind", "path", "target", "test_path"},
    "npz": {"kind", "path", "x_key", "y_key", "test_path"},
    "npy": {"kind", "path", "target", "test_path"},
}
DIABETES = Path(pgmflow.tasks.gp.__file__).resolve().parent / "data" / "diabetes.csv"  # shipped as package data
CO2 = DIABETES.with_name("co2.csv")  # shipped as package data too
BREAST_CANCER = DIABETES.with_name("breast_cancer.csv")  # classification data (labels 0/1: sparse_gp.likelihood)
SHIPPED = {
    "diabetes": (DIABETES, "target"),
    "co2": (CO2, "co2"),
    "breast_cancer": (BREAST_CANCER, "benign"),
}  # gp_data.kind -> (file, target column)
_BLOCK_BYTES = 64 << 20  # rows read per block when streaming an .npy file (about 64 MB)


class DataOrigin(NamedTuple):
    """Where the data came from, as MLflow's dataset record gives it: ``name``, and either the ``path`` it was
    read from or the ``generator`` (a dotted function name) and its ``parameters``."""

    name: str
    path: str | None = None
    generator: str | None = None
    parameters: dict | None = None


class TestRows(NamedTuple):
    """The rows of ``gp_data.test_path``, scored only: the file and its inputs ``X`` [t, d] and target ``y`` [t]
    in original units."""

    path: Path
    X: np.ndarray
    y: np.ndarray


class GPData(NamedTuple):
    """A validated regression data set.

    source: what the data is (a path, or "synthetic friedman1 n=.. d=.. seed=..").
    kind: ``gp_data.kind``.
    n, d: rows (training and held out) and inputs.
    input_names: tuple of d str, names of the inputs; target_name: str.
    n_train, n_test: rows on each side of the held-out split.
    standardizer: pgmflow.tasks.gp.data.Standardizer of the training rows (identity without
        ``sparse_gp.standardize``).
    X, y: float64 [n, d] and [n] in original units, in memory (None for ``npy``).
    path, target_col: the memory-mapped ``.npy`` file and its (non-negative) target column (None
        for in-memory data).
    origin: :class:`DataOrigin`, for the run's dataset record.
    rows: the ``.npy`` file's memory map [n, d + 1] (opened once, by :func:`resolve`), or None.
    """

    source: str
    kind: str
    n: int
    d: int
    input_names: tuple
    target_name: str
    n_train: int
    n_test: int
    standardizer: Standardizer
    X: np.ndarray | None
    y: np.ndarray | None
    path: str | None
    target_col: int | None
    origin: DataOrigin | None = None
    rows: np.ndarray | None = None

    @property
    def memmap(self) -> bool:
        return self.path is not None


# --- the held-out split ---------------------------------------------------------------------

# --- moments (Chan et al.'s pairwise update, in block order) ----------------------------------


class _Moments:
    def __init__(self, k: int):
        self.n = 0
        self.mean = np.zeros(k)
        self.m2 = np.zeros(k)

    def add(self, A: np.ndarray):
        nb = A.shape[0]
        if nb == 0:
            return
        mb = A.mean(axis=0)
        m2b = ((A - mb) ** 2).sum(axis=0)
        n = self.n + nb
        delta = mb - self.mean
        self.mean = self.mean + delta * (nb / n)
        self.m2 = self.m2 + m2b + delta**2 * (self.n * nb / n)
        self.n = n

    def std(self) -> np.ndarray:
        return np.sqrt(self.m2 / max(self.n, 1))


def _standardizer(mom: _Moments, target: int, standardize: bool) -> Standardizer:
    k = mom.mean.shape[0]
    inputs = [j for j in range(k) if j != target]
    if not standardize:
        return Standardizer(np.zeros(k - 1), np.ones(k - 1), 0.0, 1.0)
    sd = mom.std()
    xs = sd[inputs]
    ys = float(sd[target])
    return Standardizer(
        mom.mean[inputs].copy(), np.where(xs > 0, xs, 1.0), float(mom.mean[target]), ys if ys > 0 else 1.0
    )


# --- resolve --------------------------------------------------------------------------------


def _file(gcfg: dict, kind: str) -> Path:
    path = gcfg.get("path")
    if not path:
        raise ConfigError("gp_data.path", path, f"gp_data={kind} needs a file", f"add gp_data.path=FILE.{kind}")
    p = Path(str(path)).expanduser()
    if not p.exists():
        raise ConfigError(
            "gp_data.path",
            str(path),
            "no such file",
            "check the path (relative paths start from the directory pgmflow runs in)",
        )
    if not p.is_file():
        raise ConfigError("gp_data.path", str(path), "not a regular file", f"pass a .{kind} file")
    if p.stat().st_size == 0:
        raise ConfigError("gp_data.path", str(path), "the file is empty", f"pass a .{kind} file with data")
    return p.resolve()


def resolve(cfg: dict) -> GPData:
    """The run's data (validated, with its split and standardisation); ConfigError on any problem. Reads
    the file (if any) once: call it once per run (the validation does, and hands the result on)."""
    gcfg = dict(cfg.get("gp_data") or {})
    scfg = cfg.get("sparse_gp") or {}
    kind = gcfg.get("kind")
    path = _file(gcfg, kind) if kind in ("csv", "npz", "npy") else None
    seed = int(cfg["seed"])
    fraction = float(scfg.get("test_fraction", 0.2))
    standardize = bool(scfg.get("standardize", True))
    if kind == "npy":
        out = _resolve_npy(gcfg, path, seed, fraction, standardize)
        _check_split(out, "gp_data.path", gcfg["path"], fraction)
        return out._replace(origin=DataOrigin(path.name, path=str(path)))
    if kind == "synthetic":
        X, y, names, tname, source = _synthetic(gcfg, seed)
        field = "gp_data"
        origin = DataOrigin(
            f"{gcfg['function']} (synthetic)",
            generator=f"pgmflow.tasks.gp.data.{gcfg['function']}",
            parameters={k: gcfg.get(k) for k in ("n", "d", "noise_std") if gcfg.get(k) is not None} | {"seed": seed},
        )
    elif kind in SHIPPED:
        shipped, target = SHIPPED[kind]
        X, y, names, tname = _read_csv(shipped, target, "gp_data.kind", kind)
        if kind == "co2" and gcfg.get("forecast_from") is not None:  # the record before it trains
            X, y = _before(X, y, gcfg["forecast_from"], keep_before=True)
        source = f"{kind} ({shipped})"
        field = "gp_data.kind"
        origin = DataOrigin(shipped.name, path=str(shipped.resolve()))
    elif kind == "csv":
        X, y, names, tname = _read_csv(path, gcfg.get("target"), "gp_data.path", gcfg["path"])
        source, field = str(path), "gp_data.path"
        origin = DataOrigin(Path(str(gcfg["path"])).name, path=str(path))
    elif kind == "npz":
        X, y, names, tname = _read_npz(path, gcfg, gcfg["path"])
        source, field = str(path), "gp_data.path"
        origin = DataOrigin(Path(str(gcfg["path"])).name, path=str(path))
    else:
        raise ConfigError("gp_data.kind", kind, "unknown data source", f"use one of: {', '.join(KINDS)}")
    test = heldout_rows(split_key(seed), 0, X.shape[0], fraction)
    train = ~test
    mom = _Moments(X.shape[1] + 1)
    mom.add(np.column_stack([X[train], y[train]]))
    std = _standardizer(mom, X.shape[1], standardize)
    out = GPData(
        source,
        kind,
        int(X.shape[0]),
        int(X.shape[1]),
        tuple(names),
        tname,
        int(train.sum()),
        int(test.sum()),
        std,
        X,
        y,
        None,
        None,
        origin,
    )
    _check_split(out, field, gcfg.get("path") if kind in ("csv", "npz") else kind, fraction)
    return out


def _check_split(data: GPData, field, value, fraction):
    if data.n_train < 1 or (data.n_test < 1 and fraction > 0):
        raise ConfigError(
            "sparse_gp.test_fraction",
            fraction,
            f"leaves {data.n_test} of the {data.n} rows of {value!s} held out and {data.n_train} to train on",
            "choose a fraction that holds out some but not all rows (or use more data)",
        )


def _synthetic(gcfg, seed):
    from pgmflow.tasks.gp import data as gdata

    fn = gcfg.get("function")
    n = int(gcfg["n"])
    if fn == "friedman1":
        d = int(gcfg["d"])
        X, y = gdata.friedman1(seed, n, d=d, noise_std=float(gcfg["noise_std"]))
        source = f"synthetic friedman1 n={n} d={d} noise_std={gcfg['noise_std']} seed={seed}"
    else:
        X, y = gdata.sine_1d(seed, n, noise_std=float(gcfg["noise_std"]))
        source = f"synthetic sine_1d n={n} noise_std={gcfg['noise_std']} seed={seed}"
    return X, y, [f"x{j}" for j in range(X.shape[1])], "y", source


def _finite(A: np.ndarray, field, value, where):
    """ConfigError naming the first NaN or infinite entry of A [rows, cols]; ``where(i, j)`` names it."""
    bad = ~np.isfinite(A)
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        v = A[i, j]
        what = "NaN" if np.isnan(v) else ("+inf" if v > 0 else "-inf")
        raise ConfigError(
            field,
            value,
            f"{what} at {where(i, j)} ({int(bad.sum())} non-finite value(s) in all)",
            "remove or impute the rows with missing or infinite values",
        )


def _read_csv(path: Path, target, field, value, last_if_missing: bool = False):
    """``(X [n, d], y [n], input names, target name)`` of a CSV file with a header row, read once. ``target``:
    the target column's name (None: the last column; ``last_if_missing``: the last one when no column has
    that name)."""
    with path.open("r", errors="replace") as fh:
        text = fh.read()
    try:
        header = next(csv.reader(io.StringIO(text, newline="")))
    except StopIteration:
        raise ConfigError(field, value, "the file is empty", "pass a CSV file with a header row and data") from None
    header = [h.strip() for h in header]
    if len(header) < 2:
        raise ConfigError(
            field,
            value,
            f"the header has {len(header)} column(s); need inputs and a target",
            "write a header row naming every column, comma-separated",
        )
    if len(set(header)) != len(header):
        dup = sorted({h for h in header if header.count(h) > 1})
        raise ConfigError(
            field,
            value,
            f"the header names column(s) {', '.join(map(repr, dup))} twice",
            "give every column a distinct name",
        )
    if target is None or (last_if_missing and str(target) not in header):
        t = len(header) - 1
    else:
        if str(target) not in header:
            import difflib

            near = difflib.get_close_matches(str(target), header, n=1)
            hint = f"did you mean gp_data.target={near[0]}? " if near else ""
            raise ConfigError(
                "gp_data.target",
                str(target),
                f"no such column in {path.name} (columns: {', '.join(header)})",
                f"{hint}set gp_data.target to one of the columns (null: the last)",
            )
        t = header.index(str(target))
    try:
        A = np.loadtxt(io.StringIO(text), delimiter=",", skiprows=1, ndmin=2, dtype=np.float64)
    except ValueError:
        _csv_locate(text, header, field, value)
        raise ConfigError(field, value, "cannot be read as numbers", "write plain comma-separated numbers") from None
    if A.shape[0] == 0:
        raise ConfigError(field, value, "has a header but no data rows", "add rows of data")
    if A.shape[1] != len(header):
        raise ConfigError(
            field,
            value,
            f"rows have {A.shape[1]} fields, the header {len(header)}",
            "give every row one value per header column",
        )
    _finite(A, field, value, lambda i, j: f"line {i + 2}, column {header[j]!r}")
    inputs = [j for j in range(len(header)) if j != t]
    return (np.ascontiguousarray(A[:, inputs]), np.ascontiguousarray(A[:, t]), [header[j] for j in inputs], header[t])


def _csv_locate(text, header, field, value):
    """Find the first line of the CSV ``text`` that is not len(header) numbers and raise a ConfigError naming it."""
    reader = csv.reader(io.StringIO(text, newline=""))
    next(reader, None)
    for lineno, row in enumerate(reader, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise ConfigError(
                field,
                value,
                f"line {lineno} has {len(row)} fields, the header {len(header)}",
                "give every row one value per header column",
            )
        for j, c in enumerate(row):
            try:
                float(c)
            except ValueError:
                raise ConfigError(
                    field,
                    value,
                    f"{c.strip()!r} at line {lineno}, column {header[j]!r} is not a number",
                    "write numbers only (encode categories as numbers)",
                ) from None


def _numeric(a: np.ndarray) -> bool:
    return a.dtype.kind in "biuf"


def _read_npz(path: Path, gcfg: dict, value, field: str = "gp_data.path"):
    xk, yk = str(gcfg.get("x_key") or "X"), str(gcfg.get("y_key") or "y")
    try:
        with np.load(path, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise ConfigError(
                    field,
                    value,
                    "is an .npy array, not an .npz archive",
                    "use gp_data=npy for a single array with a target column",
                )
            names = list(z.files)
            for k, what in ((xk, "x_key"), (yk, "y_key")):
                if k not in names:
                    raise ConfigError(
                        field,
                        value,
                        f"has no array {k!r} (arrays: {', '.join(names) or 'none'})",
                        f"save it with numpy.savez(path, {k}=...) or set gp_data.{what}",
                    )
            X, y = z[xk], z[yk]
    except ConfigError:
        raise
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        problem = (
            "not an .npz file"
            if isinstance(exc, (zipfile.BadZipFile, OSError, EOFError)) or "pickle" not in str(exc)
            else "holds object arrays (pickled), which pgmflow does not load"
        )
        raise ConfigError(
            field,
            value,
            f"{problem} ({type(exc).__name__})",
            "save the data with numpy.savez(path, X=inputs [n, d], y=targets [n])",
        ) from None
    if not (_numeric(X) and _numeric(y)):
        raise ConfigError(
            field, value, f"{xk} ({X.dtype}) and {yk} ({y.dtype}) must be numeric arrays", "save float arrays"
        )
    if X.ndim == 1:
        X = X[:, None]
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if X.ndim != 2 or y.ndim != 1:
        raise ConfigError(
            field,
            value,
            f"{xk} has shape {X.shape} and {yk} {y.shape}; need {xk} [n, d] and {yk} [n]",
            "save the inputs as a matrix and the targets as a vector",
        )
    if X.shape[0] != y.shape[0]:
        raise ConfigError(
            field,
            value,
            f"{xk} has {X.shape[0]} rows but {yk} has {y.shape[0]}",
            "save one target per row of the inputs",
        )
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ConfigError(field, value, f"{xk} has shape {X.shape}: no data", "save at least one row and one input")
    X = np.ascontiguousarray(X, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.float64)
    _finite(X, field, value, lambda i, j: f"{xk}[{i}, {j}]")
    _finite(y[:, None], field, value, lambda i, j: f"{yk}[{i}]")
    return X, y, [f"x{j}" for j in range(X.shape[1])], yk


def _resolve_npy(gcfg: dict, path: Path, seed: int, fraction: float, standardize: bool) -> GPData:
    field, value = "gp_data.path", gcfg["path"]
    try:
        A = open_npy(str(path))  # the file's one opening in the run: the memory map is kept (GPData.rows)
        if isinstance(A, np.lib.npyio.NpzFile):
            A.close()
            raise ConfigError(
                field,
                value,
                "is an .npz archive, not an .npy array",
                "use gp_data=npz (arrays X and y), or save one array [n, d + 1] with numpy.save",
            )
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            field,
            value,
            f"not an .npy file ({type(exc).__name__})",
            "save one array [n, d + 1] (inputs and a target column) with numpy.save",
        ) from None
    if not _numeric(A):
        raise ConfigError(field, value, f"holds {A.dtype} values, not numbers", "save a float array")
    if A.ndim != 2 or A.shape[1] < 2 or A.shape[0] < 1:
        raise ConfigError(
            field,
            value,
            f"has shape {A.shape}; need a 2-D array [n, d + 1] of inputs and a target column",
            "save numpy.column_stack([X, y]) with numpy.save",
        )
    n, k = (int(v) for v in A.shape)
    target = gcfg.get("target", -1)
    if isinstance(target, bool) or not isinstance(target, int) or not -k <= target < k:
        raise ConfigError(
            "gp_data.target",
            target,
            f"is not a column of {path.name} ({k} columns: 0 .. {k - 1}, or -1 .. -{k} from the end)",
            "set gp_data.target to a column index (-1: the last)",
        )
    t = target % k
    key = split_key(seed)
    mom = _Moments(k)
    n_test = 0
    block = max(1024, _BLOCK_BYTES // (8 * k))
    for a in range(0, n, block):
        b = min(n, a + block)
        B = np.asarray(A[a:b], dtype=np.float64)  # [b - a, k], read from the file
        _finite(B, field, value, lambda i, j, a=a: f"row {a + i}, column {j}" + (" (the target)" if j == t else ""))
        test = heldout_rows(key, a, b, fraction)
        n_test += int(test.sum())
        mom.add(B[~test])
    std = _standardizer(mom, t, standardize)
    names = tuple(f"x{j}" for j in range(k) if j != t)
    return GPData(
        str(path), "npy", n, k - 1, names, f"column {t}", n - n_test, n_test, std, None, None, str(path), t, rows=A
    )


def read_test_file(cfg: dict, data: GPData) -> TestRows | None:
    """``gp_data.test_path``: the rows to score, in original units (:class:`TestRows`), or None. A
    ``.csv`` (header row; the target column named as the training data's, else the last) or an
    ``.npz`` (arrays ``X`` and ``y``, or ``gp_data.x_key``/``y_key``), with as many inputs as the
    training data and every value finite."""
    gcfg = cfg.get("gp_data") or {}
    raw = gcfg.get("test_path")
    if gcfg.get("kind") == "co2" and gcfg.get("forecast_from") is not None:
        return _forecast_rows(gcfg)
    if not raw:
        return None
    p = Path(str(raw)).expanduser()
    field = "gp_data.test_path"
    if not p.is_file() or p.stat().st_size == 0:
        raise ConfigError(
            field,
            str(raw),
            "no such file" if not p.exists() else "not a file with data",
            "pass a .csv or .npz file of held-out rows with the training data's columns",
        )
    if p.suffix.lower() == ".csv":
        X, y, names, _ = _read_csv(p, data.target_name, field, str(raw), last_if_missing=True)
        if not data.memmap and data.kind in ("csv", *SHIPPED) and tuple(names) != tuple(data.input_names):
            raise ConfigError(
                field,
                str(raw),
                f"its inputs ({', '.join(names)}) are not the training data's ({', '.join(data.input_names)})",
                "write the same columns in the same order",
            )
    elif p.suffix.lower() == ".npz":
        X, y, _, _ = _read_npz(p, gcfg, str(raw), field)
    else:
        raise ConfigError(field, str(raw), "is neither a .csv nor an .npz file", "pass a .csv or an .npz file")
    if X.shape[1] != data.d:
        raise ConfigError(
            field,
            str(raw),
            f"has {X.shape[1]} inputs; the training data has {data.d}",
            "score rows with the training data's inputs",
        )
    return TestRows(p.resolve(), X, y)


def describe(data: GPData) -> str:
    return (
        f"{data.source}: {data.n} rows x {data.d} inputs ({data.n_train} training, {data.n_test} held out), "
        f"target {data.target_name}{' (memory-mapped)' if data.memmap else ''}"
    )


def slice_dim(spec, data: GPData):
    """Index of the input named by ``sparse_gp.slice_dim`` (an index or a column name), or None."""
    if spec is None:
        return None
    if isinstance(spec, bool):
        pass
    elif isinstance(spec, int) and -data.d <= spec < data.d:
        return spec % data.d
    elif isinstance(spec, str) and spec in data.input_names:
        return data.input_names.index(spec)
    raise ConfigError(
        "sparse_gp.slice_dim",
        spec,
        f"is not an input of the data ({data.d} inputs: "
        f"{', '.join(data.input_names[:12])}{' ...' if data.d > 12 else ''})",
        "use an input index, an input name, or null (the shortest lengthscale)",
    )


def _before(X, y, t, keep_before: bool):
    """The rows of the CO2 record before (``keep_before``) or from the decimal year ``t``; ConfigError unless
    both sides keep rows."""
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not X[0, 0] < t <= X[-1, 0]:
        raise ConfigError(
            "gp_data.forecast_from",
            t,
            f"must be a decimal year inside the record ({X[0, 0]:.2f} to {X[-1, 0]:.2f}), leaving rows on both sides",
            "use e.g. gp_data.forecast_from=1992.0 (the last 10 years held out)",
        )
    keep = X[:, 0] < t if keep_before else X[:, 0] >= t
    return X[keep], y[keep]


def _forecast_rows(gcfg) -> TestRows:
    """``gp_data.forecast_from`` (co2): the record from that decimal year on, scored as held-out rows (the
    forecast's test RMSE and NLPD) instead of a ``gp_data.test_path``."""
    if gcfg.get("test_path"):
        raise ConfigError(
            "gp_data.test_path",
            gcfg["test_path"],
            "is not taken with gp_data.forecast_from (the rows from that year are the test rows)",
            "drop one of the two",
        )
    X, y, _, _ = _read_csv(CO2, "co2", "gp_data.kind", "co2")
    X, y = _before(X, y, gcfg["forecast_from"], keep_before=False)
    return TestRows(CO2.resolve(), X, y)
