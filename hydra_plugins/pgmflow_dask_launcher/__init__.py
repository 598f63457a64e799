"""pgmflow's Hydra launcher: every job of a ``pgmflow -m`` sweep runs on the Dask cluster of
``dask_cluster.yaml``, recorded as one MLflow parent run with a nested child run per job.

``hydra_plugins`` is Hydra's namespace package for plugins (it has no ``__init__.py``); Hydra
imports every module under it at start-up, so nothing here imports dask or mlflow at import time.
"""
