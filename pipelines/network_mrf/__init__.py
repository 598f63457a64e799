"""``pipeline=network_mrf``: a learned (or known) time-varying network as one pairwise binary MRF per time
point, the files the bounds workload reads (``model=mrf``): the middle stage of a TESLA -> bounds study
(docs/stages.md). Numerics in ``pgmflow.tasks.bounds.from_network``."""

from pgmflow.core.registry import Port, Stage, Workload

WORKLOAD = Workload(
    name="network_mrf",
    run="pgmflow.network_mrf.run:run",
    validate="pgmflow.network_mrf.run:check_network_mrf",
    work="pgmflow.network_mrf.run:work_seconds",  # single-core seconds (pgmflow.core.smallwork)
    summary="a time-varying network (TESLA's estimates or a synthetic truth) as one MRF .npz per time point",
    stage=Stage(
        inputs=(Port("estimates", "npz", field="network_mrf.estimates"),),
        outputs=(Port("mrf", "npz_list", path="mrf/"),),
        random=False,
        sections=("pipeline", "network_mrf", "network"),
    ),
)
