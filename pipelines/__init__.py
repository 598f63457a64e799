"""pgmflow orchestration: ``pgmflow.pipelines.core`` (CLI, runner, registry, preflight, cluster, tracking,
graph executor, artifacts, sweeps) and one package per workload beside it, each declaring itself
with a ``WORKLOAD`` value (see docs/architecture.md). The core knows no workload by name."""

from pgmflow import __version__  # noqa: F401  (one version: pgmflow's, which pyproject.toml repeats; tests/test_packaging.py)
