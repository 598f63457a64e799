"""Variational bounds on log Z: naive mean field (lower), loopy BP (Bethe), tree-reweighted BP (upper).

Modules: ``validate`` (the config rules, the Ising model's included), ``models`` (the Ising target
as an MRF, an MRF from a file, TRW's edge probabilities), ``run`` (``pipeline=bounds``: one task
per temperature), ``ladder`` (``bounds=true`` in tempering: the bounds at every ladder level),
``figures``. The numerics, the per-temperature task included, are in ``pgmflow.tasks.bounds``.
"""

from pgmflow.core.registry import Port, Stage, Workload

WORKLOAD = Workload(
    name="bounds",
    run="pgmflow.bounds.run:run",
    validate="pgmflow.bounds.validate:check_bounds_pipeline",
    work="pgmflow.bounds.plan:work_seconds",  # single-core seconds (pgmflow.core.smallwork)
    summary="mean-field, Bethe and TRW bounds on log Z of Ising models and pairwise MRFs",
    stage=Stage(  # as a stage of a study (docs/stages.md)
        inputs=(Port("model", "npz", field="model.path"),),
        outputs=(Port("bounds", "npz", path="bounds.npz"),),
        sections=("pipeline", "model", "variational", "backend"),
    ),
)
