"""The in-process ``pgmflow`` of helpers.py answers as the real command in a new process does: the
same exit code and the same stderr, for a case refused at each stage (Hydra's composition of the
overrides, preflight, the cluster file, a data file). The whole catalogue runs through subprocesses
with PGMFLOW_BAD_INPUT_SUBPROCESS=1."""

from __future__ import annotations

import numpy as np
import pytest

from tests.bad_input.helpers import pgmflow_in_process, pgmflow_subprocess


def _missing_certificate(p):
    (p / "c.yaml").write_text("profiles:\n  t:\n    type: local\n    tls: {ca_file: ca.pem, cert: c.pem, key: k.pem}\n")
    return ["cluster.file=c.yaml", "cluster.profile=t"]


def _empty_mrf(p):
    (p / "m.npz").write_bytes(b"")
    return ["pipeline=bounds", "model=mrf", "model.path=m.npz"]


def _nan_samples(p):
    X = np.ones((3, 2, 4))
    X[1, 1, 2] = np.nan
    np.savez(p / "d.npz", X=X)
    return ["pipeline=tesla", "network=npz", "network.path=d.npz"]


CASES = {
    "composition": lambda p: ["tempering.n_replica=8"],
    "preflight": lambda p: ["+foo=1"],
    "cluster_file": _missing_certificate,
    "data_file": _empty_mrf,
    "data_values": _nan_samples,
}


@pytest.mark.parametrize("case", list(CASES))
def test_in_process_matches_subprocess(tmp_path, case):
    args = [*CASES[case](tmp_path), f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "progress=false"]
    a = pgmflow_in_process(args, tmp_path)
    b = pgmflow_subprocess(args, tmp_path)
    assert (a.returncode, a.stderr, a.stdout) == (b.returncode, b.stderr, b.stdout)
    assert a.returncode == 2 and a.stderr.startswith("pgmflow: error: ")


def test_in_process_leaves_no_state_behind(tmp_path, monkeypatch):
    """A case that reads a data file, then the same relative path with other contents: the second
    answer is about the second file (the per-process cache of resolved data is cleared), and the
    working directory, argv and environment are what they were."""
    import os
    import sys

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    X = np.where(np.random.default_rng(0).random((1, 4, 5)) < 0.5, -1, 1)
    np.savez(tmp_path / "a" / "d.npz", X=X)  # a single time point: refused for lambda2 > 0 after reading
    X2 = np.ones((3, 2, 5))
    X2[0, 0, 0] = 2
    np.savez(tmp_path / "b" / "d.npz", X=X2)  # the same name, another problem
    before = (os.getcwd(), list(sys.argv), dict(os.environ))
    args = ["pipeline=tesla", "network=npz", "network.path=d.npz", "progress=false"]
    ra = pgmflow_in_process([*args, f"tracking.uri=sqlite:///{tmp_path / 'a' / 'mlflow.db'}"], tmp_path / "a")
    rb = pgmflow_in_process([*args, f"tracking.uri=sqlite:///{tmp_path / 'b' / 'mlflow.db'}"], tmp_path / "b")
    assert "T=1" in ra.stderr, ra.stderr
    assert "value 2 at X[0, 0, 0]" in rb.stderr, rb.stderr
    assert (os.getcwd(), list(sys.argv), dict(os.environ)) == before
