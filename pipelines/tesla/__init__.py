"""TESLA: time-varying network structure learning by temporally smoothed L1 logistic regression
(with KELLER and a static baseline beside it).

Modules: ``validate`` (the config rules; returns the run's plan), ``plan`` (the frozen, typed
``TeslaPlan`` and its pieces), ``networks`` (data sources: synthetic, npz, csv), ``run`` (one path task
per node and grid point, one selection task per node), ``edges`` (edge sets and recovery), ``report``
(metrics and artifacts), ``figures``. Worker-side code is in ``pgmflow.tasks.tesla``.
"""

from pgmflow.core.registry import Port, Stage, Workload

WORKLOAD = Workload(
    name="tesla",
    run="pgmflow.tesla.run:run",
    validate="pgmflow.tesla.validate:check_tesla",
    work="pgmflow.tesla.plan:work_seconds",  # single-core seconds (pgmflow.core.smallwork)
    summary="TESLA time-varying networks (and KELLER, static) by L1 logistic paths per node",
    stage=Stage(  # as a stage of a study (docs/stages.md)
        inputs=(Port("network", "npz", field="network.path"),),
        outputs=(Port("estimates", "npz", path="estimates.npz"),),
        sections=("pipeline", "tesla", "network", "model", "backend"),
    ),
)
