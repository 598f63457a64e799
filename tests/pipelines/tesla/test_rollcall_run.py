"""``network=rollcall`` end to end (issue 36) on a small Voteview CSV triple written here: a real LocalCluster
and a real MLflow store. The run reports within-party edge shares and grid-edge counts, logs the party
figures, reads the file once per run, and its estimates are bit-identical on 1 and 3 workers."""

from __future__ import annotations

import numpy as np

from pgmflow.tasks.tesla import rollcall
from tests.pipelines.helpers import run
from tests.tasks.tesla import rollcall_files


def _overrides(folder, axis="rollcall"):
    return [
        "pipeline=tesla",
        "network=rollcall",
        "network.source=voteview",
        f"network.path={folder}",
        f"network.time_axis={axis}",
        "tesla.lambda1=[0.2,0.1,0.05]",
        "tesla.lambda2=[2.0,0.5]",
        "tesla.bandwidth=[2.0]",
        "progress=false",
    ]


def _estimates(tr) -> dict:
    with np.load(tr.download("estimates.npz")) as z:
        return {k: z[k] for k in z.files}


def test_rollcall_run_reports_parties(tmp_path, mlflow_uri, cluster_factory, monkeypatch):
    rollcall_files.write(tmp_path)
    reads = []
    real = rollcall.read_voteview
    monkeypatch.setattr(rollcall, "read_voteview", lambda *a, **k: reads.append(a) or real(*a, **k))
    res, tr = run(_overrides(tmp_path), mlflow_uri, cluster_factory(1))
    assert len(reads) == 1  # read once per run, in validation
    assert res["nodes"] == 6 and res["time_points"] == 24
    for m in ("tesla", "keller", "static"):
        assert 0 <= res[f"{m}_grid_edge_nodes"] <= 6
        assert np.isnan(res[f"{m}_within_group_share"]) or 0.0 <= res[f"{m}_within_group_share"] <= 1.0
    arts = set(tr.list_artifacts("figures"))
    for name in ("network_snapshots", "within_group_share", "changing_edges", "edges_over_time"):
        assert f"figures/{name}.png" in arts, arts
    est = _estimates(tr)
    assert list(est["node_names"])[4] == "ECHO/FOXTROT (D CC)" and est["times"][0] == "2005-01-04 #0001"


def test_rollcall_estimates_bit_identical_on_1_and_3_workers(tmp_path, mlflow_uri, cluster_factory):
    rollcall_files.write(tmp_path, n_rollcalls=40, seed=3)
    ov = _overrides(tmp_path, "day") + ["tesla.figures=false"]
    outs = [_estimates(run(ov, mlflow_uri, cluster_factory(n))[1]) for n in (1, 3)]
    assert set(outs[0]) == set(outs[1])
    for k in outs[0]:
        np.testing.assert_array_equal(outs[0][k], outs[1][k], err_msg=k)
    assert np.count_nonzero(outs[0]["theta_tesla"]) > 0
