"""Running a study: the stages of ``stages:`` on one cluster, each stage instance an MLflow child run of one
parent run, each reused when a finished run has its stage key (docs/stages.md).

Stage instances run in threads on one Dask client; an instance starts as soon as its own inputs exist
(a ``foreach`` unit as soon as its upstream unit has finished). Before it runs, an instance takes a
``distributed.Lock`` named after its key, so two sweep jobs that need the same instance run it once: the
second finds the first one's run and reuses it. A cache hit is a thin child run tagged with its source
(``pgmflow.cache.hit_of``); nothing is copied. A run with the key that never finished (a killed driver) is
resumed from its own checkpoints.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from pgmflow.core import stagekey, studyplan
from pgmflow.core.errors import ConfigError

PASSED_DOWN = ("seed", "backend", "progress", "verbose", "cluster", "tracking", "cache")
HIT_TAG, STAGE_TAG, UNIT_TAG, RECORD_TAG = (
    "pgmflow.cache.hit_of",
    "pgmflow.stage",
    "pgmflow.stage.unit",
    "pgmflow.cache.record",
)
INPUT_DIR = Path(".pgmflow") / "stage_inputs"
_LOCAL_LOCKS: dict = {}


@dataclass
class Done:
    """A finished stage instance: its run, the run its outputs live in (itself, or a hit's source), whether
    it was a hit, and its outputs {port: [local files]} with their digests."""

    run_id: str
    source: str
    hit: bool
    outputs: dict = field(default_factory=dict)
    digests: dict = field(default_factory=dict)


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def set_field(cfg: dict, dotted: str, value):
    node = cfg
    *head, last = dotted.split(".")
    for part in head:
        node = node.setdefault(part, {})
    node[last] = value


def compose_stage(study_cfg: dict, s: studyplan.StageDef, composed: dict | None = None) -> dict:
    """The stage's resolved config: its workload's defaults with its groups, its ``config`` merged on, and the
    study's seed, backend and where-to-run sections. ``composed``: Hydra compositions already made in this
    study, by their overrides (two stages of one workload and groups compose once)."""
    from pgmflow.core.config import nested_compose

    overrides = (f"pipeline={s.workload}", *s.groups)
    composed = {} if composed is None else composed
    if overrides not in composed:
        composed[overrides] = nested_compose(list(overrides))
    cfg = deep_merge(copy.deepcopy(composed[overrides]), s.config)
    for k in PASSED_DOWN:
        if k in study_cfg:
            cfg[k] = copy.deepcopy(study_cfg[k])
    cfg["stages"] = None
    return cfg


@contextlib.contextmanager
def _lock(client, key: str):
    """Held while a stage instance looks for its key and runs: one ``distributed.Lock`` per key on the
    cluster's scheduler (so sweep jobs on other workers wait for each other), a thread lock without one."""
    if client is None:
        with _LOCAL_LOCKS.setdefault(key, threading.Lock()):
            yield
        return
    from distributed import Lock

    with client.as_current():
        lock = Lock(f"pgmflow-stage-{key[:32]}")
        lock.acquire()
    try:
        yield
    finally:
        with client.as_current():
            lock.release()


def find_runs(tracker, key: str) -> list:
    exp = tracker._experiment_id()
    return tracker.client.search_runs([exp], filter_string=f"tags.`{stagekey.KEY_TAG}` = '{key}'", max_results=1000)


def cache_entry(tracker, key: str):
    """The newest finished run that computed ``key`` and may be reused (not a hit, not recorded-off), or None."""
    runs = [
        r
        for r in find_runs(tracker, key)
        if r.info.status == "FINISHED" and HIT_TAG not in r.data.tags and r.data.tags.get(RECORD_TAG) != "false"
    ]
    return max(runs, key=lambda r: r.info.end_time or 0) if runs else None


def unfinished(tracker, key: str):
    """The newest run of ``key`` that never finished and can be resumed (it recorded its config), or None.
    Called under the key's lock, so such a run's driver is gone: one killed before it recorded its config is
    marked KILLED and left behind."""
    runs = [
        r
        for r in find_runs(tracker, key)
        if r.info.status in ("RUNNING", "KILLED", "FAILED", "SCHEDULED") and HIT_TAG not in r.data.tags
    ]
    for r in sorted(runs, key=lambda r: r.info.start_time or 0, reverse=True):
        if any(a.path == "config.yaml" for a in tracker.client.list_artifacts(r.info.run_id)):
            return r
        if r.info.status in ("RUNNING", "SCHEDULED"):
            tracker.client.set_terminated(r.info.run_id, "KILLED")
    return None


def local_outputs(tracker, run_id: str, workload) -> tuple[dict, dict]:
    """{port: [local files]} and {port: {file name: sha256}} of a finished run's declared outputs."""
    import mlflow.artifacts

    outs, digests = {}, {}
    dest = INPUT_DIR / run_id
    for port in workload.stage.outputs:
        local = Path(
            mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path=port.path.rstrip("/"), dst_path=str(dest), tracking_uri=tracker.uri
            )
        )
        files = sorted(local.glob("*.npz")) if port.kind == "npz_list" else [local]
        outs[port.name] = [str(f.resolve()) for f in files]
        digests[port.name] = {f.name: stagekey.file_digest(f, content=True) for f in files}
    return outs, digests


