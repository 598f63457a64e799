"""The search-path plugin (see the package docstring). Imports nothing heavy: no dask, no mlflow."""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class PgmflowWorkloadsSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        try:
            from pgmflow.core.config import conf_dir
            from pgmflow.core.registry import extra_conf_dirs

            ours = conf_dir()
            if not any(e.path in (ours, f"file://{ours}") for e in search_path.get_path()):
                return  # another Hydra app in this environment
            for d in extra_conf_dirs():
                search_path.append(provider="pgmflow-workload", path=f"file://{d}")
        except Exception:  # a broken plug-in is reported by the registry at run time, with the fix
            return
