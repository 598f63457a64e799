"""Studies and the stage cache (docs/stages.md), on a real LocalCluster and a real MLflow store: a 3-stage study
(TESLA -> network_mrf -> bounds per time point) reuses what did not change and its hits hold the bits of a cold
run; the code fingerprint ignores comments and docstrings and sees code; ``cache explain``, ``gc``, ``verify``
and ``lineage`` on the same store."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from tests.conftest import compose

STUDY = ["experiment=tesla_bounds_study", "progress=false"]


def _where(cluster, uri):
    return ["cluster.profile=address", f"cluster.address={cluster.scheduler_address}", f"tracking.uri={uri}"]


def _run(overrides, tmp_path, monkeypatch):
    from pgmflow.core.runner import execute

    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    res = execute(compose(overrides), stream=out)
    return res, out.getvalue()


def _outputs(uri, rows) -> dict:
    """{(stage, unit): output digests} of a study's stage instances (from each run's stage_outputs.json)."""
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    out = {}
    for r in rows:
        tr.run_id = r["run_id"]
        out[(r["stage"], r["unit"])] = json.loads(tr.read_text("stage_outputs.json"))["digests"]
    return out


def test_a_changed_last_stage_reruns_only_itself_and_hits_equal_a_cold_run(tmp_path, cluster2, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}"
    (tmp_path / "a").mkdir()
    where = _where(cluster2, uri)
    cold, _ = _run([*STUDY, *where], tmp_path / "a", monkeypatch)
    assert (cold["runs"], cold["hits"]) == (6, 0)  # learn, mrf, bounds at 4 time points
    changed, text = _run([*STUDY, *where, "+stages.bounds.config.variational.damping=0.4"], tmp_path / "a", monkeypatch)
    assert (changed["runs"], changed["hits"]) == (4, 2), text
    assert "stage learn: cached" in text and "stage mrf: cached" in text
    again, text = _run([*STUDY, *where], tmp_path / "a", monkeypatch)
    assert (again["runs"], again["hits"]) == (0, 6), text
    hits = _outputs(uri, again["stages"])
    assert hits == _outputs(uri, cold["stages"])
    # the same study cold in another store: the hits hold exactly its bits
    uri_b = f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}"
    (tmp_path / "b").mkdir()
    fresh, _ = _run([*STUDY, *_where(cluster2, uri_b)], tmp_path / "b", monkeypatch)
    assert fresh["hits"] == 0 and _outputs(uri_b, fresh["stages"]) == hits
    assert cold["objective"] == again["objective"] == fresh["objective"]
    assert changed["objective"] != cold["objective"] or True  # damping need not move converged bounds

    from pgmflow.core import cache_cli

    out = io.StringIO()
    cache_cli.explain([*STUDY, *where, "stages.learn.config.network.T=21"], out=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("learn: miss: config network.T: 20 -> 21"), lines
    out = io.StringIO()
    cache_cli.explain([*STUDY, *where], out=out)
    assert all(": hit (run " in ln for ln in out.getvalue().splitlines()), out.getvalue()
    out = io.StringIO()
    cache_cli.lineage([again["stages"][-1]["run_id"], f"tracking.uri={uri}"], out=out)
    text = out.getvalue()
    assert "stage bounds (bounds), cached from run" in text
    assert "input model <- run" in text and "input estimates <- run" in text and "stage learn (tesla)" in text
    assert "seed 0" in text and "seed not random" in text and "pgmflow.tasks.tesla.synthetic" in text

    # verify: every hit of the last study recomputed on the synchronous scheduler, the same bits
    out = io.StringIO()
    assert cache_cli.verify([again["run_id"], f"tracking.uri={uri}", "cluster.profile=synchronous"], out=out) == 0
    assert "6 cached stage(s) recomputed" in out.getvalue()

    # gc: nothing a kept study references goes; deleting the studies makes their stage runs collectable
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    out = io.StringIO()
    cache_cli.gc([f"tracking.uri={uri}"], out=out)
    assert "deleted 0 " in out.getvalue()
    tr.client.delete_run(cold["run_id"])  # the cold study's stage runs stay: the third study's hits use them
    out = io.StringIO()
    cache_cli.gc([f"tracking.uri={uri}"], out=out)
    assert "deleted 0 " in out.getvalue()
    for r in (again, changed):
        tr.client.delete_run(r["run_id"])
    out = io.StringIO()
    cache_cli.gc([f"tracking.uri={uri}"], out=out)
    assert "deleted 0 " not in out.getvalue()
    rerun, text = _run([*STUDY, *where], tmp_path / "a", monkeypatch)
    assert rerun["hits"] == 0, text  # a key whose run is gone is a miss, never an error


def _package(root: Path, b_body: str) -> str:
    pkg = root / "stagepkg"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from stagepkg import b\n\n\ndef f(x):\n    return b.g(x) + 1\n")
    (pkg / "b.py").write_text(b_body)
    (pkg / "c.py").write_text("X = 1\n")  # not imported by a: outside the closure
    return "stagepkg"


def test_the_code_fingerprint_ignores_comments_and_docstrings_and_sees_code(tmp_path, monkeypatch):
    from pgmflow.core import fingerprint, stagekey

    monkeypatch.syspath_prepend(str(tmp_path))
    body = "def g(x):\n    return 2 * x\n"
    _package(tmp_path, body)
    before = fingerprint.closure(["stagepkg.a"], "stagepkg")
    assert set(before) == {"stagepkg", "stagepkg.a", "stagepkg.b"}
    time_step = 10**9
    for edit in (
        '"""A docstring."""\n\n# a comment\ndef g(x):\n    """Twice x."""\n    return 2 * x  # doubled\n',
        "def g(x):\n\n    return 2 * x\n",
    ):
        (tmp_path / "stagepkg" / "b.py").write_text(edit)
        st = os.stat(tmp_path / "stagepkg" / "b.py")
        os.utime(tmp_path / "stagepkg" / "b.py", ns=(st.st_atime_ns, st.st_mtime_ns + time_step))
        assert fingerprint.closure(["stagepkg.a"], "stagepkg") == before, edit
    (tmp_path / "stagepkg" / "b.py").write_text("def g(x):\n    return 3 * x\n")
    after = fingerprint.closure(["stagepkg.a"], "stagepkg")
    assert {m for m in after if after[m] != before[m]} == {"stagepkg.b"}
    old, new = {"code": {"modules": before}}, {"code": {"modules": after}}
    assert stagekey.explain(old, new) == ["code of stagepkg.b changed"]


def test_every_run_records_its_stage_key_and_an_input_edit_is_named(tmp_path, cluster2, monkeypatch):
    """A single run tags its key; ``cache explain`` names the input file whose content changed."""
    import numpy as np

    from pgmflow.core import cache_cli
    from pgmflow.core.runner import execute

    monkeypatch.chdir(tmp_path)
    J = np.zeros((5, 5))
    J[0, 1] = J[1, 0] = 0.5
    np.savez(tmp_path / "J.npz", J=J)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [
        "pipeline=bounds",
        "model=mrf",
        f"model.path={tmp_path / 'J.npz'}",
        "progress=false",
        *_where(cluster2, uri),
    ]
    res = execute(compose(args), stream=io.StringIO())
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    assert len(tr.client.get_run(res["run_id"]).data.tags["pgmflow.stage_key"]) == 64
    J[2, 3] = J[3, 2] = 0.25
    np.savez(tmp_path / "J.npz", J=J)
    out = io.StringIO()
    cache_cli.explain(args, out=out)
    assert out.getvalue().startswith("bounds: miss: input model: "), out.getvalue()


@pytest.mark.slow
def test_verify_during_a_run_and_on_one_and_three_workers(tmp_path, monkeypatch):
    from pgmflow.core import cache_cli

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    loc = [f"tracking.uri={uri}", "cluster.n_workers=3"]
    _run([*STUDY, *loc], tmp_path, monkeypatch)
    again, text = _run([*STUDY, *loc, "cache.verify=1.0"], tmp_path, monkeypatch)  # every hit recomputed in the run
    assert again["hits"] == 6 and text.count("gives the same bits") == 6, text
    for workers in ("3", "1"):
        out = io.StringIO()
        assert cache_cli.verify([again["run_id"], f"tracking.uri={uri}", f"cluster.n_workers={workers}"], out=out) == 0
        assert "6 cached stage(s) recomputed" in out.getvalue()


def test_a_module_of_the_middle_stage_is_in_its_closure_only():
    """An edit to the conversion module of the study's second stage (network_mrf) changes that stage's code
    digest and no other workload's: the first stage (tesla) and the third (bounds) keep their keys, and the
    third misses only if the second's output changes (its input digest)."""
    from pgmflow.core import fingerprint, registry

    mod = "pgmflow.tasks.bounds.from_network"
    closures = {w.name: fingerprint.workload_code(w) for w in registry.workloads()}
    assert [name for name, code in closures.items() if mod in code] == ["network_mrf"]
    assert "pgmflow.tasks.tesla.solver" in closures["tesla"] and "pgmflow.tasks.bounds.trw" in closures["bounds"]
    assert all(len(d) == 64 for d in closures["network_mrf"].values())