def _log_stage_files(tracker, run_id: str, key_material: dict, inputs: dict, done: Done):
    from pgmflow.core import tracking

    tr = tracking.Tracker(tracker.uri, tracker.experiment_name)
    tr.run_id = run_id
    tr.log_text(stagekey.canonical(key_material), "stage_key.json")
    tr.log_text(json.dumps(inputs, sort_keys=True, indent=1), "stage_inputs.json")
    tr.log_text(
        json.dumps({"source": done.source, "digests": done.digests}, sort_keys=True, indent=1), "stage_outputs.json"
    )


def _log_input_datasets(tracker, run_id: str, inputs: dict):
    """Each input as an MLflow dataset whose source is the run that produced it (``runs:/<id>/<path>``)."""
    import numpy as np

    from pgmflow.core import datasets, tracking

    tr = tracking.Tracker(tracker.uri, tracker.experiment_name)
    tr.run_id = run_id
    for port, (path, src, art, _dig) in sorted(inputs.items()):
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in sorted(z.files)}
        datasets.log_input(tr, f"{port} ({art})", arrays, path=f"runs:/{src}/{art}")


@dataclass
class Study:
    """One study command: its parent run, its cluster and settings.

    ``host``: the runner module, whose ``execute`` runs a stage instance. ``opener``: a context manager that
    yields the cluster handle, entered on the first stage that must run (a fully cached study starts no
    cluster) and left by :meth:`close`. ``shared_locks``: take each key's lock on the cluster's scheduler (a
    sweep job, whose sibling jobs run in other processes) instead of in-process."""

    cfg: dict
    tracker: object
    parent: str
    opener: object
    host: object  # pgmflow.core.runner (passed in: the runner imports this module, not the other way round)
    stream: object = sys.stdout
    shared_locks: bool = False
    counts: dict = field(default_factory=lambda: {"hits": 0, "runs": 0, "resumed": 0})
    _handle: object = None
    _owner: object = field(default_factory=threading.get_ident)  # the thread that may open and close the cluster
    _wanted: object = field(default_factory=threading.Event)
    _ready: object = field(default_factory=threading.Event)
    _entries: dict = field(default_factory=dict)  # key -> the cache entry prepare() found

    @property
    def cluster(self):
        """The cluster handle, opened on first need. A Dask client belongs to the thread (context) that made
        it, so only the owner thread opens it; a stage thread asks the owner (:meth:`serve`) and waits."""
        if self._handle is None:
            if threading.get_ident() == self._owner:
                try:
                    self._handle = self.opener.__enter__()
                finally:
                    self._ready.set()  # a failed open wakes the stage threads too (they raise below)
            else:
                self._wanted.set()
                self._ready.wait()
                if self._handle is None:
                    raise RuntimeError("the study's cluster could not be opened (see the error above)")
        return self._handle

    def serve(self):
        """Called by the owner thread while stage threads run: open the cluster if one of them asked."""
        if self._wanted.is_set() and self._handle is None and not self._ready.is_set():
            self.cluster  # noqa: B018  (opens it)

    def close(self, exc=None):
        if self._handle is not None:
            self.opener.__exit__(type(exc) if exc else None, exc, None)

    @property
    def mode(self) -> str:
        return (self.cfg.get("cache") or {}).get("mode", "auto")

    def say(self, text: str):
        print(f"pgmflow: {text}", file=self.stream, flush=True)

    def key_of(self, s: studyplan.StageDef, base: dict, inputs: dict):
        from pgmflow.core import registry

        wl = registry.get(s.workload)
        cfg = copy.deepcopy(base)
        for port, (path, _src, _name, _dig) in inputs.items():
            set_field(cfg, wl.stage.input(port).field, path)
        mat = stagekey.material(cfg, wl, {p: dig for p, (_f, _s, _n, dig) in inputs.items()})
        return wl, cfg, mat, stagekey.key(mat)

    def prepare(self, s: studyplan.StageDef, base: dict, inputs: dict):
        """On the scheduling (main) thread, before an instance is handed to a worker thread: open the cluster
        when the instance will have to run (Dask clients belong to the thread that made them)."""
        if self._handle is not None:
            return
        key = self.key_of(s, base, inputs)[3]
        entry = None if self.mode in ("off", "refresh") else cache_entry(self.tracker, key)
        if entry is None:
            self.cluster  # noqa: B018  (opens it)
        else:
            self._entries[key] = entry  # the instance's own look-up (under its lock) starts from it

    def instance(self, s: studyplan.StageDef, base: dict, unit, inputs: dict) -> Done:
        """Run (or reuse) one stage instance; ``inputs``: {port: (local file, source run, artifact name, digest)}."""
        wl, cfg, mat, key = self.key_of(s, base, inputs)
        label = s.name if unit is None else f"{s.name}[{unit}]"
        record = {p: {"run": src, "file": name, "digest": dig} for p, (_, src, name, dig) in inputs.items()}
        with _lock(self.cluster.client if self.shared_locks else None, key):
            done = self._hit(s, wl, key, label, unit) if self.mode in ("auto", "readonly") else None
            if done is None:
                done = self._run(s, wl, cfg, key, label, unit, inputs)
        _log_stage_files(self.tracker, done.run_id, mat, record, done)
        _log_input_datasets(self.tracker, done.run_id, inputs)
        return done

    def _hit(self, s, wl, key, label, unit) -> Done | None:
        entry = self._entries.pop(key, None) or cache_entry(self.tracker, key)  # a finished run never unfinishes
        if entry is None:
            return None
        src = entry.info.run_id
        try:
            outs, digests = local_outputs(self.tracker, src, wl)
        except Exception:  # its artifacts are gone (deleted by hand, an unreachable store): a miss, not an error
            return None
        tags = {"mlflow.parentRunId": self.parent, stagekey.KEY_TAG: key, HIT_TAG: src, STAGE_TAG: s.name}
        tags.update({"pgmflow.pipeline": s.workload, **({UNIT_TAG: str(unit)} if unit is not None else {})})
        run = self.tracker.client.create_run(self.tracker._experiment_id(), run_name=f"{label} (cached)", tags=tags)
        obj = entry.data.metrics.get("objective")
        if obj is not None:
            self.tracker.client.log_metric(run.info.run_id, "objective", obj, step=0)
        self.tracker.client.set_terminated(run.info.run_id, "FINISHED")
        self.counts["hits"] += 1
        self.say(f"stage {label}: cached (run {src})")
        done = Done(run.info.run_id, src, True, outs, digests)
        if _verify_this(self.cfg, key):
            self.verify(s, wl, done, label)
        return done

    def _run(self, s, wl, cfg, key, label, unit, inputs) -> Done:
        # the study's key (its inputs by content) replaces the one the runner computes from the files' bytes
        under = {"mlflow.parentRunId": self.parent, STAGE_TAG: s.name, "run_name": label, stagekey.KEY_TAG: key}
        if unit is not None:
            under[UNIT_TAG] = str(unit)
        if self.mode in ("off", "readonly"):
            under[RECORD_TAG] = "false"
        old = unfinished(self.tracker, key) if self.mode in ("auto", "refresh") else None
        if old is not None:
            cfg = {**cfg, "resume": old.info.run_id}
            self.counts["resumed"] += 1
            self.say(f"stage {label}: resuming run {old.info.run_id}")
        res = self.host.execute(cfg, stream=self.stream, cluster=self.cluster, under=under)
        self.counts["runs"] += 1
        outs, digests = local_outputs(self.tracker, res["run_id"], wl)
        return Done(res["run_id"], res["run_id"], False, outs, digests)

    def verify(self, s, wl, done: Done, label: str):
        """Recompute a hit from its source's recorded config and compare every output digest."""
        import yaml

        from pgmflow.core import tracking

        src = tracking.Tracker(self.tracker.uri, self.tracker.experiment_name)
        src.run_id = done.source
        cfg = yaml.safe_load(src.read_text("config.yaml"))
        for k in ("cluster", "tracking", "progress"):
            cfg[k] = copy.deepcopy(self.cfg[k])
        under = {
            "mlflow.parentRunId": self.parent,
            STAGE_TAG: s.name,
            RECORD_TAG: "false",
            "run_name": f"{label} (verify)",
        }
        under["pgmflow.cache.verifies"] = done.source
        res = self.host.execute(cfg, stream=self.stream, cluster=self.cluster, under=under)
        _, digests = local_outputs(self.tracker, res["run_id"], wl)
        if digests != done.digests:
            raise CacheMismatch(
                f"stage {label}: the recompute (run {res['run_id']}) differs from cached run {done.source}: "
                f"{digests} != {done.digests}"
            )
        self.say(f"stage {label}: verified (run {res['run_id']} gives the same bits)")


