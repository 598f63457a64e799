"""A sweep as one MLflow experiment record: a parent run, one nested child run per job.

The launching process (``hydra/launcher=dask``, see ``hydra_plugins/pgmflow_dask_launcher``) holds
one :class:`SweepSession` for the whole ``pgmflow -m`` command, across every batch a sweeper asks
for (Optuna asks for several):

- it opens the cluster of ``dask_cluster.yaml`` once and keeps it until the sweep ends;
- it creates the MLflow store and the parent run before any job starts. The parent is keyed by
  the sweep's command (its overrides and the sweeper's search space): running the same command
  again finds the same parent and resumes it;
- it creates each job's child run, keyed by the job's stage key (``pgmflow.stage_key``: its config, the
  normalised code of its workload, its input files' digests and its seed; docs/stages.md), so creating it
  twice (a job retried after a worker died, a sweep run again) gives the same run; a child that already
  FINISHED with an equal key is not run again (``cache.mode=auto`` or ``readonly``; ``off`` and ``refresh``
  run every job again). A sweep re-run after a code change re-runs its jobs;
- at the end it prints the summary table (every job's overrides, status, objective, run id), logs
  it to the parent as ``sweep_summary.csv`` with a figure of the objective against each swept
  parameter, and ends the parent FINISHED (or FAILED when a job failed).

Jobs log to their child run by id with ``MlflowClient`` (never the fluent API, whose active run is
thread-local), through pgmflow's retrying client, so many jobs can write to one SQLite store or
tracking server at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass, field

from pgmflow.core import tracking
from pgmflow.core.artifacts import csv_table

PARENT_KEY_TAG = "pgmflow.sweep_key"
KEY_TAG = "pgmflow.stage_key"
CHILD_TAGS = (KEY_TAG, "pgmflow.sweep.job", "pgmflow.sweep.overrides")


@dataclass
class JobRow:
    """One line of the summary."""

    job: int
    overrides: list
    status: str = "SCHEDULED"  # SCHEDULED | RUNNING | FINISHED | FAILED | SKIPPED (finished before)
    objective: float | None = None
    run_id: str | None = None
    config_hash: str | None = None
    error: str | None = None
    seconds: float | None = None
    started: float | None = None  # wall clock (epoch seconds) when the job was submitted
    finished: float | None = None  # ... and when its result came back


@dataclass
class SweepSession:
    """The launching process's view of one sweep (see the module docstring)."""

    tracker: tracking.Tracker
    parent_id: str
    key: str
    cluster_cm: object = None
    cluster: object = None
    rows: dict = field(default_factory=dict)
    resumed: bool = False
    cluster_cfg: dict | None = None
    started: float = field(default_factory=time.monotonic)
    _children: dict | None = None

    def open_cluster(self, stream=sys.stdout):
        """The sweep's cluster, opened on first need (a resumed sweep with nothing left to run
        opens none) and kept until the sweep ends."""
        if self.cluster is None:
            from pgmflow.core import cluster as cluster_mod

            cm = cluster_mod.open_cluster(self.cluster_cfg)
            self.cluster = cm.__enter__()
            self.cluster_cm = cm
            print(
                f"pgmflow: sweep cluster: {self.cluster.profile} ({self.cluster.n_workers} workers)",
                file=stream,
                flush=True,
            )
        return self.cluster

    # --- child runs ------------------------------------------------------------------------------
    def children(self) -> dict:
        """stage key -> the newest child run of the parent with that key."""
        if self._children is None:
            exp = self.tracker._experiment_id()
            runs = self.tracker.client.search_runs(
                [exp], filter_string=f"tags.`mlflow.parentRunId` = '{self.parent_id}'", max_results=50000
            )
            out = {}
            for r in sorted(runs, key=lambda r: r.info.start_time or 0):
                h = r.data.tags.get(KEY_TAG)
                if h:
                    out[h] = r
            self._children = out
        return self._children

    def child_run(self, job: int, overrides: list, config_hash: str, reuse: bool = True):
        """The child run of a job: (run_id, finished_before, objective). Idempotent per key; ``reuse=False``
        (cache.mode off or refresh) runs a finished job again, in a new child run."""
        existing = self.children().get(config_hash)
        if existing is not None and (reuse or existing.info.status != "FINISHED"):
            if existing.info.status == "FINISHED":
                return existing.info.run_id, True, existing.data.metrics.get("objective")
            run_id = existing.info.run_id
            self.tracker.client.update_run(run_id, status="SCHEDULED")
            return run_id, False, None
        text = " ".join(overrides)
        tags = {
            "mlflow.parentRunId": self.parent_id,
            KEY_TAG: config_hash,
            "pgmflow.sweep.job": str(job),
            "pgmflow.sweep.overrides": text[:5000],
        }
        run = self.tracker.client.create_run(
            self.tracker._experiment_id(), run_name=f"job {job}: {text}"[:250], tags=tags
        )
        self.tracker.client.update_run(run.info.run_id, status="SCHEDULED")
        self.children()[config_hash] = self.tracker.client.get_run(run.info.run_id)
        return run.info.run_id, False, None

    def fail_child(self, run_id: str, message: str):
        """End a child run FAILED with ``message`` (a job that never reached its own error handling)."""
        tr = tracking.Tracker(
            self.tracker.uri,
            self.tracker.experiment_name,
            self.tracker.artifact_location,
            max_wait=self.tracker.client.max_wait,
        )
        tr.run_id = run_id
        run = tr.client.get_run(run_id)
        if not self.ours(run) or not self.ours(tr.client.get_run(self.parent_id)):
            return  # another attempt of the sweep owns this job (or the sweep) now: not this one's to end
        if run.info.status != "FAILED":
            tr.end("FAILED", message)

    @staticmethod
    def ours(run) -> bool:
        """Whether ``run`` (a child) is this attempt's: not claimed by a job of another attempt of the sweep
        (``pgmflow.attempt.launch``; docs/reliability.md)."""
        launch = run.data.tags.get(tracking.LAUNCH_TAG)
        return launch is None or launch == tracking.attempt_id()

    def log_job_output(self, run_id: str, text: str):
        with contextlib.suppress(Exception):
            client = self.tracker.client
            if self.ours(client.get_run(run_id)) and self.ours(client.get_run(self.parent_id)):
                client.log_text(run_id, text[-200_000:], "sweep_job.log")

    # --- summary ---------------------------------------------------------------------------------
    def record(self, row: JobRow):
        self.rows[row.job] = row

    @property
    def n_failed(self) -> int:
        return sum(r.status == "FAILED" for r in self.rows.values())

    def table(self) -> list[dict]:
        return [
            {
                "job": r.job,
                "overrides": " ".join(r.overrides),
                "status": r.status,
                "objective": "" if r.objective is None else repr(float(r.objective)),
                "run_id": r.run_id or "",
                "seconds": "" if r.seconds is None else f"{r.seconds:.1f}",
                "started": "" if r.started is None else f"{r.started:.3f}",
                "finished": "" if r.finished is None else f"{r.finished:.3f}",
                "error": r.error or "",
            }
            for r in sorted(self.rows.values(), key=lambda r: r.job)
        ]

    def write_summary(self, final: bool = False):
        """Log sweep_summary.csv and the objective figure to the parent run."""
        self.tracker.fence()  # a launcher another attempt of the sweep replaced writes no summary
        rows = self.table()
        client = self.tracker.client
        client.log_text(self.parent_id, csv_table(rows) or "job\n", "sweep_summary.csv")
        counts = {s: sum(r["status"] == s for r in rows) for s in ("FINISHED", "SKIPPED", "FAILED")}
        metrics = [
            ("jobs_finished", counts["FINISHED"] + counts["SKIPPED"]),
            ("jobs_failed", counts["FAILED"]),
            ("jobs", len(rows)),
        ]
        from mlflow.entities import Metric

        if final:  # once per sweep process, at the next step (a sweep run again logs its counts at step 1, ...)
            ts = int(time.time() * 1000)
            step = len(client.get_metric_history(self.parent_id, "jobs"))
            client.log_batch(self.parent_id, metrics=[Metric(k, float(v), ts, step) for k, v in metrics])
            fig = objective_figure(self.rows.values(), self.objective_name(), self.direction())
            if fig is not None:
                client.log_figure(
                    self.parent_id, fig, "figures/objective_vs_parameters.png", save_kwargs={"bbox_inches": "tight"}
                )
                import matplotlib.pyplot as plt

                plt.close(fig)

    def print_table(self, stream=sys.stdout):
        rows = self.table()
        cols = ["job", "status", "objective", "run_id", "overrides"]
        width = {c: max([len(c)] + [len(str(r[c])) for r in rows]) for c in cols[:-1]}
        line = "  ".join(c.ljust(width[c]) if c in width else c for c in cols)
        print(f"\npgmflow sweep {self.parent_id} ({len(rows)} jobs):", file=stream)
        print(line, file=stream)
        for r in rows:
            print("  ".join(str(r[c]).ljust(width[c]) if c in width else str(r[c]) for c in cols), file=stream)
        for r in rows:
            if r["error"]:
                print(f"  job {r['job']} failed: {r['error'][:300]}", file=stream)
        direction = self.direction()
        best = best_row(self.rows.values(), direction)
        if best is not None:
            print(
                f"best: job {best.job} ({' '.join(best.overrides)}), objective {best.objective!r} "
                f"({direction}), run {best.run_id}",
                file=stream,
            )
        stream.flush()

    def direction(self) -> str:
        """The sweeper's direction (Optuna's), else what the jobs' pipeline declares, else minimize."""
        tags = self.tracker.client.get_run(self.parent_id).data.tags
        if "pgmflow.sweep.direction" in tags:
            return tags["pgmflow.sweep.direction"]
        for r in self.rows.values():
            if r.status in ("FINISHED", "SKIPPED") and r.run_id:
                return self.tracker.client.get_run(r.run_id).data.tags.get("pgmflow.objective_direction", "minimize")
        return "minimize"

    def objective_name(self) -> str | None:
        """What the jobs' pipeline calls its objective (the tag ``pgmflow.objective_name``), if known."""
        for r in self.rows.values():
            if r.status in ("FINISHED", "SKIPPED") and r.run_id:
                return self.tracker.client.get_run(r.run_id).data.tags.get("pgmflow.objective_name")
        return None

    def finish(self, stream=sys.stdout) -> int:
        """Summary, figure, the parent's end status; closes the cluster. Returns the failed count."""
        try:
            if self.rows:
                self.write_summary(final=True)
                self.print_table(stream)
            failed = self.n_failed
            msg = f"{failed} of {len(self.rows)} jobs FAILED" if failed else None
            self.tracker.end("FAILED" if failed else "FINISHED", msg)
            print(
                f"pgmflow: sweep finished: {len(self.rows) - failed} FINISHED, {failed} FAILED "
                f"({time.monotonic() - self.started:.1f} s). {self.tracker.ui_hint}",
                file=stream,
                flush=True,
            )
            return failed
        finally:
            self.close()

    def close(self):
        if self.cluster_cm is not None:
            cm, self.cluster_cm = self.cluster_cm, None
            with contextlib.suppress(Exception):
                cm.__exit__(None, None, None)


