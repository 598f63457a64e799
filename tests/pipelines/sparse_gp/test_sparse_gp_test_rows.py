"""Training on every row (``sparse_gp.test_fraction=0``) and scoring a separate file
(``gp_data.test_path``), and that file's bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pgmflow.core.errors import ConfigError
from pgmflow.sparse_gp.data import DIABETES
from tests.pipelines.helpers import run

BASE = [
    "pipeline=sparse_gp",
    "gp_data=diabetes",
    "sparse_gp.m=16",
    "sparse_gp.max_iter=30",
    "sparse_gp.figures=false",
    "progress=false",
]


def test_every_row_trains_and_a_test_file_is_scored(mlflow_uri, tmp_path):
    res, _ = run(BASE + ["sparse_gp.test_fraction=0"], mlflow_uri)
    assert res["train_rows"] == 442 and res["test_rows"] == 0 and math.isnan(res["test_rmse"])
    assert res["objective"] == -res["bound_per_row"] and "no held-out rows" in res["objective_name"]

    lines = DIABETES.read_text().splitlines()
    (tmp_path / "test.csv").write_text("\n".join(lines[:101]) + "\n")  # the header and 100 rows
    scored, _ = run(BASE + ["sparse_gp.test_fraction=0", f"gp_data.test_path={tmp_path / 'test.csv'}"], mlflow_uri)
    assert scored["train_rows"] == 442 and scored["test_rows"] == 100
    assert scored["bound"] == res["bound"]  # scoring a file changes nothing in the fit
    assert math.isfinite(scored["test_rmse"]) and scored["objective"] == scored["test_nlpd"]
    # the rows are scored as held-out rows are: the file's RMSE from the model's own predictions
    y = np.loadtxt(tmp_path / "test.csv", delimiter=",", skiprows=1)[:, -1]
    assert 0.5 * np.std(y) < scored["test_rmse"] < 1.2 * np.std(y)

    both, _ = run(BASE + [f"gp_data.test_path={tmp_path / 'test.csv'}"], mlflow_uri)  # held-out rows and the file
    assert both["test_rows"] == both["rows"] - both["train_rows"] + 100


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such file"),
        ("a,b\n1,2\n", "not the training data's"),
        ("age,sex,bmi,bp,s1,s2,s3,s4,s5,s6,target\n1,2,3,4,5,6,7,8,9,nan,1\n", "NaN"),
    ],
)
def test_a_bad_test_file_is_refused_in_one_line(mlflow_uri, tmp_path, content, message):
    path = tmp_path / "t.csv"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as err:
        run(BASE + [f"gp_data.test_path={path}"], mlflow_uri)
    assert err.value.message.startswith("gp_data.test_path=") and message in err.value.message
    assert "\n" not in err.value.message and "fix:" in err.value.message
