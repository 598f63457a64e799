"""Finished units of work, saved as they complete and found again on resume.

A workload whose work is many independent tasks (TESLA's node fits, the bounds' temperatures) keeps
a :class:`PartialResults`: each result is added under a key that names the unit (``tesla/n3/a1``);
pending results are written as one MLflow artifact ``partial/<name>_<index>.npz`` at most every
``every`` seconds (0: at once) and at :meth:`close`. On ``resume=<run id>`` the saved ones are read
back, the workload runs only the missing units, and, since each unit is a pure function of its
inputs, the run ends with the same bits as an undisturbed one.

A result is a ``NamedTuple`` of numbers, strings, booleans and arrays; it is stored field by field
as arrays (no pickle) and rebuilt with its class: 0-d arrays come back as Python scalars, floats
bit for bit.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

PARTIAL_DIR = "partial"
SEP = "::"


def to_arrays(value) -> dict[str, np.ndarray]:
    """The fields of a NamedTuple as arrays."""
    out = {}
    for name in value._fields:
        v = getattr(value, name)
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            raise TypeError(f"{type(value).__name__}.{name}: nested NamedTuples are not stored; flatten the result")
        a = np.asarray(v)
        if a.dtype == object:
            raise TypeError(f"{type(value).__name__}.{name}: {type(v).__name__} is not stored (no pickle)")
        out[name] = a
    return out


def from_arrays(cls, arrays: dict):
    """Rebuild ``cls`` from :func:`to_arrays`' output (0-d arrays as Python scalars)."""
    return cls(**{name: (arrays[name].item() if arrays[name].ndim == 0 else arrays[name]) for name in cls._fields})


class PartialResults:
    """The finished units of one kind (``name``) of a run; ``done`` maps key -> result."""

    def __init__(self, tracker, name: str, cls, resumed: bool, every: float = 10.0):
        self.tracker, self.name, self.cls, self.every = tracker, name, cls, float(every)
        self.done: dict[str, object] = {}
        self.loaded = 0  # units read back on resume
        self.saved = 0  # units written by this process
        self._pending: dict[str, object] = {}
        self._index = 0
        self._last = time.monotonic()
        if resumed:
            self._load()

    def _files(self) -> list[str]:
        try:
            names = self.tracker.list_artifacts(PARTIAL_DIR)
        except Exception:
            return []
        return sorted(n for n in names if Path(n).name.startswith(f"{self.name}_") and n.endswith(".npz"))

    def _load(self):
        for path in self._files():
            self._index = max(self._index, int(Path(path).stem.rsplit("_", 1)[1]) + 1)
            try:
                with np.load(self.tracker.download(path), allow_pickle=False) as z:
                    fields: dict[str, dict] = {}
                    for k in z.files:
                        key, _, field = k.rpartition(SEP)
                        fields.setdefault(key, {})[field] = z[k]
            except Exception:  # cut short by the interruption: its units run again
                continue
            for key, arrays in fields.items():
                self.done[key] = from_arrays(self.cls, arrays)
        self.loaded = len(self.done)

    def __contains__(self, key: str) -> bool:
        return key in self.done

    def add(self, key: str, value):
        """Record a finished unit; written now if ``every`` seconds passed since the last write."""
        self.done[key] = value
        self._pending[key] = value
        if time.monotonic() - self._last >= self.every:
            self.flush()

    def flush(self):
        if not self._pending:
            return
        arrays = {
            f"{key}{SEP}{field}": a for key, value in self._pending.items() for field, a in to_arrays(value).items()
        }
        self.tracker.flush()  # the metrics logged before these results are stored before them
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / f"{self.name}_{self._index:06d}.npz"
            np.savez(p, **arrays)
            self.tracker.log_artifact(p, PARTIAL_DIR)
        self._index += 1
        self.saved += len(self._pending)
        self._pending.clear()
        self._last = time.monotonic()

    def close(self):
        self.flush()

    def describe(self, total: int, what: str) -> str:
        """The resume line: how many units were found and how many are left."""
        return (
            f"resuming: {self.loaded} of {total} {what} were saved by the interrupted run; running the other "
            f"{total - self.loaded}"
        )
