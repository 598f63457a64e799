"""Parallel tempering (replica exchange MCMC) on Ising models, pairwise binary MRFs and continuous targets.

Modules: ``validate`` (the config rules), ``targets`` (the task-side target and its explorer),
``run`` (the graph of each round and the ordered reduce), ``analysis`` (estimates and tables from
the traces), ``with_bounds`` (``bounds=true``: variational bounds along the ladder), ``figures``.
"""

from pgmflow.core.registry import Port, Stage, Workload

WORKLOAD = Workload(
    name="tempering",
    run="pgmflow.tempering.run:run",
    validate="pgmflow.tempering.validate:check_tempering",
    work="pgmflow.tempering.plan:work_seconds",  # single-core seconds (pgmflow.core.smallwork)
    summary="parallel tempering: log Z by stepping stone and thermodynamic integration, adaptive ladder",
    stage=Stage(  # as a stage of a study (docs/stages.md): model=mrf takes its model file from an upstream stage
        inputs=(Port("model", "npz", field="model.path"),),
        outputs=(Port("final_state", "npz", path="final_state.npz"),),
    ),
    memory_hint=("pt-", "tempering.layout=blocks with a larger tempering.n_blocks (fewer replicas per task)"),
    flags={
        "bounds": (
            "adds variational bounds to pipeline=tempering",
            "drop bounds=true, or use pipeline=bounds for the bounds alone",
        )
    },
)
