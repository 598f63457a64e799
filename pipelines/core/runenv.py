"""A run's provenance: the source tree's commit, the library versions, the BLAS libraries and the CPU (tags that
``pgmflow reproduce`` compares). Apart from :mod:`pgmflow.core.tracking` so that module stays about MLflow."""

from __future__ import annotations

import contextlib
import platform
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def git_info() -> dict:
    """Commit and dirty flag of the pgmflow source tree (``unknown`` outside a git checkout)."""

    def git(*args):
        return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"git.commit": "unknown", "git.dirty": "unknown"}
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return {"git.commit": head.stdout.strip(), "git.dirty": str(bool(dirty.stdout.strip())).lower()}
    except (OSError, subprocess.SubprocessError):
        return {"git.commit": "unknown", "git.dirty": "unknown"}


def versions() -> dict:
    """The software and machine a run's bits depend on (tags; ``pgmflow reproduce`` compares them):
    library versions, the BLAS libraries in use and the CPU model."""
    import importlib
    import importlib.metadata
    import sys

    import dask
    import numpy

    from pgmflow import __version__

    out = {
        "version.pgmflow": __version__,
        "version.numpy": numpy.__version__,
        "version.dask": dask.__version__,
        # from its metadata (the same string): a run in the driver (pgmflow.core.smallwork) never imports it
        "version.distributed": importlib.metadata.version("distributed"),
        "version.python": platform.python_version(),
    }
    for name, dist in (
        ("scipy", "scipy"),
        ("numba", "numba"),
        ("mlflow", "mlflow"),
        ("hydra", "hydra-core"),
        ("cupy", ""),
    ):
        if name == "cupy" and "cupy" not in sys.modules:
            continue  # never imported by this run: not in use
        with contextlib.suppress(Exception):
            # a module this process has not imported is read from its distribution's metadata (the same string;
            # importing numba only for its version cost a debug run 0.3 s: issue 38)
            out[f"version.{name}"] = (
                sys.modules[name].__version__ if name in sys.modules or not dist else importlib.metadata.version(dist)
            )
    with contextlib.suppress(Exception):
        from pgmflow.tasks import threads

        out["env.blas"] = threads.blas_summary()[:500]
    out["env.cpu"] = cpu_model()
    out["env.machine"] = f"{platform.system()} {platform.machine()}"
    return out


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else ``platform.processor()``)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"
