"""The core of pgmflow's orchestration: everything a run needs that is not one workload's own.

``cli`` (the ``pgmflow`` command), ``runner`` (``execute`` and ``RunContext``), ``registry`` (finding
workloads), ``preflight`` and ``validation`` (checks and rule helpers), ``config`` (where configs
live), ``cluster``, ``graph`` (``Executor``), ``tracking`` (MLflow), ``artifacts`` (what runs log),
``progress``, ``plotting``, ``sweep`` and ``reproduce``. Nothing here imports a workload package.
"""
