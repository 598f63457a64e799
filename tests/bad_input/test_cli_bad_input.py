"""Bad overrides and tempering configs on the ``pgmflow`` command line: exit code 2, one line that
names the field, the value and the fix, no traceback, nothing started, no MLflow run left RUNNING.
(Moved from tests/pipelines/core/test_cli.py; the cluster and GPU cases moved to test_cluster_bad_input.py
and test_config_bad_input.py.)"""

from __future__ import annotations

import pytest

from tests.bad_input.helpers import assert_refused, pgmflow

BAD = [
    (["model.L=1"], "model.L=1"),
    (["model.L=7"], "model.L=7"),
    (["model.T=-1.0"], "model.T=-1.0"),
    (["model.T=0"], "model.T=0"),
    (["tempering.ladder=[0,0.5,0.4,1]"], "tempering.ladder"),
    (["tempering.ladder=[0.1,0.5,1]"], "tempering.ladder"),
    (["tempering.n_replicas=1"], "tempering.n_replicas=1"),
    (["tempering.explorer=hmc"], "tempering.explorer='hmc'"),
    (["tempering.swap=sideways"], "tempering.swap='sideways'"),
    (["model.couplings=random"], "model.couplings='random'"),
    (["model=custom", "model.log_density=tests.pipelines.densities:nope"], "model.log_density"),
    (
        ["model=custom", "model.log_density=pgmflow.tasks.tempering.examples:returns_nan", "tempering.explorer=rwm"],
        "model.log_density",
    ),
    (["seed=-4"], "seed=-4"),
    (["resume=0123456789abcdef"], "resume"),
    (["model=potts"], "model='potts'"),
    (["tempering.n_replica=8"], "tempering.n_replica"),
    (["model.LL=8"], "model.LL"),
]


@pytest.mark.parametrize("args,field", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exit_2_one_line(tmp_path, args, field):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = pgmflow(args + [f"tracking.uri={uri}", "progress=false"], tmp_path)
    assert_refused(r, [field], tmp_path, uri, "tempering")
