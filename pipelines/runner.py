"""The one-way flow of a run (DESIGN.md):

conf -> preflight_checks(cfg) -> open cluster -> start MLflow run -> build graph -> tasks on
workers -> ordered reduce -> metrics, figures, checkpoints -> end run.
"""

from __future__ import annotations

import importlib
import sys
import time
from dataclasses import dataclass

from pipelines.errors import ConfigError
from pipelines.graph import Executor

PIPELINES = {"tempering": "pipelines.tempering:run", "svi": "pipelines.svi:run", "tesla": "pipelines.tesla:run",
             "bounds": "pipelines.bounds:run"}
# Fields a resumed run may change: where and how it runs, not what it computes.
RESUME_MAY_CHANGE = ("cluster", "progress", "verbose", "tracking", "backend", "resume")


@dataclass
class RunContext:
    """What a pipeline receives: the config, the tracker, the cluster and the backend."""

    cfg: dict
    tracker: object
    cluster: object
    executor: Executor
    backend: str
    device: str
    resumed: bool

    @property
    def progress(self) -> bool:
        return bool(self.cfg.get("progress", True))


def _pipeline(name: str):
    mod, _, fn = PIPELINES[name].partition(":")
    return getattr(importlib.import_module(mod), fn)


def load_recorded_config(cfg: dict) -> dict:
    """For ``resume=<run id>``: the run's recorded config, with where/how-to-run fields from ``cfg``."""
    from pipelines.tracking import Tracker

    run_id = cfg["resume"]
    tr = Tracker(cfg["tracking"]["uri"], cfg["tracking"]["experiment"], cfg["tracking"].get("artifact_location"))
    try:
        tr.client.get_run(run_id)
    except Exception:
        raise ConfigError("resume", run_id, f"no such MLflow run in {tr.uri}",
                          "pass the run id printed by the interrupted run (and the same tracking.uri)") from None
    tr.run_id = run_id
    status = tr.client.get_run(run_id).info.status
    if status == "FINISHED":
        raise ConfigError("resume", run_id, "this run already finished; there is nothing to continue",
                          "start a new run (drop resume=...)")
    try:
        import yaml

        recorded = yaml.safe_load(tr.read_text("config.yaml"))
    except Exception:
        raise ConfigError("resume", run_id, "the run has no recorded config.yaml", "start a new run instead") from None
    for key in RESUME_MAY_CHANGE:
        if key in cfg:
            recorded[key] = cfg[key]
    return recorded


def execute(cfg: dict, stream=sys.stdout) -> dict:
    """Run one experiment from a resolved config (plain dict). Returns the pipeline's result dict."""
    from pipelines import cluster as cluster_mod
    from pipelines import preflight, tracking
    from tasks import backend as backend_mod

    if cfg.get("resume"):
        cfg = load_recorded_config(cfg)
    preflight.preflight_checks(cfg)
    backend = backend_mod.resolve_backend(cfg["backend"])
    device = backend_mod.gpu_status()[1] if backend == "cupy" else "cpu"

    with cluster_mod.open_cluster(cfg["cluster"]) as ch:
        tcfg = cfg["tracking"]
        tracker = tracking.Tracker(tcfg["uri"], tcfg["experiment"], tcfg.get("artifact_location"))
        tags = {"pgmflow.pipeline": cfg["pipeline"]["name"], "pgmflow.model": cfg.get("model", {}).get("name"),
                "pgmflow.backend": backend, "pgmflow.device": device, "pgmflow.cluster.profile": ch.profile,
                "pgmflow.cluster.type": ch.type, "pgmflow.cluster.workers": ch.n_workers,
                **tracking.git_info(), **tracking.versions()}
        if cfg.get("resume"):
            tracker.resume(cfg["resume"])
            tracker.set_tags({**tags, "pgmflow.resumed_at": time.strftime("%Y-%m-%dT%H:%M:%S")})
        else:
            name = tcfg.get("run_name") or f"{cfg['pipeline']['name']}-{cfg.get('model', {}).get('name')}-" \
                                            f"{time.strftime('%Y%m%d-%H%M%S')}"
            tracker.start(name, cfg, tags)
        print(f"pgmflow: {cfg['pipeline']['name']} run {tracker.run_id} on {ch.profile} ({ch.n_workers} worker"
              f"{'s' if ch.n_workers != 1 else ''}), backend {backend}", file=stream, flush=True)
        ctx = RunContext(cfg=cfg, tracker=tracker, cluster=ch, executor=Executor(ch.client), backend=backend,
                         device=device, resumed=bool(cfg.get("resume")))
        try:
            result = _pipeline(cfg["pipeline"]["name"])(ctx)
        except KeyboardInterrupt:
            tracker.end("KILLED", f"interrupted; continue with resume={tracker.run_id}")
            raise
        except ConfigError as exc:
            tracker.end("FAILED", exc.message)
            raise
        except BaseException as exc:
            tracker.end("FAILED", f"{type(exc).__name__}: {exc}")
            raise
        tracker.end("FINISHED")
        result["run_id"] = tracker.run_id
        print(f"pgmflow: finished. {tracker.ui_hint}", file=stream, flush=True)
        return result
