"""The quarantine: every use of another library's internals that pgmflow still needs, in one place.

pgmflow uses the public APIs of dask, distributed, scipy, hydra and mlflow. What is here has no public
equivalent yet; each entry says why it is needed and what replaces it when the library offers one, and
``tests/test_internals.py`` pins each to the versions it was checked with (and checks, with ``ast``, that
no other module of pgmflow imports or touches a private name of those libraries).

* :class:`KilledWorkerLogFilter`: matches the wording of the scheduler's ERROR line for a task whose
  workers all died, which pgmflow reports itself as one line with the fix (``WorkerMemoryError``). A
  change of wording only brings the scheduler's line back beside pgmflow's; nothing breaks.
* :func:`mlflow_requirements_unchecked`: while pgmflow saves a pyfunc model, MLflow's check that this
  environment satisfies the model's requirements (``mlflow.utils.environment.
  warn_dependency_requirement_mismatches``, looked up by name when a model is saved) is a no-op. pgmflow's
  requirements are the installed versions themselves (``pgmflow.core.models.requirements``), so the check
  cannot find a mismatch, and it maps every installed distribution's files to modules first
  (``importlib.metadata.packages_distributions``: 0.7 s of a 5 s debug run with 190 packages installed,
  issue 38). MLflow has no option to skip it. Where the name is gone, nothing is skipped and the save only
  takes longer; so it is not pinned to versions.
"""

from __future__ import annotations

import contextlib
import logging

# The versions these were last checked with (tests/test_internals.py fails outside them, so that an
# upgrade is a decision, not a surprise).
CHECKED = {"distributed": ("2024.8", "2027")}


class KilledWorkerLogFilter(logging.Filter):
    """Drops the in-process scheduler's log line about a task whose workers all died ("... marked as failed
    because N workers died while trying to run it"): the driver reports it itself, as one line that says
    what to change (pgmflow.core.graph.WorkerMemoryError)."""

    def filter(self, record):
        msg = record.getMessage()
        return not ("marked as failed because" in msg and "workers died" in msg)


@contextlib.contextmanager
def mlflow_requirements_unchecked():
    """Within: MLflow's environment check of a saved model's requirements does nothing (see the module's
    docstring); restored on the way out."""
    import mlflow.utils.environment as env

    check = getattr(env, "warn_dependency_requirement_mismatches", None)
    if check is None:
        yield
        return
    env.warn_dependency_requirement_mismatches = lambda requirements: None
    try:
        yield
    finally:
        env.warn_dependency_requirement_mismatches = check
