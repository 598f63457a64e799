"""Inducing-point Gaussian processes (SGPR, DTC, FITC, SVGP, and the exact GP for small data) with
per-chunk statistics summed across workers.

Modules: ``validate`` (the config rules; returns the run's typed plan, ``plan``), ``data`` (data sources and
standardisation, read once by the validation), ``evaluations`` (chunks on the cluster and the bound's
evaluations), ``fit`` (L-BFGS-B, restarts, SVGP, exact), ``run`` (``run(ctx, plan)`` and the model artifact),
``figures``. Worker-side code is in ``pgmflow.tasks.gp`` (``pgmflow.tasks.gp.chunks``).
"""

from pgmflow.core.registry import Workload

WORKLOAD = Workload(
    name="sparse_gp",
    run="pgmflow.sparse_gp.run:run",
    validate="pgmflow.sparse_gp.validate:check_sparse_gp",
    work="pgmflow.sparse_gp.run:work_seconds",  # single-core seconds (pgmflow.core.smallwork)
    summary="inducing-point Gaussian process regression (SGPR, FITC, DTC, SVGP, exact)",
    memory_hint=("gp-", "a smaller sparse_gp.chunk_size (fewer rows per task)"),
    load_model="pgmflow.sparse_gp.model:load_predictor",
)
