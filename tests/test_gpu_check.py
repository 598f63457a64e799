"""``make gpu-check``'s staleness check (``.ci/gpu_check.py``): the wheel carried to a GPU machine must hold exactly
the checkout's files, under pyproject's package-dir mapping (``pipelines/`` is ``pgmflow``, ``tasks/`` is
``pgmflow.tasks``, ``conf/`` is ``pgmflow.conf``). When the layout changed (efcd1a6) this check kept the old
mapping and called every wheel stale; these tests pin it to the layout."""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / ".ci" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def checkout_files():
    out = []
    for folder in ("pipelines", "tasks", "conf", "hydra_plugins"):
        for f in sorted((REPO / folder).rglob("*.py")) + sorted((REPO / folder).rglob("*.yaml")):
            if "__pycache__" not in f.parts:
                out.append(str(f.relative_to(REPO)))
    return out


def wheel(path: Path, names: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in names.items():
            z.writestr(name, data)
        z.writestr("pgmflow-0.0.0.dist-info/METADATA", "Name: pgmflow\n")
    return path


def test_the_wheel_names_follow_the_package_dir_mapping():
    g = gpu_check()
    assert g._wheel_name("pipelines/core/cli.py") == "pgmflow/core/cli.py"
    assert g._wheel_name("tasks/tempering/mrf_cuda.py") == "pgmflow/tasks/tempering/mrf_cuda.py"
    assert g._wheel_name("conf/model/mrf.yaml") == "pgmflow/conf/model/mrf.yaml"
    assert g._wheel_name("hydra_plugins/pgmflow_workloads/__init__.py") == "hydra_plugins/pgmflow_workloads/__init__.py"
    for rel in checkout_files():
        assert g._source_of(g._wheel_name(rel)) == rel


def test_a_current_wheel_is_current_and_a_changed_or_missing_file_is_named(tmp_path):
    g = gpu_check()
    files = {g._wheel_name(rel): (REPO / rel).read_bytes() for rel in checkout_files()}
    assert g.wheel_differences(wheel(tmp_path / "same.whl", files)) == []
    changed = dict(files)
    changed["pgmflow/tasks/tempering/mrf_cuda.py"] += b"# edited\n"
    del changed["pgmflow/core/cli.py"]
    diff = g.wheel_differences(wheel(tmp_path / "stale.whl", changed))
    assert sorted(diff) == ["pipelines/core/cli.py", "tasks/tempering/mrf_cuda.py"]


def test_the_gpu_info_summary_warns_when_the_image_lacks_pandas():
    """The wheelhouse leaves pandas to the image, and mlflow.pyfunc (the svi and sparse_gp models) imports it: the
    gpu-info step says so up front rather than leaving two pipeline failures to be read backwards."""
    import json

    g = gpu_check()
    probe = {"gpu": {}, "line": "NVIDIA H200", "python": "3.12.1", "versions": {"numpy": "2.4.6"}}
    warning = g.no_pandas("some pip noise\n" + json.dumps(probe))
    assert "NO PANDAS" in warning and "svi and sparse_gp" in warning
    probe["versions"]["pandas"] = "2.3.3"
    assert g.no_pandas(json.dumps(probe)) == ""
    assert g.no_pandas("Traceback: the probe failed") == ""  # the step's own failure says what happened
