"""Small work runs in this process: the rule that decides when starting local workers cannot pay.

A local cluster costs 1-2 s to start (two worker processes that import NumPy, Dask and the kernels)
and a round trip per task; a debug-size run does well under a second of work. Each workload states
a rough single-core estimate of its work in seconds (``Workload.work``: ``"module:function"`` taking
the plan; docs/clusters.md lists the per-workload formulas). With ``cluster.in_process=auto`` (the
default) a run on a ``local`` profile whose estimate is at most :data:`MAX_SECONDS` runs on Dask's
synchronous scheduler in this process instead, and says so in one line. The bits are the same either
way: every task is keyed by its identity, never by where it runs (docs/reproducibility.md).

The rule never applies to a scheduler someone else started (``address``, SLURM, PBS, Kubernetes: the
user chose it), to a sweep job or a study's stage (they share a cluster already), or with
``cluster.in_process=false``. The test suite sets ``PGMFLOW_IN_PROCESS=false`` (the default of the key)
because its tests are about the workers.
"""

from __future__ import annotations

from pgmflow.core.errors import ConfigError

# at most this many estimated single-core seconds run in this process: starting two local workers costs
# about 1-2 s on the 2-core machines measured (benchmarks/startup.py), so work under a second never gains
MAX_SECONDS = 1.0
MODES = ("auto", "false")


def mode(ccfg: dict) -> str:
    """``cluster.in_process`` as ``"auto"`` or ``"false"`` (the key may come as a bool or, from the
    ``PGMFLOW_IN_PROCESS`` environment default, as a string)."""
    v = ccfg.get("in_process", "auto")
    if v is None:
        return "auto"
    s = str(v).strip().lower() if not isinstance(v, bool) else ("true" if v else "false")
    if s not in MODES:
        raise ConfigError(
            "cluster.in_process",
            v,
            "must be auto (small work runs in this process on a local profile) or false (always start the workers)",
            "set cluster.in_process=auto or cluster.in_process=false (cluster.profile=synchronous: always in-process)",
        )
    return s


def estimate(cfg: dict, plan) -> float | None:
    """The workload's estimate of its work in single-core seconds, or None when it gives none."""
    from pgmflow.core import registry

    wl = registry.get(cfg["pipeline"]["name"])
    fn = wl.load_work()
    if fn is None:
        return None
    est = fn(plan)
    return None if est is None else float(est)


def in_process_reason(cfg: dict, plan, profile_type: str) -> str | None:
    """The line to print when this run's work runs in this process, or None to start the cluster."""
    ccfg = cfg.get("cluster") or {}
    if mode(ccfg) == "false" or profile_type != "local":
        return None
    est = estimate(cfg, plan)
    if est is None or est > MAX_SECONDS:
        return None
    return (
        f"small work (about {est:.2g} s on one core): run in this process, no local workers started "
        "(cluster.in_process=false starts them)"
    )
