#!/usr/bin/env python3
"""make gpu-wheelhouse: the wheels that the GPU image lacks for pgmflow, in .whl/ (< 64 MiB).

Run on a CPU machine with PyPI access (any Python >= 3.10 with pip). The GPU machines that may be
lent run a fixed image -- Python 3.12, CUDA 13, driver 580, with numpy, scipy, numba, cupy-cuda13x,
pytest, torch and gpytorch, and no network -- so everything else pgmflow needs is brought along as
wheels for CPython 3.12 on manylinux x86_64 (at most 64 MiB is carried in one go):

* pgmflow's own wheel (built from this checkout);
* its dependencies from pyproject.toml, with ``mlflow`` replaced by ``mlflow-skinny`` plus what
  MLflow's SQLite store needs (``sqlalchemy``, ``alembic``): the full ``mlflow`` adds its web UI,
  pandas and pyarrow, some 100 MB. pgmflow imports ``mlflow.tracking.MlflowClient``,
  ``mlflow.entities`` and ``mlflow.pyfunc`` (the svi and sparse_gp models), which mlflow-skinny has;
  ``mlflow.pyfunc`` imports pandas, left to the image (about 12 MiB, past the limit; the H200 image has it,
  and gpu-check's gpu-info step says so when it does not);
* pytest-timeout (the tests' markers), and setuptools and wheel (pyproject's build backend: when the wheel
  is older than the checkout, ``make gpu-check`` builds the checkout there, offline).

The resolution is pip's own, for the target (``--python-version 3.12 --platform manylinux...``);
what the image already has (numpy, scipy, numba, llvmlite, CuPy, torch) is resolved but not
downloaded. A dependency published only as a source distribution (antlr4-python3-runtime, hydra's
parser) is built into a pure-Python wheel here. Written beside the wheels: ``requirements.txt``
(every wheel pinned: what ``make gpu-check`` installs with ``--no-index``), and
``image-provided.txt`` (what was left to the image, with the versions the resolution chose).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIMIT_MIB = 64.0
PYTHON_VERSION = "3.12"
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
# In the GPU image already (with their own dependencies); resolved for compatibility, not downloaded.
IMAGE_PROVIDES = re.compile(
    r"^(numpy|scipy|numba|llvmlite|cupy(-cuda\d+x)?|fastrlock|torch|triton|gpytorch|"
    r"linear-operator|nvidia-.*|cuda-.*)$"
)
# mlflow -> mlflow-skinny (same version range) + the SQLite store's needs, as mlflow itself pins them
MLFLOW_STORE = ["sqlalchemy>=1.4.0,<3", "alembic<2,!=1.10.0"]
EXTRA = ["pytest-timeout>=2.3", "setuptools>=77", "wheel"]  # the markers; building the checkout offline (gpu-check)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_dependencies() -> list[str]:
    text = (REPO / "pyproject.toml").read_text()
    try:
        import tomllib  # noqa: PLC0415  (Python >= 3.11)

        return list(tomllib.loads(text)["project"]["dependencies"])
    except ImportError:
        block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", text, flags=re.S | re.M).group(1)
        return re.findall(r"\"([^\"]+)\"", block)


def requirements() -> list[str]:
    out = []
    for req in project_dependencies():
        name = re.match(r"[A-Za-z0-9_.\-]+", req).group(0)
        if norm(name) == "mlflow":
            out.append("mlflow-skinny" + req[len(name) :])
            out += MLFLOW_STORE
        else:
            out.append(req)
    return out + EXTRA


def pip(*args: str, capture: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.stderr.write(res.stdout[-4000:] + res.stderr[-4000:])
        raise SystemExit(f"gpu-wheelhouse: failed: {' '.join(cmd[:6])} ... (exit {res.returncode})")
    return res


def target_flags() -> list[str]:
    flags = [
        "--only-binary=:all:",
        "--python-version",
        PYTHON_VERSION,
        "--implementation",
        "cp",
        "--abi",
        "cp" + PYTHON_VERSION.replace(".", ""),
    ]  # (abi3 and none wheels are accepted too)
    for p in PLATFORMS:
        flags += ["--platform", p]
    return flags


def resolve(reqs_file: Path, tmp: Path, extra: list[str], target: bool) -> list[dict]:
    report = tmp / ("target.json" if target else "native.json")
    args = [
        "install",
        "--quiet",
        "--dry-run",
        "--ignore-installed",
        "--report",
        str(report),
        "-r",
        str(reqs_file),
        *extra,
    ]
    if target:
        args += [*target_flags(), "--target", str(tmp / "never-written")]
    pip(*args)
    return json.loads(report.read_text())["install"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dest", type=Path, default=REPO / ".whl", help="the folder (default .whl/, git-ignored)")
    ap.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    a = ap.parse_args()
    dest = a.dest.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    for old in [*dest.glob("*.whl"), dest / "requirements.txt", dest / "image-provided.txt"]:
        old.unlink(missing_ok=True)

    with tempfile.TemporaryDirectory(prefix="pgmflow-wheelhouse-") as t:
        tmp = Path(t)
        reqs = requirements()
        reqs_file = tmp / "requirements.in"
        reqs_file.write_text("\n".join(reqs) + "\n")
        print(
            f"gpu-wheelhouse: resolving pgmflow's dependencies for CPython {PYTHON_VERSION} manylinux x86_64: "
            + ", ".join(reqs),
            flush=True,
        )

        # 1. packages published only as sources (no wheel at all): build pure-Python wheels of them
        built = []
        for item in resolve(reqs_file, tmp, [], target=False):
            url = item["download_info"]["url"]
            if not url.endswith(".whl"):
                name, version = item["metadata"]["name"], item["metadata"]["version"]
                pip("wheel", "--quiet", "--no-deps", "-w", str(dest), f"{name}=={version}")
                wheel = sorted(dest.glob(f"{re.sub(r'[-.]', '_', name)}-{version}-*.whl"), key=lambda p: p.name)
                if not wheel or not wheel[-1].name.endswith("-none-any.whl"):
                    raise SystemExit(
                        f"gpu-wheelhouse: {name} {version} has no wheel on PyPI and does not build "
                        "into a pure-Python one"
                    )
                built.append(wheel[-1].name)

        # 2. the resolution for the target, with those wheels available
        items = resolve(reqs_file, tmp, ["--find-links", str(dest)], target=True)
        keep, image = [], []
        for item in items:
            name, version = item["metadata"]["name"], item["metadata"]["version"]
            (image if IMAGE_PROVIDES.match(norm(name)) else keep).append((name, version))

        # 3. download what the image lacks (the ones built in step 1 are there already)
        have = {norm(p.name.split("-")[0]) for p in dest.glob("*.whl")}
        wanted = [f"{n}=={v}" for n, v in keep if norm(n) not in have]
        if wanted:
            pip("download", "--quiet", "--no-deps", "-d", str(dest), *target_flags(), *wanted)

    # 4. pgmflow itself (setuptools builds in the tree: remove what it leaves there that was not there)
    before = {p.name for p in REPO.iterdir()}
    pip("wheel", "--quiet", "--no-deps", "-w", str(dest), str(REPO))
    for left_over in [REPO / "build", *REPO.glob("*.egg-info")]:
        if left_over.name not in before and left_over.is_dir():
            shutil.rmtree(left_over)
    (dest / "requirements.txt").write_text(
        "# what the GPU image lacks for pgmflow; install: pip install --no-index --find-links .whl -r this file,\n"
        "# then pip install --no-index --no-deps .whl/pgmflow-*.whl (pgmflow names mlflow; mlflow-skinny stands in)\n"
        + "".join(f"{n}=={v}\n" for n, v in sorted(keep, key=lambda x: norm(x[0])))
    )
    (dest / "image-provided.txt").write_text(
        "# resolved for the target but not downloaded: the GPU image has these\n"
        + "".join(f"{n}=={v}\n" for n, v in sorted(image, key=lambda x: norm(x[0])))
    )

    wheels = sorted(dest.glob("*.whl"), key=lambda p: -p.stat().st_size)
    missing = [n for n, _ in keep if norm(n) not in {norm(p.name.split("-")[0]) for p in wheels}]
    if missing:
        raise SystemExit(f"gpu-wheelhouse: no wheel downloaded for {', '.join(missing)}")
    total = sum(p.stat().st_size for p in dest.iterdir() if p.is_file())
    mib = total / 2**20
    largest = ", ".join(f"{p.name.split('-')[0]} {p.stat().st_size / 2**20:.1f}" for p in wheels[:6])
    print(
        f"gpu-wheelhouse: {len(wheels)} wheels ({len(built)} built from sources: {', '.join(built) or 'none'}); "
        f"left to the image: {', '.join(f'{n} {v}' for n, v in image)}"
    )
    print(f"gpu-wheelhouse: largest (MiB): {largest}")
    try:
        shown = dest.relative_to(Path.cwd())
    except ValueError:
        shown = dest
    print(f"gpu-wheelhouse: {shown}/ is {mib:.1f} MiB (limit {a.limit_mib:.0f} MiB)")
    if mib > a.limit_mib:
        print(
            f"gpu-wheelhouse: {shown}/ is over the {a.limit_mib:.0f} MiB that can be carried to the GPU machine",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