def best_row(rows, direction: str = "minimize"):
    ok = [
        r
        for r in rows
        if r.status in ("FINISHED", "SKIPPED") and r.objective is not None and math.isfinite(float(r.objective))
    ]
    if not ok:
        return None
    key = (lambda r: float(r.objective)) if direction == "minimize" else (lambda r: -float(r.objective))
    return min(ok, key=key)


def swept_values(rows) -> dict:
    """key -> [(value, objective)] for every override key whose value differs between jobs."""
    per_key: dict = {}
    for r in rows:
        for ov in r.overrides:
            k, _, v = ov.partition("=")
            per_key.setdefault(k.lstrip("+~"), set()).add(v)
    keys = [k for k, vs in per_key.items() if len(vs) > 1]
    out = {k: [] for k in keys}
    for r in rows:
        if r.objective is None or r.status not in ("FINISHED", "SKIPPED"):
            continue
        d = {ov.partition("=")[0].lstrip("+~"): ov.partition("=")[2] for ov in r.overrides}
        for k in keys:
            if k in d:
                out[k].append((d[k], float(r.objective)))
    return out


def _is_int(text: str) -> bool:
    try:
        int(text)
        return True
    except ValueError:
        return False


def _x_axis(ax, k: str, pts: list):
    """The x values of one panel, with integer ticks for integer parameters, a log axis for positive
    values spread over two orders of magnitude or more, and the labels of non-numeric ones."""
    from matplotlib.ticker import MaxNLocator

    try:
        xs = [float(x) for x, _ in pts]
    except ValueError:
        labels = sorted({x for x, _ in pts})
        ax.set_xticks(range(len(labels)), labels, rotation=30)
        return [labels.index(x) for x, _ in pts]
    if min(xs) > 0 and max(xs) / min(xs) >= 100:
        ax.set_xscale("log")
    elif all(_is_int(x) for x, _ in pts):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return xs


