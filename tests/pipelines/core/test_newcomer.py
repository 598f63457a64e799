"""What a newcomer meets first (issue 38): the README's Python example as a script, strict JSON in every
results.json, svi.kappa=0.5, and the lines that say when the data overrides a setting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgmflow.core.tracking import finite_json
from tests.pipelines.helpers import run

REPO = Path(__file__).resolve().parents[3]


def _strict(text: str):
    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_finite_json_makes_nan_null_with_the_reason_beside_it():
    out = finite_json({"a": float("nan"), "b": 1.0, "c": [1.0, float("inf")], "d": {"e": float("-inf")}})
    assert out["a"] is None and out["a_note"] == "not a finite number (nan)" and out["b"] == 1.0
    assert out["c"] == [1.0, None] and out["d"] == {"e": None}
    assert out["nonfinite_fields"] == {"c[1]": "inf", "d.e": "-inf"}
    assert _strict(json.dumps(out, allow_nan=False)) == out


@pytest.mark.parametrize(
    "overrides",
    [
        ["pipeline=tempering"],
        ["pipeline=svi"],
        ["pipeline=svi", "svi.heldout_fraction=0"],
        ["pipeline=tesla"],
        ["pipeline=bounds"],
        ["pipeline=sparse_gp"],
        ["pipeline=network_mrf"],
    ],
    ids=lambda o: " ".join(o),
)
def test_every_results_json_is_strict_json(overrides, mlflow_uri):
    res, tr = run([*overrides, "debug=default", "progress=false"], mlflow_uri)
    parsed = _strict(tr.read_text("results.json"))
    assert parsed["objective"] == res["objective"]
    if "svi.heldout_fraction=0" in overrides:
        assert parsed["objective"] is None and parsed["heldout_perplexity"] is None
        assert "no held-out documents" in parsed["objective_note"]
        assert "objective" not in tr.client.get_run(tr.run_id).data.metrics  # nothing for a sweep to rank


def test_kappa_half_with_tau0_64_runs(mlflow_uri):
    res, _ = run(["pipeline=svi", "debug=default", "progress=false", "svi.kappa=0.5", "svi.tau0=64"], mlflow_uri)
    assert res["objective"] > 0


def test_settings_the_data_overrides_are_said(mlflow_uri, capsys):
    import io

    from pgmflow.core.runner import execute
    from tests.conftest import compose

    out = io.StringIO()
    execute(
        compose(
            [
                "pipeline=svi",
                "debug=default",
                "progress=false",
                "svi.batch_size=100000",
                "cluster.profile=synchronous",
                f"tracking.uri={mlflow_uri}",
            ]
        ),
        stream=out,
    )
    line = [ln for ln in out.getvalue().splitlines() if "svi.batch_size=100000" in ln]
    assert len(line) == 1 and "each step uses all" in line[0], out.getvalue()
    out = io.StringIO()
    execute(
        compose(
            [
                "pipeline=sparse_gp",
                "debug=default",
                "progress=false",
                "sparse_gp.chunk_size=1000000",
                "cluster.profile=synchronous",
                f"tracking.uri={mlflow_uri}",
            ]
        ),
        stream=out,
    )
    assert "sparse_gp.chunk_size=1000000 is more than the" in out.getvalue(), out.getvalue()


README_EXAMPLE = """import pgmflow

res = pgmflow.run("pipeline=sparse_gp", "gp_data=diabetes", "debug=default", "progress=false")
print("objective", res.objective)
"""


def _script(folder, text):
    folder.mkdir(exist_ok=True)
    (folder / "script.py").write_text(text)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "script.py"], cwd=folder, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_readme_example_as_a_script(tmp_path):
    """Without the guard: one line, exit 2, before anything starts (no store, no run). With it (as the README
    shows it): it finishes on the default local cluster."""
    r = _script(tmp_path / "new", README_EXAMPLE)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "script.py:3" in lines[0] and 'if __name__ == "__main__":' in lines[0], r.stderr
    assert not (tmp_path / "new" / "mlflow.db").exists()
    body = "".join("    " + ln + "\n" for ln in README_EXAMPLE.splitlines()[2:])
    r = _script(tmp_path / "new", f'import pgmflow\n\nif __name__ == "__main__":\n{body}')
    assert r.returncode == 0, r.stderr[-3000:]
    assert "objective " in r.stdout and float(r.stdout.split("objective ")[1].split()[0]) > 0
