"""``pgmflow cache explain|gc|verify`` and ``pgmflow lineage``: the stage cache from the command line
(docs/stages.md).

* ``pgmflow cache explain OVERRIDES``: for each stage of the study (or the one run) the overrides describe,
  hit (and the run it reuses) or miss, and for a miss what changed since the stage last ran: the module whose
  code changed, the config field, the input, the seed, a library version.
* ``pgmflow cache gc [--older-than DAYS] [OVERRIDES]``: deletes (MLflow's soft delete; ``mlflow gc`` purges)
  the stage runs that no kept study or sweep run references, directly or as the source of a cached stage.
* ``pgmflow cache verify RUN_ID [OVERRIDES]``: recomputes every cached stage of a study run (or the one cached
  stage run) and compares each output's digest with its source's; exit 1 on any difference.
* ``pgmflow lineage RUN_ID``: the chain of runs back to the raw data, with each stage's code fingerprint and
  seed.
"""

from __future__ import annotations

import json
import sys
import time

from pgmflow.core import stagekey, study, studyplan
from pgmflow.core.errors import EXIT_BAD_INPUT, ConfigError

USAGE = (
    "usage: pgmflow cache explain OVERRIDES... | pgmflow cache gc [--older-than DAYS] [OVERRIDES...] | "
    "pgmflow cache verify RUN_ID [OVERRIDES...] | pgmflow lineage RUN_ID [OVERRIDES...]"
)


def _tracker(overrides: list[str]):
    from pgmflow.core.config import nested_compose
    from pgmflow.core.runner import _tracker as make

    try:
        cfg = nested_compose(list(overrides))
    except Exception as exc:
        what = " ".join(str(exc).split())[:300]
        raise ConfigError(
            "overrides", " ".join(overrides), what, "check the overrides (key=value, group=option)"
        ) from None
    return cfg, make(cfg)


def _json(tracker, run_id: str, name: str) -> dict | None:
    try:
        return json.loads(_read(tracker, run_id, name))
    except Exception:
        return None


def _tmp() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="pgmflow-cache-")


def _read(tracker, run_id: str, name: str) -> str:
    from pathlib import Path

    return Path(tracker.client.download_artifacts(run_id, name, _tmp())).read_text()


def _last_material(tracker, stage_name: str | None, pipeline: str) -> dict | None:
    exp = tracker._experiment_id()
    filt = f"tags.`{study.STAGE_TAG}` = '{stage_name}'" if stage_name else f"tags.`pgmflow.pipeline` = '{pipeline}'"
    for r in tracker.client.search_runs(
        [exp], filter_string=filt, order_by=["attributes.start_time DESC"], max_results=20
    ):
        mat = _json(tracker, r.info.run_id, "stage_key.json")
        if mat is not None and r.data.tags.get(study.HIT_TAG) is None:
            return mat
    return None


def _say_miss(name: str, old: dict | None, new: dict, out):
    if old is None:
        print(f"{name}: miss (never run)", file=out)
        return
    why = stagekey.explain(old, new) or ["an identical key whose run is gone"]
    print(f"{name}: miss: {'; '.join(why[:6])}{' ...' if len(why) > 6 else ''}", file=out)


def explain(overrides: list[str], out=sys.stdout) -> int:
    from pgmflow.core import registry

    cfg, tracker = _tracker(overrides)
    if not cfg.get("stages"):
        key, mat = stagekey.for_run(cfg)
        entry = study.cache_entry(tracker, key)
        if entry is not None:
            print(f"{cfg['pipeline']['name']}: hit (run {entry.info.run_id})", file=out)
        else:
            _say_miss(cfg["pipeline"]["name"], _last_material(tracker, None, cfg["pipeline"]["name"]), mat, out)
        return 0
    stages = studyplan.parse(cfg["stages"])
    known: dict = {}  # (stage, unit) -> Done of a hit
    for s in stages:
        wl, base = registry.get(s.workload), study.compose_stage(cfg, s)
        units = [None]
        if s.foreach is not None:
            src = known.get((s.foreach.stage, None))
            if src is None:
                print(
                    f"{s.name}: miss (upstream {s.foreach.stage} must run first: its outputs are the units)", file=out
                )
                continue
            units = list(range(len(src.outputs[s.foreach.output])))
        foreach_of = {x.name: x.foreach for x in stages}
        for u in units:
            label = s.name if u is None else f"{s.name}[{u}]"
            ins = study._inputs_for_aligned(s, u, known, foreach_of)
            if ins is None:
                ups = ", ".join(sorted(s.upstream()))
                print(f"{label}: miss (upstream {ups} must run first: its outputs decide this key)", file=out)
                continue
            mat = stagekey.material(base, wl, {p: d for p, (_f, _s, _n, d) in ins.items()})
            entry = study.cache_entry(tracker, stagekey.key(mat))
            if entry is None:
                _say_miss(label, _last_material(tracker, s.name, s.workload), mat, out)
                continue
            outs, digests = study.local_outputs(tracker, entry.info.run_id, wl)
            known[(s.name, u)] = study.Done(entry.info.run_id, entry.info.run_id, True, outs, digests)
            print(f"{label}: hit (run {entry.info.run_id})", file=out)
    return 0


