"""Small work runs in this process (pgmflow.core.smallwork): the per-workload estimates put every debug
run under the threshold and every default run the project ships as heavy above it; the rule applies to a
local profile only and never with cluster.in_process=false; a run it takes in-process says so, records
it, and gives the bits the same run gives on worker processes."""

from __future__ import annotations

import io

import pytest

from tests.conftest import compose
from tests.pipelines.core.test_bit_reproducibility import artifacts
from tests.pipelines.helpers import run

DEBUG = {
    "tempering": ["pipeline=tempering", "debug=default"],
    "svi": ["pipeline=svi", "debug=default"],
    "tesla": ["pipeline=tesla", "debug=default"],
    "bounds": ["pipeline=bounds", "debug=default"],
    "sparse_gp": ["pipeline=sparse_gp", "debug=default"],
}
# the defaults that do seconds of work or more (measured: docs/clusters.md); sparse_gp's default fits in
# the driver anyway (sparse_gp.in_process=auto), and its estimate is that fit's
HEAVY = {
    "tempering": ["pipeline=tempering"],
    "svi": ["pipeline=svi"],
    "tesla": ["pipeline=tesla"],
    "bounds": ["pipeline=bounds"],
    "sparse_gp": ["pipeline=sparse_gp", "sparse_gp.in_process=false"],
}


def _plan(overrides):
    from pgmflow.core import preflight

    cfg = compose([*overrides, "cluster.in_process=auto"])
    return cfg, preflight.preflight_checks(cfg)


@pytest.mark.parametrize("name", sorted(DEBUG))
def test_every_debug_run_is_small_and_runs_in_process(name):
    from pgmflow.core import smallwork

    cfg, plan = _plan(DEBUG[name])
    est = smallwork.estimate(cfg, plan)
    assert est is not None and 0 < est <= smallwork.MAX_SECONDS, (name, est)
    line = smallwork.in_process_reason(cfg, plan, "local")
    assert line and "small work" in line and "cluster.in_process=false" in line


@pytest.mark.parametrize("name", sorted(HEAVY))
def test_heavy_defaults_start_the_workers(name):
    from pgmflow.core import smallwork

    cfg, plan = _plan(HEAVY[name])
    est = smallwork.estimate(cfg, plan)
    assert est is None or est > smallwork.MAX_SECONDS, (name, est)
    assert smallwork.in_process_reason(cfg, plan, "local") is None


def test_the_rule_holds_only_on_a_local_profile_and_not_when_switched_off():
    from pgmflow.core import preflight, smallwork

    cfg, plan = _plan(DEBUG["svi"])
    for kind in ("address", "slurm", "pbs", "kubernetes", "local_cuda"):
        assert smallwork.in_process_reason(cfg, plan, kind) is None, kind
    off = compose([*DEBUG["svi"], "cluster.in_process=false"])
    assert smallwork.in_process_reason(off, preflight.preflight_checks(off), "local") is None


def test_tempering_with_bounds_gives_no_estimate():
    from pgmflow.core import smallwork

    cfg, plan = _plan([*DEBUG["tempering"], "bounds=true"])
    assert smallwork.estimate(cfg, plan) is None
    assert smallwork.in_process_reason(cfg, plan, "local") is None


@pytest.mark.parametrize("value", ["maybe", "yes", 3])
def test_a_bad_value_is_refused_in_one_line(value):
    from pgmflow.core.cluster import check_cluster_config
    from pgmflow.core.errors import ConfigError

    cfg = compose(["cluster.in_process=auto"])
    cfg["cluster"]["in_process"] = value
    with pytest.raises(ConfigError) as e:
        check_cluster_config(cfg["cluster"])
    assert e.value.field == "cluster.in_process" and "\n" not in str(e.value)


def test_the_environment_sets_the_default():
    """PGMFLOW_IN_PROCESS is the key's default (the suite sets false); a command-line value wins."""
    assert compose([])["cluster"]["in_process"] == "false"
    assert compose(["cluster.in_process=auto"])["cluster"]["in_process"] == "auto"


def test_an_in_process_run_says_so_and_gives_the_workers_bits(mlflow_uri, cluster2):
    """The debug tempering run on the default local profile: no worker started, one line, tagged; every
    artifact equal to the same run's on two worker processes."""
    from pgmflow.core.runner import execute
    from pgmflow.core.tracking import Tracker

    ov = [*DEBUG["tempering"], "progress=false", f"tracking.uri={mlflow_uri}"]
    cfg = compose([*ov, "cluster.profile=local", "cluster.in_process=auto"])
    out = io.StringIO()
    res = execute(cfg, stream=out)
    text = out.getvalue()
    assert "small work (about" in text and "no local workers started" in text, text[:2000]
    tr = Tracker(mlflow_uri, cfg["tracking"]["experiment"])
    tr.run_id = res["run_id"]
    tags = tr.client.get_run(tr.run_id).data.tags
    assert tags["pgmflow.cluster.type"] == "in_process" and tags["pgmflow.cluster.profile"] == "local"
    _, on_workers = run(ov, mlflow_uri, cluster2)
    got, ref = artifacts(tr), artifacts(on_workers)
    assert sorted(got) == sorted(ref)
    for k in ref:
        assert got[k] == ref[k], f"{k} differs between the in-process run and the run on 2 workers"


def test_a_run_in_the_driver_never_imports_distributed(tmp_path):
    """The 0.5 s import of dask.distributed is for clusters: a debug svi run through the Python API, in a fresh
    interpreter on the default local profile, runs in the driver and leaves it unimported."""
    import os
    import subprocess
    import sys

    code = (
        "import sys, io, pgmflow\n"
        "r = pgmflow.run('pipeline=svi', 'debug=default', 'progress=false', stream=io.StringIO())\n"
        "print('distributed imported:', 'distributed' in sys.modules, r.run_id)\n"
    )
    env = {**os.environ, "PGMFLOW_IN_PROCESS": "auto"}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "distributed imported: False" in r.stdout, (r.stdout, r.stderr[-2000:])
