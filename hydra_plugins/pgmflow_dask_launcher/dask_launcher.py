"""``hydra/launcher=dask``: a Hydra Launcher that runs each job of a sweep on the Dask cluster.

How a job runs (see :mod:`pgmflow.core.sweep` for the MLflow side):

1. The launching process opens the cluster of ``dask_cluster.yaml`` once (``cluster.*`` of the
   sweep's config), creates the MLflow store, the sweep's parent run and one child run per job
   (keyed by a hash of the job's resolved config, so creating it twice gives the same run), and
   skips jobs whose child run already FINISHED (resume).
2. Each remaining job is one Dask task. The task secedes from the worker's thread pool (so a job
   waiting on its own tasks holds no worker slot) and runs the Hydra job in a fresh Python process
   (Hydra's chdir, logging and singletons are process-global), which restores Hydra's state
   (Singleton state, ``load_sweep_config``, ``run_job``) as the joblib and Ray launchers do, and
   sends its own tasks to the same scheduler.
3. At most ``hydra.launcher.max_concurrent_jobs`` jobs run at once. A job error, a crashed job
   process or ``KilledWorker`` becomes a FAILED ``JobReturn`` (and a FAILED child run holding the
   error); ``launch()`` never raises for a job.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

log = logging.getLogger(__name__)


@dataclass
class DaskLauncherConf:
    _target_: str = "hydra_plugins.pgmflow_dask_launcher.dask_launcher.DaskLauncher"
    # Jobs running at once (null: one per Dask worker). Each job's own tasks share the workers.
    max_concurrent_jobs: int | None = None
    # Seconds a job may run before it is counted FAILED (null: no limit).
    job_timeout: float | None = None
    # true: the same sweep command again reuses its parent run and skips jobs that FINISHED
    # (same resolved config); false: always a new parent run.
    resume: bool = True


ConfigStore.instance().store(group="hydra/launcher", name="dask", node=DaskLauncherConf, provider="pgmflow")


class DaskLauncher(Launcher):
    def __init__(
        self, max_concurrent_jobs: int | None = None, job_timeout: float | None = None, resume: bool = True
    ) -> None:
        if max_concurrent_jobs is not None and int(max_concurrent_jobs) < 1:
            raise ValueError(
                f"hydra.launcher.max_concurrent_jobs={max_concurrent_jobs}: must be a positive "
                "integer or null (one per worker)"
            )
        self.max_concurrent_jobs = max_concurrent_jobs
        self.job_timeout = job_timeout
        self.resume = bool(resume)
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        # dask, distributed and mlflow are imported here, not at plugin import time.
        from hydra_plugins.pgmflow_dask_launcher import _core

        return _core.launch(self, job_overrides, initial_job_idx)

    def __getstate__(self) -> dict[str, Any]:  # never shipped to workers; keep pickles small if it is
        return {"max_concurrent_jobs": self.max_concurrent_jobs, "job_timeout": self.job_timeout, "resume": self.resume}
