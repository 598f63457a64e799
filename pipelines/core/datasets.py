"""MLflow dataset tracking: every run records the data it used (``MlflowClient.log_inputs``).

One function, :func:`log_input`, serves every workload: it is given a name, where the data came from
(a file path, or a generator and its parameters), the actual arrays (a dict, or an iterable of
``(name, array)`` pairs streamed one at a time, e.g. a corpus shard by shard, so the driver's
memory stays bounded) and optionally the context (``training`` / ``test``). It records an MLflow
dataset whose

* ``digest`` is a SHA-256 (first 16 hex digits) of the arrays' names, dtypes, shapes and bytes, in
  the order given: two runs on the same data show the same digest, and data that differs in one
  value (another seed of a generator) a different one;
* ``source`` is JSON: ``{"uri": path}`` (source type ``local``) or ``{"generator": ..., "parameters":
  {...}}`` (source type ``code``);
* ``profile`` is JSON with each array's shape and dtype (and ``num_rows``);
* ``schema`` is the MLflow schema of the arrays (tensor specs), or of named columns when given.

It uses the run's own client (``tracker.client``: retried while the store is away), never MLflow's
fluent state. Nothing here knows a workload.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable

import numpy as np

CONTEXT_TAG = "mlflow.data.context"  # MLflow's input tag for the dataset's role in the run
# MLflow's SQL store inserts a dataset new to the experiment after looking it up; two runs logging the same
# dataset at once (a study's stage instances on identical inputs) race on its unique key. One lock in the
# process, and one retry for a race with another process (the retry finds the row the other one wrote).
_LOG_LOCK = threading.Lock()
DIGEST_CHARS = 16


def digest(items: Iterable[tuple[str, np.ndarray]]) -> tuple[str, dict]:
    """(hex digest, {name: {"shape", "dtype"}}) of ``(name, array)`` pairs, in order. An array met
    again under the same name (a stream of blocks) adds its rows to the recorded shape."""
    h = hashlib.sha256()
    seen: dict = {}
    for name, a in items:
        a = np.ascontiguousarray(a)
        if a.dtype.kind == "U" or a.dtype.kind == "O":  # text (vocabularies, names): hashed as UTF-8
            b = "\n".join(str(v) for v in a.ravel()).encode()
            dtype = "str"
        else:
            b = memoryview(a.reshape(-1)).cast("B") if a.size else b""
            dtype = a.dtype.str
        h.update(f"{name}|{dtype}|{a.shape[1:]}|{a.shape[0] if a.ndim else 0}|".encode())
        h.update(b)
        if name in seen and a.ndim:
            seen[name]["shape"][0] += int(a.shape[0])
        else:
            seen[name] = {"shape": [int(s) for s in a.shape], "dtype": dtype}
    return h.hexdigest()[:DIGEST_CHARS], seen


def arrays_of(obj, prefix: str = "") -> dict:
    """The arrays, numbers and strings inside ``obj`` (a NamedTuple or dataclass, possibly nested, a
    dict, an array or a scalar), flattened to ``{dotted name: array}``: what a model object (a target,
    an MRF) holds, for its digest."""
    import dataclasses

    if hasattr(obj, "_asdict"):
        items = obj._asdict().items()
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        items = ((f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj))
    elif isinstance(obj, dict):
        items = sorted(obj.items(), key=lambda kv: str(kv[0]))
    elif isinstance(obj, (list, tuple)) and not all(isinstance(v, (int, float, str, bool)) for v in obj):
        items = ((str(i), v) for i, v in enumerate(obj))
    else:
        a = np.asarray(obj)
        return {prefix or "value": a} if a.dtype.kind in "biufcUS" else {}
    out = {}
    for k, v in items:
        out.update(arrays_of(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _schema(arrays: dict, columns) -> str | None:
    from mlflow.types import ColSpec, Schema, TensorSpec

    try:
        if columns:
            return Schema([ColSpec("double", str(c)) for c in columns]).to_json()
        specs = [
            TensorSpec(np.dtype("float64" if v["dtype"] == "str" else v["dtype"]), (-1, *v["shape"][1:]), k)
            for k, v in arrays.items()
            if v["dtype"] != "str"
        ]
        return Schema(specs).to_json() if specs else None
    except Exception:  # a dtype MLflow's schema cannot express: the profile still has it
        return None


def log_input(
    tracker,
    name: str,
    arrays,
    *,
    path=None,
    generator: str | None = None,
    parameters: dict | None = None,
    context: str | None = None,
    columns=None,
    profile: dict | None = None,
) -> str:
    """Record one input dataset of the tracker's run; returns its digest.

    name: the dataset's name (e.g. ``"corpus docstrings"``). arrays: a dict ``{name: array}`` or an
    iterable of ``(name, array)`` pairs. path: the file or folder the data was read from, or
    generator (a dotted function name) and parameters (its arguments) for generated data.
    context: ``training``, ``test`` or None. columns: the names of the columns of tabular data
    (its schema). profile: more entries for the profile (e.g. documents and words of a corpus).
    """
    from mlflow.entities import Dataset, DatasetInput, InputTag

    items = arrays.items() if isinstance(arrays, dict) else arrays
    dig, shapes = digest(items)
    if path is not None:
        source_type, source = "local", {"uri": str(path)}
    else:
        source_type, source = "code", {"generator": str(generator), "parameters": parameters or {}}
    first = next(iter(shapes.values()), {"shape": [0]})
    prof = {"num_rows": first["shape"][0] if first["shape"] else 1, "arrays": shapes, **(profile or {})}
    ds = Dataset(
        name=str(name)[:500],
        digest=dig,
        source_type=source_type,
        source=json.dumps(source, sort_keys=True, default=str),
        schema=_schema(shapes, columns),
        profile=json.dumps(prof, sort_keys=True, default=str),
    )
    tags = [InputTag(CONTEXT_TAG, context)] if context else []
    with _LOG_LOCK:
        try:
            tracker.client.log_inputs(tracker.run_id, datasets=[DatasetInput(ds, tags)])
        except Exception as exc:
            if "UNIQUE constraint" not in str(exc) and "Duplicate entry" not in str(exc):
                raise
            tracker.client.log_inputs(tracker.run_id, datasets=[DatasetInput(ds, tags)])
    return dig
