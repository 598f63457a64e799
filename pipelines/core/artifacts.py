"""What every workload logs at the end of a run, written once: final metrics, ``.npz`` arrays, CSV
tables, figures, ``results.json``, and checkpoints (saved as MLflow artifacts, and the newest valid
one found again on resume).

Every function takes the run's :class:`~pgmflow.core.tracking.Tracker`; none knows a workload.
"""

from __future__ import annotations

import csv
import io
import tempfile
from pathlib import Path

import numpy as np

CHECKPOINT_DIR = "checkpoints"


def numeric(result: dict) -> dict:
    """The entries of ``result`` that are numbers (bools excluded): what becomes a metric."""
    return {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def log_final_metrics(tracker, result: dict, step: int, prefix: str = "final_", skip=(), flush: bool = True):
    """Log every number of ``result`` as metric ``<prefix><key>`` at ``step`` (keys in ``skip`` left out)."""
    tracker.log_metrics(
        {f"{prefix}{k}": v for k, v in numeric(result).items() if k not in skip}, step=step, flush=flush
    )


def log_results(tracker, result: dict, exclude=()):
    """``results.json``: the result dict less the keys in ``exclude``."""
    tracker.log_dict({k: v for k, v in result.items() if k not in exclude}, "results.json")


def log_npz(tracker, name: str, arrays: dict, compressed: bool = False, artifact_path: str | None = None):
    """Save ``arrays`` as ``<name>`` (an ``.npz`` file) and log it as an artifact."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / name
        (np.savez_compressed if compressed else np.savez)(p, **arrays)
        tracker.log_artifact(p, artifact_path)


def csv_table(rows: list[dict]) -> str:
    """Rows of one shape as CSV (the ``csv`` module's quoting, ``\n`` line ends); floats with 10 significant
    digits. The one CSV writer of pgmflow's tables."""
    if not rows:
        return ""
    keys = list(rows[0])
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(keys)
    for r in rows:
        w.writerow([f"{r[k]:.10g}" if isinstance(r[k], float) else r[k] for k in keys])
    return buf.getvalue()


def log_table(tracker, rows: list[dict], path: str):
    """Log ``rows`` as the CSV artifact ``path`` (e.g. ``tables/bounds.csv``)."""
    tracker.log_text(csv_table(rows), path)


def log_figures(tracker, figures: dict, suffix: str = ""):
    """Log each ``{name: figure}`` as ``figures/<name><suffix>.png`` and close it."""
    from pgmflow.core.plotting import close

    for name, fig in figures.items():
        tracker.log_figure(fig, f"figures/{name}{suffix}.png")
        close(fig)


def save_checkpoint(tracker, name: str, arrays: dict):
    """Log ``arrays`` as ``checkpoints/<name>.npz``, after every metric logged so far is stored: a run
    resumed from this checkpoint finds the metrics of every step before it (and logs none twice)."""
    tracker.flush()
    log_npz(tracker, f"{name}.npz", arrays, artifact_path=CHECKPOINT_DIR)


def newest_checkpoint(tracker, max_index: int | None = None) -> dict | None:
    """The newest readable checkpoint of the run, as a dict of arrays, or None.

    Checkpoints are named ``<what>_<index>.npz`` with a zero-padded index, so name order is time
    order. With ``max_index``, later ones are passed over. One that cannot be read (cut short by the
    interruption) falls back to the one before.
    """
    try:
        names = sorted(tracker.list_artifacts(CHECKPOINT_DIR))
    except Exception:
        return None
    if max_index is not None:
        names = [n for n in names if int(Path(n).stem.split("_")[-1]) <= max_index]
    for name in reversed(names):
        try:
            with np.load(tracker.download(name), allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        except Exception:
            continue
    return None
