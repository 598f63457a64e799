"""pipeline=tempering model=mrf: log Z against enumeration with the MF/TRW bounds along the ladder, the same bits
on the synchronous scheduler, on 1 and 3 workers and after a resume (a sparse edge-list file, the mean-field
reference), and the mean-field reference's lower barrier; reference=stabilized (a uniform leg and a product
leg joined at the target): log Z and both legs' estimates against enumeration with the bounds on each leg, the
same bits on 1 and 3 workers, synchronously and after a resume past a fit, and the split."""

from __future__ import annotations

import io
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest

from tests.conftest import compose
from tests.pipelines.helpers import assert_one_value_per_step, assert_same_results, run


def write_model(path: Path, n: int, seed: int, sparse: bool = False, density: float = 0.3, scale: float = 0.6):
    rng = np.random.default_rng(seed)
    J = np.triu(rng.normal(0.0, scale, (n, n)) * (rng.random((n, n)) < density), 1)
    h = rng.normal(0.0, 0.3, n)
    if sparse:
        i, j = np.nonzero(J)
        np.savez(path, edges=np.stack([j, i], axis=1), J=J[i, j], h=h)  # (j, i): either orientation is read
    else:
        np.savez(path, J=J + J.T, h=h)
    return J + J.T, h


def small(path, *extra):
    return [
        "model=mrf",
        f"model.path={path}",
        "tempering.n_replicas=8",
        "tempering.n_rounds=7",
        "tempering.n_chains=2",
        "tempering.sweeps_per_scan=2",
        "progress=false",
        *extra,
    ]


def test_log_z_against_enumeration_with_bounds_and_figures(tmp_path, mlflow_uri):
    from pgmflow.tasks.bounds import exact
    from pgmflow.tasks.bounds import mrf as M

    J, h = write_model(tmp_path / "m.npz", 14, seed=3)
    truth = exact.log_z_enumeration(M.from_dense(0.9 * J, 0.9 * h))
    res, tr = run(small(tmp_path / "m.npz", "model.beta=0.9", "bounds=true", "tempering.n_rounds=9"), mlflow_uri)
    assert res["log_z_exact"] == pytest.approx(truth, rel=1e-12)
    assert tr.client.get_run(tr.run_id).data.tags["pgmflow.tempering.exact_log_z"] == "enumeration"
    assert abs(res["log_z_ss"] - truth) < 3 * res["log_z_ss_se"], res
    assert res["bounds_order_holds"] and res["bounds_mf_per_site"] * 14 <= truth <= res["bounds_trw_per_site"] * 14
    arts = set(tr.list_artifacts("figures"))
    assert "figures/log_z_bounds.png" in arts, arts
    assert "tables/bounds.csv" in set(tr.list_artifacts("tables"))


def test_a_graph_without_couplings_runs_and_matches_its_closed_form(tmp_path, mlflow_uri):
    """Independent spins (a learned network can be empty at a time point): PT runs, and log Z is compared with
    sum_i log 2 cosh h_i (an empty graph, no nodes at all, is refused: tests/bad_input)."""
    h = np.array([0.4, -1.1, 0.0, 2.2, 0.7, -0.3])
    np.savez(tmp_path / "free.npz", J=np.zeros((6, 6)), h=h)
    res, tr = run(small(tmp_path / "free.npz"), mlflow_uri)
    truth = float(np.sum(np.log(2.0 * np.cosh(h))))
    assert res["log_z_exact"] == pytest.approx(truth, rel=1e-14)
    assert tr.client.get_run(tr.run_id).data.tags["pgmflow.tempering.exact_log_z"] == "analytic"
    assert abs(res["log_z_ss"] - truth) < 3 * res["log_z_ss_se"] + 1e-9, res


def _drop_checkpoints_after(tracker, run_id, keep: int):
    uri = tracker.client.get_run(run_id).info.artifact_uri
    for p in (Path(urlparse(uri).path) / "checkpoints").glob("round_*.npz"):
        if int(p.stem.split("_")[-1]) > keep:
            p.unlink()
    tracker.client.set_terminated(run_id, "KILLED")


