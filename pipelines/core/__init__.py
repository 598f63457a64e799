"""The core of pgmflow's orchestration: everything a run needs that is not one workload's own.

``cli`` (the ``pgmflow`` command), ``runner`` (``execute`` and ``RunContext``), ``registry`` (finding
workloads; the ``Workload`` and ``Stage`` contracts), ``preflight`` and ``validation`` (checks and rule
helpers), ``config`` (where configs live), ``cluster``, ``graph`` (``Executor``), ``tracking`` (MLflow) and
``store`` (new local stores), ``artifacts`` (what runs log), ``progress``, ``plotting``, ``sweep`` and
``reproduce``; studies: ``studyplan`` (the ``stages:`` section, checked), ``study`` (running one),
``stagekey`` and ``fingerprint`` (the stage key and code digests), ``cache_cli`` (``pgmflow cache`` and
``pgmflow lineage``); ``internals`` (the quarantine of other libraries' internals), ``legacy_names`` (the
import names before 0.3), ``mainguard`` (scripts without ``if __name__ == "__main__":``). Nothing here imports
a workload package.
"""
