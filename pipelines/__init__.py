"""pgmflow orchestration: CLI, preflight checks, cluster, tracking and one graph builder per workload."""

__version__ = "0.1.0"