class CacheMismatch(RuntimeError):
    """A recomputed stage gave other bits than its cached run (cache.verify, pgmflow cache verify)."""


def _verify_this(cfg: dict, key: str) -> bool:
    frac = float((cfg.get("cache") or {}).get("verify") or 0.0)
    if frac <= 0:
        return False
    draw = int(hashlib.sha256(f"{cfg.get('seed')}:{key}".encode()).hexdigest()[:8], 16) / 16**8
    return draw < frac


def schedule(study: Study, stages: list, bases: dict, parallel: int = 4) -> dict:
    """Run every stage instance as soon as its inputs exist; returns {(stage, unit): Done}."""
    done: dict = {}
    started: set = set()
    foreach_of = {s.name: s.foreach for s in stages}
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        running: dict = {}
        while True:
            for s in stages:
                units = [None]
                if s.foreach is not None:
                    src = done.get((s.foreach.stage, None))
                    if src is None:
                        continue
                    units = list(range(len(src.outputs[s.foreach.output])))
                for u in units:
                    if (s.name, u) in started:
                        continue
                    ins = _inputs_for_aligned(s, u, done, foreach_of)
                    if ins is None:
                        continue
                    started.add((s.name, u))
                    study.prepare(s, bases[s.name], ins)
                    running[pool.submit(study.instance, s, bases[s.name], u, ins)] = (s.name, u)
            if not running:
                break
            finished = set()
            while not finished:
                finished, _ = wait(list(running), timeout=0.1, return_when=FIRST_COMPLETED)
                study.serve()
            for f in finished:
                name_unit = running.pop(f)
                done[name_unit] = f.result()  # a failed stage stops the study (the pool waits for the others)
    missing = [s.name for s in stages if not any(k[0] == s.name for k in done)]
    if missing:
        raise RuntimeError(f"stages never started: {', '.join(missing)} (an upstream output was empty)")
    return done