def gc(args: list[str], out=sys.stdout) -> int:
    days = 0.0
    if args[:1] == ["--older-than"]:
        try:
            days = float(args[1])
        except (IndexError, ValueError):
            raise ConfigError(
                "--older-than", args[1:2], "must be a number of days", "pgmflow cache gc --older-than 30"
            ) from None
        args = args[2:]
    cfg, tracker = _tracker(args)
    exp = tracker._experiment_id()
    runs = tracker.client.search_runs([exp], max_results=50000)
    by_id = {r.info.run_id: r for r in runs}
    kept_parents = {
        r.info.run_id
        for r in runs
        if r.data.tags.get("pgmflow.pipeline") == "study" or "pgmflow.sweep_key" in r.data.tags
    }
    referenced = set()
    for r in runs:
        if r.data.tags.get("mlflow.parentRunId") in kept_parents:
            referenced.add(r.info.run_id)
            if r.data.tags.get(study.HIT_TAG):
                referenced.add(r.data.tags[study.HIT_TAG])
    cutoff = (time.time() - days * 86400) * 1000
    gone = [
        rid
        for rid, r in by_id.items()
        if study.STAGE_TAG in r.data.tags and rid not in referenced and (r.info.end_time or 0) <= cutoff
    ]
    for rid in gone:
        tracker.client.delete_run(rid)
    print(
        f"pgmflow cache gc: deleted {len(gone)} unreferenced stage run(s); kept {len(referenced)} referenced", file=out
    )
    return 0


def verify(args: list[str], out=sys.stdout) -> int:
    from pgmflow.core import cluster as cluster_mod
    from pgmflow.core import registry

    if not args or "=" in args[0]:  # an override where the run id goes
        raise ConfigError("run id", None, "missing", "pgmflow cache verify RUN_ID [OVERRIDES...]")
    run_id, overrides = args[0], args[1:]
    cfg, tracker = _tracker(overrides)
    run = tracker.client.get_run(run_id)
    children = (
        [run]
        if run.data.tags.get(study.HIT_TAG)
        else tracker.client.search_runs(
            [run.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'", max_results=10000
        )
    )
    hits = [c for c in children if c.data.tags.get(study.HIT_TAG)]
    parent = run.data.tags.get("mlflow.parentRunId", run_id) if run.data.tags.get(study.HIT_TAG) else run_id
    from pgmflow.core import runner

    st = study.Study(cfg, tracker, parent, cluster_mod.open_cluster(cfg["cluster"]), runner, out)
    try:
        for c in hits:
            wl = registry.get(c.data.tags["pgmflow.pipeline"])
            rec = json.loads(_read(tracker, c.info.run_id, "stage_outputs.json"))
            done = study.Done(c.info.run_id, c.data.tags[study.HIT_TAG], True, {}, rec["digests"])
            s = studyplan.StageDef(c.data.tags.get(study.STAGE_TAG, "stage"), wl.name)
            st.verify(s, wl, done, c.info.run_name or s.name)
    finally:
        st.close()
    print(f"pgmflow cache verify: {len(hits)} cached stage(s) recomputed, every output the same bits", file=out)
    return 0


def lineage(args: list[str], out=sys.stdout) -> int:
    if not args or "=" in args[0]:  # an override where the run id goes
        raise ConfigError("run id", None, "missing", "pgmflow lineage RUN_ID [OVERRIDES...]")
    _, tracker = _tracker(args[1:])
    _lineage(tracker, args[0], 0, out, set())
    return 0


def _lineage(tracker, run_id: str, depth: int, out, seen: set):
    pad = "  " * depth
    run = tracker.client.get_run(run_id)
    tags = run.data.tags
    if tags.get("pgmflow.pipeline") == "study":
        print(f"{pad}study run {run_id}", file=out)
        kids = tracker.client.search_runs(
            [run.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'"
        )
        for k in sorted(kids, key=lambda r: r.info.start_time or 0):
            _lineage(tracker, k.info.run_id, depth + 1, out, seen)
        return
    mat = _json(tracker, run_id, "stage_key.json") or {}
    code = stagekey.key(mat.get("code", {}))[:12] if mat else "?"
    src = tags.get(study.HIT_TAG)
    what = f"stage {tags.get(study.STAGE_TAG, '-')} ({tags.get('pgmflow.pipeline')})"
    cached = f", cached from run {src}" if src else ""
    seed = mat.get("seed", "not random") if mat else "?"
    key = tags.get(stagekey.KEY_TAG, "?")[:12]
    print(f"{pad}run {run_id}: {what}{cached}; key {key}, code {code}, seed {seed}", file=out)
    if run_id in seen:
        return
    seen.add(run_id)
    inputs = _json(tracker, run_id, "stage_inputs.json") or {}
    for port, rec in sorted(inputs.items()):
        print(f"{pad}  input {port} <- run {rec['run']} {rec['file']} (digest {str(rec['digest'])[:12]})", file=out)
        _lineage(tracker, rec["run"], depth + 2, out, seen)
    origin = tracker.client.get_run(src) if src else run
    for ds in origin.inputs.dataset_inputs if origin.inputs else []:
        d = ds.dataset
        print(f"{pad}  data {d.name}: digest {d.digest}, source {d.source}", file=out)


def main(argv: list[str]) -> int:
    cmds = {"explain": explain, "gc": gc, "verify": verify}
    try:
        if argv[:1] == ["lineage"]:
            return lineage(argv[1:])
        if len(argv) < 2 or argv[1] not in cmds:
            got = argv[1] if len(argv) > 1 else None
            print(f"pgmflow: error: cache command={got!r}: unknown or missing; fix: {USAGE}", file=sys.stderr)
            return EXIT_BAD_INPUT
        return cmds[argv[1]](argv[2:])
    except ConfigError as exc:
        print(f"pgmflow: error: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except study.CacheMismatch as exc:
        print(f"pgmflow: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        from mlflow.exceptions import MlflowException

        if not isinstance(exc, MlflowException):
            raise
        msg = " ".join(str(exc).split())[:300]
        print(f"pgmflow: error: {msg}; fix: pass a run id of this store (and its tracking.uri=...)", file=sys.stderr)
        return EXIT_BAD_INPUT
