"""What an installed pgmflow provides: one import namespace (``pgmflow``, with the configs as package data)
and the ``hydra_plugins`` namespace, nothing else at the top level; users' own ``tasks``/``pipelines``
modules cannot shadow pgmflow's code, in the driver or in the workers."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from tests.conftest import REPO, compose

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _installed_name(folder: Path) -> str:
    """The import name a source folder is installed under (the package-dir mapping of pyproject.toml)."""
    rel = folder.relative_to(REPO)
    for name, src in sorted(PYPROJECT["tool"]["setuptools"]["package-dir"].items(), key=lambda kv: -len(kv[1])):
        if rel == Path(src) or Path(src) in rel.parents:
            return ".".join([name, *rel.relative_to(src).parts])
    return ".".join(rel.parts)


def test_every_source_package_is_installed():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = set()
    for top in ("pipelines", "tasks", "conf", "hydra_plugins"):
        for init in (REPO / top).rglob("__init__.py"):
            if "__pycache__" not in init.parts and "data" not in init.relative_to(REPO).parts:
                found.add(_installed_name(init.parent))
    assert found - listed == set(), (
        f"folders with an __init__.py that pyproject.toml does not install: {found - listed}"
    )
    assert {n.split(".")[0] for n in listed} == {"pgmflow", "hydra_plugins"}


def test_one_version():
    import pgmflow

    assert pgmflow.__version__ == PYPROJECT["project"]["version"]


def test_hydra_lists_pgmflows_plugins_from_the_editable_install(tmp_path):
    """``make install``'s strict editable mode is a link tree that Hydra's pkgutil scan walks: ``--info plugins``
    lists the launcher and the search-path plugin, and pgmflow registers nothing itself."""
    r = subprocess.run(
        [sys.executable, "-m", "pgmflow", "--info", "plugins"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    launchers = r.stdout.split("Launcher:")[1].split("Sweeper:")[0]
    assert "DaskLauncher" in launchers.split()
    assert "PgmflowWorkloadsSearchPath" in r.stdout.split("SearchPathPlugin:")[1].split()
    code = (
        "import pkgutil, importlib.util, hydra_plugins; "
        "print(sorted(m.name for m in pkgutil.iter_modules(list(hydra_plugins.__path__)) if 'pgmflow' in m.name)); "
        "print(importlib.util.find_spec('pgmflow').submodule_search_locations[0])"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    names, folder = r.stdout.split("\n")[:2]
    assert names == "['pgmflow_dask_launcher', 'pgmflow_workloads']"
    assert (
        Path(folder).is_dir() and (Path(folder) / "core" / "runner.py").resolve() == REPO / "pipelines/core/runner.py"
    )


def test_the_names_before_0_3_are_the_same_modules():
    """Models logged and configs recorded by pgmflow 0.2 name ``pgmflow.pipelines.<x>``: those names import the
    module of ``pgmflow.<x>`` itself (pickled classes stay the same classes), with one DeprecationWarning each."""
    code = (
        "import warnings, pickle; warnings.simplefilter('always'); "
        "import pgmflow.core.api as new\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import pgmflow.pipelines.core.api as old\n"
        "    from pgmflow.pipelines.sparse_gp.plan import Start\n"
        "import pgmflow.sparse_gp.plan as p\n"
        "print(old is new, Start is p.Start, new.__spec__.name, old.__name__)\n"
        "print(sorted({str(x.message).split()[0] for x in w}))\n"
        "print(pickle.loads(pickle.dumps(p.Start)) is p.Start)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[0] == "True True pgmflow.core.api pgmflow.core.api"
    assert lines[1] == str(
        sorted(
            [
                "pgmflow.pipelines",
                "pgmflow.pipelines.core",
                "pgmflow.pipelines.core.api",
                "pgmflow.pipelines.sparse_gp",
                "pgmflow.pipelines.sparse_gp.plan",
            ]
        )
    )
    assert lines[2] == "True"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning" not in proc.stderr.lower(), proc.stderr  # a quiet build: no packaging warnings
    (whl,) = out.glob("pgmflow-*.whl")
    return whl


def test_the_wheel_holds_one_namespace_and_the_configs(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"pgmflow", "hydra_plugins"}
    for f in (
        "pgmflow/conf/config.yaml",
        "pgmflow/conf/pipeline/sparse_gp.yaml",
        "pgmflow/tasks/gp/data/diabetes.csv",
        "pgmflow/__init__.py",
        "pgmflow/core/api.py",
        "hydra_plugins/pgmflow_dask_launcher/__init__.py",
    ):
        assert f in names, f


@pytest.mark.slow
def test_installed_wheel_runs_and_provides_no_tasks_or_pipelines(wheel, tmp_path):
    """pip install (not editable) of the wheel: ``import tasks`` and ``import pipelines`` fail, ``import pgmflow``
    is the installed copy, and ``python -m pgmflow`` runs a pipeline from it."""
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("PGMFLOW_CONF_DIR", None)

    def py(*args, **kw):
        return subprocess.run(
            [sys.executable, *args], cwd=work, env=env, capture_output=True, text=True, timeout=300, **kw
        )

    for name in ("tasks", "pipelines", "pgmflow_conf"):
        proc = py("-c", f"import {name}")
        assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr, (name, proc.stderr)
    proc = py(
        "-c",
        "import pgmflow, pgmflow.conf, pgmflow.core.config as c; print(pgmflow.__file__); print(c.conf_dir())",
    )
    assert proc.returncode == 0, proc.stderr
    module_file, conf = proc.stdout.split()
    assert module_file.startswith(str(target)) and conf.startswith(str(target))
    proc = py(
        "-m",
        "pgmflow",
        "pipeline=sparse_gp",
        "debug=default",
        "cluster.profile=synchronous",
        "progress=false",
        "tracking.uri=sqlite:///mlflow.db",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pgmflow: finished." in proc.stdout


POISON = "open({marker!r}, 'a').write(__name__ + '\\n')\nraise ImportError('the user\\'s own {name} was imported')\n"


@pytest.mark.slow
def test_users_tasks_and_pipelines_modules_change_nothing(tmp_path, mlflow_uri):
    """A ``tasks.py`` and a ``pipelines/`` package in the working directory (which pgmflow puts on its local
    workers' PYTHONPATH, for users' allow-listed modules) are never imported: a run on a LocalCluster of 2
    workers from that directory gives the bits of a synchronous run from elsewhere."""
    from tests.pipelines.core.test_bit_reproducibility import artifacts
    from tests.pipelines.helpers import run

    args = ["pipeline=sparse_gp", "debug=default", "sparse_gp.in_process=false", "progress=false"]
    _, reference = run(args, mlflow_uri)

    work = tmp_path / "project"
    (work / "pipelines").mkdir(parents=True)
    marker = tmp_path / "imported.txt"
    (work / "tasks.py").write_text(POISON.format(marker=str(marker), name="tasks.py"))
    (work / "pipelines" / "__init__.py").write_text(POISON.format(marker=str(marker), name="pipelines/"))
    exe = Path(sys.executable).with_name("pgmflow")
    proc = subprocess.run(
        [str(exe), *args, "cluster.profile=local", "cluster.n_workers=2", f"tracking.uri={mlflow_uri}"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "on local (2 workers)" in proc.stdout
    assert not marker.exists(), marker.read_text()

    from pgmflow.core.tracking import Tracker

    tr = Tracker(mlflow_uri, compose(args)["tracking"]["experiment"])
    tr.run_id = proc.stdout.split("MLflow run ")[1].split()[0]
    assert artifacts(tr) == artifacts(reference)
