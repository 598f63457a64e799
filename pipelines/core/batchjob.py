"""A plain run (no sweep, no ``resume=``) inside a SLURM batch job that SLURM requeued continues the run its
earlier attempt started, instead of starting a second one (docs/reliability.md, "a job that runs twice at once").

Every run started inside a SLURM job is tagged :data:`TAG`: a digest of the cluster's name, the job id and the
run's stage key (its code and inputs, ``pgmflow.core.stagekey``), so that two different runs in one job script
have different keys and the same run has the same key in every attempt. An attempt that SLURM started again
(``SLURM_RESTART_COUNT`` above 0: the node was lost, the job preempted, ``scontrol requeue``) looks the key up
in the experiment and, where it finds a run that has not finished, resumes it: it claims the run (the earlier
attempt, still running on a node slurmctld lost, stops at its next write), continues from the run's newest
checkpoint, and ends with the bits of an undisturbed run. A run that did finish is not run again into: the
attempt starts a new one, as it would without the key (the job script may run more after pgmflow).

PBS sets no restart count that a job can read, so a rerun PBS job starts a new run (submit ``resume=`` there).
"""

from __future__ import annotations

import hashlib
import os

TAG = "pgmflow.batch.key"


def key(stage_key: str) -> str | None:
    """This run's batch key inside a SLURM job, or None outside one."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    cluster = os.environ.get("SLURM_CLUSTER_NAME", "")
    return hashlib.sha256(f"slurm {cluster} job {job} run {stage_key}".encode()).hexdigest()[:24]


def restart_count() -> int:
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def earlier_attempt(tracker, batch_key: str) -> str | None:
    """The newest run of the experiment with ``batch_key`` that has not finished (an earlier attempt's), or None."""
    exp = tracker.client.get_experiment_by_name(tracker.experiment_name)
    if exp is None:
        return None
    found = tracker.client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`{TAG}` = '{batch_key}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not found or found[0].info.status == "FINISHED":
        return None
    return found[0].info.run_id


def tags(stage_key: str) -> dict:
    """The run's :data:`TAG` inside a SLURM job (nothing outside one)."""
    k = key(stage_key)
    return {TAG: k} if k else {}


def resume_requeued(cfg: dict, stage_key_of, tracker_of, stream) -> dict:
    """``cfg`` with ``resume`` set to the run an earlier attempt of this requeued SLURM job started (one line
    says so), or ``cfg`` unchanged: outside SLURM, in a job's first attempt, or when no unfinished run has this
    run's key. ``stage_key_of(cfg)`` is the run's stage key, ``tracker_of(cfg)`` opens the run's store."""
    if not os.environ.get("SLURM_JOB_ID") or restart_count() == 0:
        return cfg
    batch_key = key(stage_key_of(cfg))
    if batch_key is None:
        return cfg
    run_id = earlier_attempt(tracker_of(cfg), batch_key)
    if run_id is None:
        return cfg
    print(
        f"pgmflow: SLURM job {os.environ.get('SLURM_JOB_ID')} was requeued (restart {restart_count()}): "
        f"continuing run {run_id}, which an earlier attempt of this job started",
        file=stream,
        flush=True,
    )
    return {**cfg, "resume": run_id}