@pytest.mark.slow
def test_same_bits_on_1_and_3_workers_synchronous_and_after_a_resume(tmp_path, mlflow_uri, cluster_factory):
    """A sparse edge-list model of 300 nodes with the mean-field reference and Metropolis moves."""
    write_model(tmp_path / "e.npz", 300, seed=4, sparse=True, density=0.012, scale=0.8)
    ov = small(
        tmp_path / "e.npz",
        "tempering.reference=variational",
        "tempering.explorer=metropolis",
        "tempering.figures=false",
        "tempering.checkpoint_every=1",
    )
    sync, tr_sync = run(ov + ["tempering.layout=chain", "tempering.scans_per_task=5"], mlflow_uri)
    _, tr_1 = run(ov + ["tempering.layout=chain"], mlflow_uri, cluster_factory(1))
    _, tr_3 = run(ov + ["tempering.layout=blocks", "tempering.n_blocks=3"], mlflow_uri, cluster_factory(3))
    assert_same_results(tr_sync, tr_1)
    assert_same_results(tr_sync, tr_3)
    assert sync["swap_accept_mean"] > 0 and sync["round_trips"] > 0
    cut, tr_cut = run(ov, mlflow_uri)
    _drop_checkpoints_after(tr_cut, cut["run_id"], keep=4)
    from pgmflow.core.runner import execute

    execute(
        compose(ov + [f"resume={cut['run_id']}", f"tracking.uri={mlflow_uri}", "cluster.profile=synchronous"]),
        stream=io.StringIO(),
    )
    assert_same_results(tr_sync, tr_cut)
    assert_one_value_per_step(tr_cut.client, cut["run_id"])


def test_mean_field_reference_lowers_the_barrier(tmp_path, mlflow_uri):
    """A ferromagnet in a field, where the mean-field product is close to the target: the path from it has a
    lower barrier than the path from uniform spins, and both estimate the same log Z."""
    rng = np.random.default_rng(8)
    n = 16
    J = np.triu(np.abs(rng.normal(0.0, 0.5, (n, n))) * (rng.random((n, n)) < 0.4), 1)
    np.savez(tmp_path / "f.npz", J=J + J.T, h=rng.normal(0.8, 0.2, n))
    ov = small(tmp_path / "f.npz", "tempering.figures=false", "tempering.n_rounds=8")
    fixed, _ = run(ov, mlflow_uri)
    mf, _ = run(ov + ["tempering.reference=variational"], mlflow_uri)
    for res in (fixed, mf):
        assert abs(res["log_z_ss"] - res["log_z_exact"]) < 3 * res["log_z_ss_se"], res
    assert mf["barrier"] < 0.5 * fixed["barrier"], (mf["barrier"], fixed["barrier"])


def test_stabilized_log_z_against_enumeration_with_bounds(tmp_path, mlflow_uri):
    """A frustrated 12-node model in a field: the two legs' log Z and their combination within 3 SE of
    enumeration, the per-leg entries of the continuous targets' stabilized runs, and bounds=true on both legs
    (the order MF <= tempering <= TRW at every level of each leg, the results at the target the fixed leg's)."""
    from pgmflow.tasks.bounds import exact
    from pgmflow.tasks.bounds import mrf as M

    J, h = write_model(tmp_path / "s.npz", 12, seed=5, density=0.5, scale=0.9)
    truth = exact.log_z_enumeration(M.from_dense(J, h))
    ov = small(tmp_path / "s.npz", "tempering.reference=stabilized", "bounds=true", "tempering.n_rounds=8")
    res, tr = run(ov, mlflow_uri)
    assert res["log_z_exact"] == pytest.approx(truth, rel=1e-12)
    assert abs(res["log_z_ss"] - truth) < 3 * res["log_z_ss_se"], res
    for leg in ("fixed", "variational"):
        assert abs(res[f"log_z_ss_{leg}"] - truth) < 3 * res[f"log_z_ss_se_{leg}"], (leg, res)
        assert res[f"n_levels_{leg}"] >= 2 and res[f"round_trips_{leg}"] > 0, res
    assert res["n_levels_fixed"] + res["n_levels_variational"] == 8
    assert res["barrier"] == pytest.approx(res["barrier_fixed"] + res["barrier_variational"])
    assert res["bounds_order_holds"], res
    assert res["bounds_mf_per_site"] * 12 <= truth <= res["bounds_trw_per_site"] * 12
    assert {"figures/legs.png", "figures/log_z_bounds.png"} <= set(tr.list_artifacts("figures"))


