"""model=bayes: named priors per coordinate block, a data file, and an allow-listed log-likelihood.

``build_bayes(model)`` reads the data (``model.data``), builds the features and returns the task-side
``pgmflow.tasks.tempering.bayes.BayesTarget`` (data inside: the run scatters it to the workers once);
``check_bayes`` refuses bad input in one line before any graph is built and returns the target it
checked, which the plan keeps (the file is read once per run).
"""

from __future__ import annotations

import os
from itertools import combinations_with_replacement
from pathlib import Path

import numpy as np

from pgmflow.core.errors import ConfigError
from pgmflow.core.validation import check_importable, choice, integer, real

BLOCK_KEYS = {"name", "size", "loc", "scale", "low", "high"}
DATA_KEYS = {"path", "target", "features", "standardize", "binarize"}


def _shipped_diabetes() -> Path:
    import pgmflow.tasks.gp

    return Path(pgmflow.tasks.gp.__file__).resolve().parent / "data" / "diabetes.csv"


def _data_path(spec) -> Path:
    if spec == "diabetes":
        return _shipped_diabetes()
    p = Path(str(spec)).expanduser()
    return p if p.is_absolute() else Path(os.environ.get("PGMFLOW_ORIG_CWD", os.getcwd())) / p


def _read(dcfg: dict):
    """(X [N, p], y [N]) from a .csv with a header row (``target`` names y's column) or an .npz (X, y)."""
    spec = dcfg.get("path")
    path = _data_path(spec)
    field = "model.data.path"
    if not path.is_file():
        raise ConfigError(
            field,
            spec,
            f"no such file ({path})",
            "give a .csv with a header row or an .npz with "
            "arrays X and y, or model.data.path=diabetes (the shipped data)",
        )
    try:
        if path.suffix == ".npz":
            with np.load(path) as z:
                if "X" not in z.files or "y" not in z.files:
                    raise ConfigError(
                        field,
                        spec,
                        f"holds arrays {sorted(z.files)}, not X and y",
                        "save the inputs as X [N, p] and the responses as y [N]",
                    )
                X, y = np.asarray(z["X"], dtype=np.float64), np.asarray(z["y"], dtype=np.float64)
        else:
            names = path.open().readline().strip().split(",")
            target = dcfg.get("target", "target")
            if target not in names:
                raise ConfigError(
                    "model.data.target",
                    target,
                    f"no such column in {path.name}",
                    f"use one of the columns: {', '.join(names)}",
                )
            A = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
            j = names.index(target)
            X, y = np.delete(A, j, axis=1), A[:, j]
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            field,
            spec,
            f"cannot be read ({type(exc).__name__}: {exc})",
            "give a .csv with a header row or an .npz with arrays X and y",
        ) from None
    if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0] or X.shape[0] < 2:
        raise ConfigError(
            field,
            spec,
            f"has X of shape {X.shape} and y of shape {y.shape}",
            "X must be [N, p] and y [N] with the same N >= 2 rows",
        )
    if not (np.all(np.isfinite(X)) and np.all(np.isfinite(y))):
        raise ConfigError(field, spec, "holds NaN or inf", "remove or impute the rows with missing values")
    return X, y


def _features(X, kind: str):
    """linear: X; quadratic: X, then every product x_i x_j (i <= j), duplicates of earlier columns dropped
    (after standardisation; e.g. the square of a binary column)."""
    if kind == "linear":
        return X
    cols = [X[:, i] for i in range(X.shape[1])] + [
        X[:, i] * X[:, j] for i, j in combinations_with_replacement(range(X.shape[1]), 2)
    ]
    kept, unit = [], []
    for c in cols:
        s = c.std()
        if s == 0:
            continue
        z = (c - c.mean()) / s
        if any(abs(float(z @ u)) / len(z) > 1 - 1e-9 for u in unit):
            continue
        kept.append(c)
        unit.append(z)
    return np.column_stack(kept)


