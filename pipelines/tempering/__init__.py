"""Parallel tempering (replica exchange MCMC) on Ising models and continuous targets.

Modules: ``validate`` (the config rules), ``targets`` (the task-side target and its explorer),
``run`` (the graph of each round and the ordered reduce), ``analysis`` (estimates and tables from
the traces), ``with_bounds`` (``bounds=true``: variational bounds along the ladder), ``figures``.
"""

from pgmflow.core.registry import Workload

WORKLOAD = Workload(
    name="tempering",
    run="pgmflow.tempering.run:run",
    validate="pgmflow.tempering.validate:check_tempering",
    summary="parallel tempering: log Z by stepping stone and thermodynamic integration, adaptive ladder",
    memory_hint=("pt-", "tempering.layout=blocks with a larger tempering.n_blocks (fewer replicas per task)"),
    flags={
        "bounds": (
            "adds variational bounds to pipeline=tempering",
            "drop bounds=true, or use pipeline=bounds for the bounds alone",
        )
    },
)