def _inputs_for_aligned(s, unit, done: dict, foreach_of: dict) -> dict | None:
    out = {}
    for port, ref in s.inputs:
        up_unit = unit if foreach_of.get(ref.stage) is not None else None
        d = done.get((ref.stage, up_unit))
        if d is None:
            return None
        files = d.outputs[ref.output]
        f = files[unit] if (s.foreach == ref) else files[0]
        art = Path(f).relative_to((INPUT_DIR / d.source).resolve()).as_posix()  # its artifact path in the run
        out[port] = (f, d.source, art, d.digests[ref.output][Path(f).name])
    return out


def run_study(cfg: dict, host, stream=None, cluster=None) -> dict:
    """Run the study ``cfg`` describes; returns the result dict (``objective``: the last stage's mean)."""
    import os

    from pgmflow.core import cluster as cluster_mod

    runner = host

    stream = sys.stdout if stream is None else stream
    stages = studyplan.parse(cfg.get("stages"))
    composed: dict = {}
    bases = {s.name: compose_stage(cfg, s, composed) for s in stages}
    tracker = runner._tracker(cfg)
    name = f"study-{'-'.join(s.name for s in stages)}-{time.strftime('%Y%m%d-%H%M%S')}"
    tags = {"pgmflow.pipeline": "study", stagekey.KEY_TAG + ".study": stagekey.job_key(cfg)}
    sweep_run = os.environ.get(runner.SWEEP_RUN_ID)
    if sweep_run:  # a sweep job: the launcher made the run; the study logs into it, on the sweep's cluster
        tracker.attach(sweep_run, cfg, tags)
        opened = runner._sweep_cluster(cfg["cluster"], os.environ[runner.SWEEP_SCHEDULER])
    else:
        tracker.start(name, cfg, tags)
        opened = cluster_mod.open_cluster(cfg["cluster"])
    if cluster is not None:
        opened = contextlib.nullcontext(cluster)
    print(f"pgmflow: study run {tracker.run_id}: {' -> '.join(s.name for s in stages)}", file=stream, flush=True)
    study = Study(cfg, tracker, tracker.run_id, opened, host, stream, shared_locks=bool(sweep_run))
    try:
        done = schedule(study, stages, bases)
    except BaseException as exc:
        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        with contextlib.suppress(Exception):
            tracker.end(status, exc.message if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}")
        study.close(exc)
        raise
    study.close()
    return _finish(study, tracker, stages, done, stream)