def objective_figure(rows, objective_name: str | None = None, direction: str | None = None):
    """The objective against each swept parameter (one panel per parameter); None if nothing to plot.
    The y axis names the objective and its direction (the run's ``pgmflow.objective_name`` and
    ``pgmflow.objective_direction``); the title is wrapped to the figure's width, never cut off."""
    data = {k: v for k, v in swept_values(list(rows)).items() if v}
    if not data:
        return None
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = max(4.5 * len(data), 6.0)
    fig, axes = plt.subplots(1, len(data), figsize=(width, 4.0), squeeze=False)
    what = f"objective: {objective_name}" if objective_name else "objective"
    ylabel = what + (f" ({direction})" if direction else "")
    for ax, (k, pts) in zip(axes[0], sorted(data.items())):
        xs = _x_axis(ax, k, pts)
        ax.scatter(xs, [y for _, y in pts], s=18)
        ax.set_xlabel(k)
        ax.set_ylabel("\n".join(textwrap.wrap(ylabel, 40)), fontsize=8)
        ax.grid(alpha=0.3)
    title = f"sweep: {objective_name or 'objective'} against each swept parameter"
    fig.suptitle("\n".join(textwrap.wrap(title, int(width * 9))), fontsize=10)
    fig.tight_layout()
    return fig


