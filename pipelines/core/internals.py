"""The quarantine: every use of another library's internals that pgmflow still needs, in one place.

pgmflow uses the public APIs of dask, distributed, scipy, hydra and mlflow. What is here has no public
equivalent yet; each entry says why it is needed and what replaces it when the library offers one, and
``tests/test_internals.py`` pins each to the versions it was checked with (and checks, with ``ast``, that
no other module of pgmflow imports or touches a private name of those libraries).

* :class:`KilledWorkerLogFilter`: matches the wording of the scheduler's ERROR line for a task whose
  workers all died, which pgmflow reports itself as one line with the fix (``WorkerMemoryError``). A
  change of wording only brings the scheduler's line back beside pgmflow's; nothing breaks.
"""

from __future__ import annotations

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