def load_data(dcfg: dict) -> dict:
    """The likelihood's data: {"X": [N, p], "y": [N]} after features, standardisation and binarisation."""
    X, y = _read(dcfg)
    X = _features(X, dcfg.get("features", "linear"))
    if dcfg.get("standardize", True):
        sd = X.std(axis=0)
        X = (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
        if not dcfg.get("binarize", False):
            y = (y - y.mean()) / (y.std() if y.std() > 0 else 1.0)
    if dcfg.get("binarize", False):
        y = (y > np.median(y)).astype(np.float64)
    return {"X": np.ascontiguousarray(X), "y": np.ascontiguousarray(y)}


def prior_blocks(prior) -> tuple:
    """The validated prior blocks (pgmflow.tasks.tempering.priors.PriorBlock) of ``model.prior``."""
    from pgmflow.tasks.tempering.priors import PRIORS, PriorBlock

    if not isinstance(prior, (list, tuple)) or not prior or not all(isinstance(b, dict) for b in prior):
        raise ConfigError(
            "model.prior",
            prior,
            "must be a list of blocks like {name: normal, size: 3, loc: 0, scale: 1}",
            "give one block per group of coordinates",
        )
    blocks = []
    for i, b in enumerate(prior):
        f = f"model.prior[{i}]"
        choice(*PRIORS)(f"{f}.name", b.get("name"))
        for key in b:
            if key not in BLOCK_KEYS or (key not in ("name", "size") and key not in PRIORS[b["name"]]):
                raise ConfigError(
                    f"{f}.{key}",
                    b[key],
                    f"is not a parameter of the {b['name']} prior",
                    f"use {', '.join(('size',) + PRIORS[b['name']])}",
                )
        integer(lo=1, hi=100_000)(f"{f}.size", b.get("size"))
        for key in PRIORS[b["name"]]:
            (real(gt=0) if key == "scale" else real())(f"{f}.{key}", b.get(key, 1.0 if key == "scale" else 0.0))
        if b["name"] == "uniform" and not b.get("low", 0.0) < b.get("high", 1.0):
            raise ConfigError(
                f"{f}.high", b.get("high", 1.0), f"must be above low={b.get('low', 0.0)}", "give an interval low < high"
            )
        blocks.append(PriorBlock(**{k: (float(v) if k not in ("name", "size") else v) for k, v in b.items()}))
    return tuple(blocks)


def build_bayes(model: dict, data: dict | None = None):
    """The task-side target of a validated ``model=bayes`` section; ``data``: the likelihood's arrays when
    already read (else read from ``model.data`` here, the one read of the file in a run)."""
    from pgmflow.tasks.tempering.bayes import BayesTarget
    from pgmflow.tasks.tempering.priors import PriorReference

    data = load_data(model["data"]) if data is None else data
    return BayesTarget(
        reference=PriorReference(prior_blocks(model.get("prior"))),
        data=data,
        log_likelihood=model["log_likelihood"],
        grad_log_likelihood=model.get("grad_log_likelihood") or "",
        options=dict(model.get("likelihood_options") or {}),
    )


def _check_callables(model: dict, explorer: str):
    from pgmflow.tasks.tempering.targets import load_callable

    for field in ("log_likelihood", "grad_log_likelihood"):
        path, spec = f"model.{field}", model.get(field)
        if field == "grad_log_likelihood" and not spec:
            if explorer == "hmc":
                raise ConfigError(
                    path,
                    spec,
                    "HMC needs the gradient of the log-likelihood",
                    "set model.grad_log_likelihood=package.module:function or tempering.explorer=rwm",
                )
            continue
        if not isinstance(spec, str) or not spec:
            raise ConfigError(path, spec, "must name an importable callable", f"set {path}=package.module:function")
        check_importable(path, spec)
        try:
            load_callable(spec)
        except Exception as exc:
            raise ConfigError(
                path,
                spec,
                f"cannot be imported ({type(exc).__name__}: {exc})",
                "check the module is on PYTHONPATH and the name is 'package.module:function'",
            ) from None


def check_bayes(model: dict, explorer: str):
    """Priors, data, callables, then the likelihood (and gradient) on prior draws: finite, right shape.
    Returns the task-side target it built and checked (the data read once)."""
    from pgmflow.tasks.tempering.targets import load_callable

    if not isinstance(model.get("data"), dict):
        raise ConfigError(
            "model.data", model.get("data"), "must be a mapping with at least a path", "e.g. model.data.path=diabetes"
        )
    for key in model["data"]:
        if key not in DATA_KEYS:
            raise ConfigError(
                f"model.data.{key}", model["data"][key], "is not a data option", f"use {', '.join(sorted(DATA_KEYS))}"
            )
    choice("linear", "quadratic")("model.data.features", model["data"].get("features", "linear"))
    blocks = prior_blocks(model.get("prior"))
    _check_callables(model, explorer)
    t = build_bayes(model)
    want = getattr(load_callable(model["log_likelihood"]), "dim", None)
    if want is not None and want(t.data) != t.dim:
        raise ConfigError(
            "model.data.path",
            model["data"].get("path"),
            f"gives {want(t.data)} parameters "
            f"(X has shape {t.data['X'].shape}) but the prior has {t.dim} coordinates "
            f"({' + '.join(str(b.size) for b in blocks)})",
            "make the prior blocks' sizes add up to the columns of X (after model.data.features)",
        )
    u = t.reference.sample(np.random.default_rng(0), 8)
    try:
        val = t.log_lik(u)
        if val.shape != (8,):
            raise ValueError(f"returned shape {val.shape} for 8 parameter vectors; expected (8,)")
        grad = t.grad_log_gamma(u) if t.grad_log_likelihood else None
    except Exception as exc:
        raise ConfigError(
            "model.log_likelihood",
            model["log_likelihood"],
            f"failed on prior draws ({type(exc).__name__}: {exc})",
            "make it map theta [n, d] and the data to [n]",
        ) from None
    if np.any(np.isnan(val)) or np.any(val == np.inf):
        raise ConfigError(
            "model.log_likelihood",
            model["log_likelihood"],
            "returned NaN or +inf on draws from the prior",
            "return finite values (or -inf where the likelihood is zero)",
        )
    if grad is not None and not np.all(np.isfinite(grad)):
        raise ConfigError(
            "model.grad_log_likelihood",
            model["grad_log_likelihood"],
            "returned NaN or inf on draws from the prior",
            "return finite gradients",
        )
    return t