# --- the process-wide session -------------------------------------------------------------------
_SESSION: SweepSession | None = None


def sweep_key(experiment: str, task_overrides: list, sweeper: dict) -> str:
    """Identity of a sweep command: its overrides (order-free) and the sweeper's search space."""
    blob = json.dumps(
        {"experiment": experiment, "overrides": sorted(task_overrides), "sweeper": sweeper}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def open_session(
    cluster_cfg: dict, tracking_cfg: dict, task_overrides: list, sweeper: dict, resume: bool = True, stream=sys.stdout
) -> SweepSession:
    """The sweep's session, created on the first call (cluster, store, parent run) and reused after."""
    global _SESSION
    if _SESSION is not None:
        return _SESSION
    from pgmflow.core import cluster as cluster_mod

    cluster_mod.check_cluster_config(cluster_cfg)  # a bad cluster section is refused before the parent exists
    tr = tracking.Tracker(
        tracking_cfg["uri"],
        tracking_cfg["experiment"],
        tracking_cfg.get("artifact_location"),
        max_wait=tracking_cfg.get("max_wait", tracking.DEFAULT_MAX_WAIT),
    )
    exp = tr._experiment_id()  # creates the store and the experiment once, before any job
    key = sweep_key(tracking_cfg["experiment"], task_overrides, sweeper)
    parent = None
    if resume:
        found = tr.client.search_runs(
            [exp],
            filter_string=f"tags.`{PARENT_KEY_TAG}` = '{key}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        parent = found[0] if found else None
    direction = str(sweeper["direction"]).lower().replace("direction.", "") if "direction" in sweeper else None
    if parent is not None:
        tr.run_id = parent.info.run_id
        tr.client.update_run(tr.run_id, status="RUNNING")
        resumed = True
    else:
        name = tracking_cfg.get("run_name") or f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
        tags = {PARENT_KEY_TAG: key, "pgmflow.sweep": "true", **tracking.git_info()}
        if direction:
            tags["pgmflow.sweep.direction"] = direction
        run = tr.client.create_run(exp, run_name=name, tags=tags)
        tr.run_id = run.info.run_id
        from mlflow.entities import Param

        params = [Param("sweep.overrides", " ".join(task_overrides)[:6000])]
        for ov in task_overrides:
            k, _, v = ov.partition("=")
            if "," in v or v.startswith(("range(", "choice(", "interval(", "glob(")):
                params.append(Param(f"grid.{k.lstrip('+~')}", v[:6000]))
        for k, v in tracking.flatten(sweeper.get("params") or {}).items():
            params.append(Param(f"grid.{k}", str(v)[:6000]))
        tr.client.log_batch(tr.run_id, params=params)
        resumed = False
    tr.claim()  # the newest attempt of a sweep (a requeued batch job) owns it; an older one stops
    _SESSION = SweepSession(tracker=tr, parent_id=tr.run_id, key=key, resumed=resumed)
    _SESSION.cluster_cfg = cluster_cfg
    verb = "resuming" if resumed else "started"
    print(f"pgmflow: sweep {verb}: parent run {tr.run_id}", file=stream, flush=True)
    return _SESSION


def current_session() -> SweepSession | None:
    return _SESSION


def finish_session(stream=sys.stdout) -> int | None:
    """End the process's sweep session, if one was opened: returns the number of failed jobs."""
    global _SESSION
    if _SESSION is None:
        return None
    s, _SESSION = _SESSION, None
    return s.finish(stream)


def drop_session():
    """Forget the process's sweep session without writing to its parent run (another attempt of the sweep
    owns it now: docs/reliability.md); its cluster is closed."""
    global _SESSION
    if _SESSION is None:
        return
    s, _SESSION = _SESSION, None
    with contextlib.suppress(Exception):
        s.close()


def abandon_session(message: str):
    """The sweep stopped before its end (Ctrl-C, a sweeper error): the parent ends KILLED."""
    global _SESSION
    if _SESSION is None:
        return
    s, _SESSION = _SESSION, None
    with contextlib.suppress(Exception):
        if s.rows:
            s.write_summary(final=True)
        s.tracker.end("KILLED", message)
    s.close()
