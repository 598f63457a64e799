"""A command-line override cannot make pgmflow import (and so run) arbitrary code: callables named in
a config are imported only from the modules on the allow-list, ``tasks`` plus the prefixes in the
environment variable ``PGMFLOW_ALLOWED_MODULES`` (never from the config itself)."""

from __future__ import annotations

import pytest

from tests.pipelines.core.test_cli import pgmflow


def _evil_module(tmp_path):
    marker = tmp_path / "imported.txt"
    (tmp_path / "evil_mod.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n\ndef logp(x):\n    return -(x ** 2).sum(axis=1)\n"
    )
    return marker


@pytest.mark.parametrize("spec", ["evil_mod:logp", "os:system", "subprocess.run"])
def test_a_module_off_the_allow_list_is_refused_before_import(tmp_path, spec):
    marker = _evil_module(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = pgmflow(
        [
            "model=custom",
            f"model.log_density={spec}",
            "model.grad_log_density=",
            "tempering.explorer=rwm",
            f"tracking.uri={uri}",
            "progress=false",
        ],
        tmp_path,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "allow-list" in lines[0] and "PGMFLOW_ALLOWED_MODULES" in lines[0], r.stderr
    assert not marker.exists(), "the module was imported (its code ran) before being refused"
    assert "tempering run" not in r.stdout


@pytest.mark.slow
def test_only_the_environment_widens_the_allow_list(tmp_path, monkeypatch):
    marker = _evil_module(tmp_path)  # importable: pgmflow runs in tmp_path, which is on sys.path
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [
        "model=custom",
        "model.log_density=evil_mod:logp",
        "model.grad_log_density=",
        "tempering.explorer=rwm",
        "tempering.n_replicas=4",
        "tempering.n_rounds=2",
        "tempering.figures=false",
        f"tracking.uri={uri}",
        "progress=false",
        "cluster.profile=synchronous",
    ]
    # a config value cannot widen it (there is no such setting; an added key changes nothing)
    r = pgmflow([*args, "+allowed_modules=evil_mod", f"+{'PGMFLOW_ALLOWED_MODULES'}=evil_mod"], tmp_path, timeout=120)
    assert r.returncode == 2 and "allow-list" in r.stderr, r.stderr[-2000:]
    assert not marker.exists()
    # the environment of the shell that runs pgmflow can
    monkeypatch.setenv("PGMFLOW_ALLOWED_MODULES", "tests,evil_mod")
    r = pgmflow(args, tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert marker.exists()