def test_stabilized_split_half_keeps_the_legs(tmp_path, mlflow_uri):
    """stabilized_split=half: K // 2 levels on the fixed leg every round; adaptive moves them to the leg with
    the larger barrier (the uniform one on a ferromagnet in a field, where the mean-field product is close)."""
    rng = np.random.default_rng(8)
    n = 12
    J = np.triu(np.abs(rng.normal(0.0, 0.5, (n, n))) * (rng.random((n, n)) < 0.4), 1)
    np.savez(tmp_path / "f.npz", J=J + J.T, h=rng.normal(0.8, 0.2, n))
    ov = small(tmp_path / "f.npz", "tempering.reference=stabilized", "tempering.figures=false", "tempering.n_chains=1")
    half, _ = run(ov + ["tempering.stabilized_split=half"], mlflow_uri)
    assert half["n_levels_fixed"] == 4 and half["n_levels_variational"] == 4, half
    adaptive, _ = run(ov, mlflow_uri)
    assert adaptive["barrier_fixed"] > adaptive["barrier_variational"], adaptive
    assert adaptive["n_levels_fixed"] > adaptive["n_levels_variational"] >= 2, adaptive
    for res in (half, adaptive):
        assert abs(res["log_z_ss"] - res["log_z_exact"]) < 3 * res["log_z_ss_se"], res


@pytest.mark.slow
def test_stabilized_same_bits_on_1_and_3_workers_synchronous_and_after_a_resume(tmp_path, mlflow_uri, cluster_factory):
    """reference=stabilized on a sparse edge-list model of 200 nodes, heat bath: the same bits on the synchronous
    scheduler (chain layout, 5 scans per task), on 1 worker and on 3 (one block per worker), and after a
    resume from round 4's checkpoint (round 5 runs with the product fitted to round 4, which the checkpoint
    holds)."""
    write_model(tmp_path / "e.npz", 200, seed=6, sparse=True, density=0.02, scale=0.8)
    ov = small(
        tmp_path / "e.npz",
        "tempering.reference=stabilized",
        "tempering.figures=false",
        "tempering.checkpoint_every=1",
        "tempering.variational_from_round=3",
        "tempering.n_rounds=6",
    )
    sync, tr_sync = run(ov + ["tempering.layout=chain", "tempering.scans_per_task=5"], mlflow_uri)
    _, tr_1 = run(ov + ["tempering.layout=chain"], mlflow_uri, cluster_factory(1))
    _, tr_3 = run(ov + ["tempering.layout=blocks", "tempering.n_blocks=3"], mlflow_uri, cluster_factory(3))
    assert_same_results(tr_sync, tr_1)
    assert_same_results(tr_sync, tr_3)
    assert sync["swap_accept_mean"] > 0 and "log_z_ss_variational" in sync and sync["n_levels_variational"] >= 2
    cut, tr_cut = run(ov, mlflow_uri)
    _drop_checkpoints_after(tr_cut, cut["run_id"], keep=4)
    from pgmflow.core.runner import execute

    execute(
        compose(ov + [f"resume={cut['run_id']}", f"tracking.uri={mlflow_uri}", "cluster.profile=synchronous"]),
        stream=io.StringIO(),
    )
    assert_same_results(tr_sync, tr_cut)
    assert_one_value_per_step(tr_cut.client, cut["run_id"])
