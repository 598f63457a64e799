"""pgmflow orchestration: ``pgmflow.pipelines.core`` (CLI, runner, registry, preflight, cluster, tracking,
graph executor, artifacts, sweeps) and one package per workload beside it, each declaring itself
with a ``WORKLOAD`` value (see docs/architecture.md). The core knows no workload by name."""

__version__ = "0.1.0"
