"""One sweep job in its own Python process: ``python -m hydra_plugins.pgmflow_dask_launcher._job DIR``.

``DIR/payload.pkl`` holds what the launching process knew (Hydra's Singleton state, the sweep
config, the job's overrides and index, the task function); the JobReturn goes to
``DIR/result.pkl``. Hydra's state is restored as the joblib and Ray launchers restore it:
``Singleton.set_state``, ``load_sweep_config``, then ``run_job``.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path


def main(directory: str) -> int:
    import cloudpickle
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobStatus, run_job, setup_globals
    from omegaconf import open_dict

    from hydra_plugins.pgmflow_dask_launcher._core import JobFailed, _one_line

    d = Path(directory)
    p = pickle.loads((d / "payload.pkl").read_bytes())
    setup_globals()
    Singleton.set_state(p["singleton_state"])
    ctx, idx = p["hydra_context"], p["idx"]
    sweep_config = ctx.config_loader.load_sweep_config(p["config"], list(p["overrides"]))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    try:
        ret = run_job(hydra_context=ctx, config=sweep_config, task_function=p["task_function"],
                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    except BaseException as exc:  # SystemExit from a task function that exits, for instance
        from hydra.core.utils import JobReturn

        ret = JobReturn(overrides=list(p["overrides"]), task_name="pgmflow")
        ret.status = JobStatus.FAILED
        ret.return_value = exc
    if ret.status == JobStatus.FAILED:
        exc = ret._return_value
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        ret.return_value = JobFailed(_one_line(message))
    (d / "result.pkl").write_bytes(cloudpickle.dumps(ret))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
