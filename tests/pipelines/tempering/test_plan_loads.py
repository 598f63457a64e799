"""Each input file of a tempering or bounds run is read once per run: by the validation, which builds
the plan's targets and models; ``run(ctx, plan)`` works from the plan. Real runs (Hydra composition,
the synchronous scheduler, a SQLite MLflow store); only the file readers are wrapped, to count."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from tests.pipelines.helpers import run


def _counting(monkeypatch, module, name: str, path: Path) -> list:
    """Wrap ``module.name`` (a reader taking the file first) to record each read of ``path``."""
    reads, real = [], getattr(module, name)

    def wrapper(file, *args, **kwargs):
        if Path(str(file)).resolve() == path.resolve():
            reads.append(str(file))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return reads


def test_an_mrf_file_is_read_once_per_bounds_run(tmp_path, mlflow_uri, monkeypatch):
    n = 8
    J = np.zeros((n, n))
    for i in range(n):
        J[i, (i + 1) % n] = J[(i + 1) % n, i] = 0.6
        J[i, (i + 3) % n] = J[(i + 3) % n, i] = -0.4
    path = tmp_path / "J.npz"
    np.savez(path, J=J)  # no rho in the file: TRW's rho from spanning trees, drawn once too
    reads = _counting(monkeypatch, np, "load", path)
    res, tr = run(
        [
            "pipeline=bounds",
            "model=mrf",
            f"model.path={path}",
            "variational.marginals=true",
            "variational.n_trees=5",
            "progress=false",
        ],
        mlflow_uri,
    )
    assert tr.client.get_run(tr.run_id).info.status == "FINISHED"
    assert res["log_z_mf"] <= res["log_z_exact"] + 1e-9 <= res["log_z_trw"] + 2e-9, res
    assert len(reads) == 1, reads


def test_the_data_of_a_bayesian_target_is_read_once_per_tempering_run(tmp_path, mlflow_uri, monkeypatch):
    from pgmflow.tempering import bayes

    path = tmp_path / "diabetes.csv"
    shutil.copy(bayes._shipped_diabetes(), path)
    reads = _counting(monkeypatch, np, "loadtxt", path)
    parsed = []
    real_read = bayes._read
    monkeypatch.setattr(bayes, "_read", lambda dcfg: parsed.append(dcfg) or real_read(dcfg))
    # two targets farmed at once (chain_overrides): they share the one read of the data
    res, tr = run(
        [
            "model=bayes",
            f"model.data.path={path}",
            "tempering.n_replicas=4",
            "tempering.n_rounds=2",
            "tempering.n_chains=1",
            "tempering.sweeps_per_scan=1",
            "tempering.n_leapfrog=3",
            "tempering.figures=false",
            "tempering.checkpoint_every=1",
            "progress=false",
            "tempering.chain_overrides=[{likelihood_options:{noise_std:0.7}},{likelihood_options:{noise_std:0.9}}]",
        ],
        mlflow_uri,
    )
    assert tr.client.get_run(tr.run_id).info.status == "FINISHED"
    assert res["n_targets"] == 2 and res["log_z_exact_target0"] != res["log_z_exact_target1"], res
    assert len(parsed) == 1, parsed
    assert len(reads) == 1, reads