def _finish(study: Study, tracker, stages, done: dict, stream) -> dict:
    from pgmflow.core.artifacts import csv_table

    rows = []
    for (name, unit), d in sorted(
        done.items(), key=lambda kv: ([s.name for s in stages].index(kv[0][0]), kv[0][1] or 0)
    ):
        obj = tracker.client.get_run(d.source).data.metrics.get("objective")
        rows.append(
            {
                "stage": name,
                "unit": "" if unit is None else unit,
                "run_id": d.run_id,
                "source": d.source,
                "cached": d.hit,
                "objective": obj,
            }
        )
    tracker.log_text(csv_table(rows), "stages.csv")
    last = [r["objective"] for r in rows if r["stage"] == stages[-1].name and r["objective"] is not None]
    objective = float(sum(last) / len(last)) if last else None
    if objective is not None:
        tracker.log_metrics({"objective": objective}, step=0, flush=True)
    tracker.log_metrics({"stages_cached": study.counts["hits"], "stages_run": study.counts["runs"]}, step=0, flush=True)
    tracker.end("FINISHED")
    c = study.counts
    print(
        f"pgmflow: study finished: {len(done)} stage instances, {c['hits']} cached, {c['runs']} run"
        f" ({c['resumed']} resumed). {tracker.ui_hint}",
        file=stream,
        flush=True,
    )
    return {"objective": objective, "run_id": tracker.run_id, "stages": rows, **c}
