"""Hydra set-up that pgmflow's entry points (the CLI, the Python API) do before composing a config."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def register_hydra_plugins() -> None:
    """Make Hydra see pgmflow's two plugins (the Dask launcher, the workloads' search path) however pgmflow
    was installed.

    Hydra finds plugins by walking the folders of the ``hydra_plugins`` namespace package. A wheel puts
    ours there; an editable install maps them with an import hook that ``pkgutil`` cannot walk, so Hydra's
    scan misses them. Importing them here (which also stores ``hydra/launcher=dask`` in the ConfigStore) and
    registering the classes covers both; Hydra ignores a class it already has. Called by the CLI and the
    Python API before they compose a config.
    """
    from hydra_plugins.pgmflow_dask_launcher.dask_launcher import DaskLauncher
    from hydra_plugins.pgmflow_workloads.search_path import PgmflowWorkloadsSearchPath
    from pgmflow.pipelines.core.internals import register_hydra_plugins as register

    register(DaskLauncher, PgmflowWorkloadsSearchPath)
