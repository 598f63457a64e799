"""The quarantine: every use of another library's internals that pgmflow still needs, in one place.

pgmflow uses the public APIs of dask, distributed, scipy, hydra and mlflow. What is here has no public
equivalent yet; each entry says why it is needed and what replaces it when the library offers one, and
``tests/test_internals.py`` pins each to the versions it was checked with (and checks, with ``ast``, that
no other module of pgmflow imports or touches a private name of those libraries).

* :func:`register_hydra_plugins`: ``hydra.core.plugins.Plugins.instance().register`` (not documented).
  Hydra discovers plugins by walking the ``hydra_plugins`` namespace package with ``pkgutil``; the
  editable install (setuptools' import hook for pgmflow's package-dir mapping) is invisible to that walk,
  so the CLI and the Python API register the two plugins themselves. Goes when the install is one that
  ``pkgutil`` can walk (a layout where ``pgmflow`` is a real folder on ``sys.path``).
* :class:`KilledWorkerLogFilter`: matches the wording of the scheduler's ERROR line for a task whose
  workers all died, which pgmflow reports itself as one line with the fix (``WorkerMemoryError``). A
  change of wording only brings the scheduler's line back beside pgmflow's; nothing breaks.
"""

from __future__ import annotations

import logging

# The versions these were last checked with (tests/test_internals.py fails outside them, so that an
# upgrade is a decision, not a surprise).
CHECKED = {"hydra-core": ("1.3", "1.4"), "distributed": ("2024.8", "2027")}


def register_hydra_plugins(*classes) -> None:
    """Register plugin classes with Hydra's plugin registry (Hydra ignores a class it already has)."""
    from hydra.core.plugins import Plugins

    plugins = Plugins.instance()
    for cls in classes:
        plugins.register(cls)


class KilledWorkerLogFilter(logging.Filter):
    """Drops the in-process scheduler's log line about a task whose workers all died ("... marked as failed
    because N workers died while trying to run it"): the driver reports it itself, as one line that says
    what to change (pgmflow.pipelines.core.graph.WorkerMemoryError)."""

    def filter(self, record):
        msg = record.getMessage()
        return not ("marked as failed because" in msg and "workers died" in msg)
