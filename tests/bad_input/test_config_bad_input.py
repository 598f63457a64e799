"""Bad top-level config: unknown keys (``+foo=1`` used to be accepted and ignored), wrong types,
malformed overrides, and a GPU asked for on a machine without one. Each: exit code 2, one line
naming the key, the value and the fix, no traceback, nothing started. With ``verbose=true`` the
same refusal shows the traceback."""

from __future__ import annotations

import importlib.util

import pytest

from tests.bad_input.helpers import assert_refused, pgmflow, run_statuses
from tests.conftest import gpu_available


def _no_gpu(args, needles):
    def case():
        if gpu_available():
            pytest.skip("a GPU with CuPy is present: backend=cupy is valid here")
        return args, needles

    return case


def _no_dask_cuda():
    if importlib.util.find_spec("dask_cuda") is not None:
        pytest.skip("dask-cuda is installed: cluster.profile=local_cuda is valid here")
    return ["cluster.profile=local_cuda"], ["cluster.profile='local_cuda'", "dask-cuda", "pgmflow[gpu]"]


CASES = {
    # unknown keys
    "unknown_top_level_key": lambda: (["+foo=1"], ["foo=1", "unknown top-level key", "pgmflow --cfg job"]),
    "misspelt_top_level_key": lambda: (["+sed=3"], ["sed=3", "did you mean seed?"]),
    "allow_list_from_the_config": lambda: (
        ["+allowed_modules=evil_mod"],
        ["allowed_modules='evil_mod'", "never read from the config", "export PGMFLOW_ALLOWED_MODULES="],
    ),
    "unknown_tracking_key": lambda: (
        ["+tracking.url=http://127.0.0.1:5000"],
        ["tracking.url='http://127.0.0.1:5000'", "did you mean tracking.uri?"],
    ),
    "override_of_a_key_that_does_not_exist": lambda: (
        ["tempering.n_round=3"],
        ["tempering.n_round", "did you mean tempering.n_rounds?"],
    ),
    # wrong types and values at the top level
    "seed_not_a_number": lambda: (["seed=abc"], ["seed='abc'", "must be an integer"]),
    "seed_fractional": lambda: (["seed=1.5"], ["seed=1.5", "must be an integer"]),
    "progress_not_a_bool": lambda: (["progress=maybe"], ["progress='maybe'", "must be true or false"]),
    "verbose_not_a_bool": lambda: (["verbose=2"], ["verbose=2", "must be true or false"]),
    "bounds_not_a_bool": lambda: (["bounds=2"], ["bounds=2", "must be true or false"]),
    "backend_unknown": lambda: (["backend=tpu"], ["backend='tpu'", "expected one of auto, numpy, cupy"]),
    "tracking_uri_not_a_string": lambda: (["tracking.uri=5"], ["tracking.uri=5", "must be a string or null"]),
    "model_field_wrong_type": lambda: (["model.L=abc"], ["model.L='abc'", "must be an integer"]),
    # malformed command lines
    "unknown_pipeline": lambda: (
        ["pipeline=nope"],
        ["pipeline='nope'", "unknown option of config group 'pipeline'", "use one of bounds, "],
    ),
    "malformed_override": lambda: (["model.L=[1,2"], ["model.L=[1,2", "check the override syntax"]),
    # a GPU asked for without one
    "backend_cupy_without_gpu": _no_gpu(["backend=cupy"], ["backend='cupy'", "no usable GPU", "backend=numpy"]),
    "gpu_cluster_without_dask_cuda": _no_dask_cuda,
}


@pytest.mark.parametrize("case", list(CASES))
def test_config_bad_input(tmp_path, case):
    args, needles = CASES[case]()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    extra = [f"tracking.uri={uri}", "progress=false"]  # unless the case sets them itself
    extra = [e for e in extra if not any(a.startswith(e.split("=")[0] + "=") for a in args)]
    r = pgmflow([*args, *extra], tmp_path)
    assert_refused(r, needles, tmp_path, uri, "tempering")


def test_verbose_shows_the_traceback(tmp_path):
    """The same refusal with verbose=true: the traceback (ending in the ConfigError line), no run."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = pgmflow(["model.L=7", "verbose=true", f"tracking.uri={uri}", "progress=false"], tmp_path)
    assert r.returncode != 0
    assert "Traceback" in r.stderr and "ConfigError" in r.stderr, r.stderr[-2000:]
    assert "model.L=7: must be even" in r.stderr
    assert "tempering run " not in r.stdout
    assert all(status != "RUNNING" for status, _ in run_statuses(tmp_path, uri))
