"""Stochastic variational inference for LDA (minibatches, natural gradient, posterior regularization).

Modules: ``validate`` (the config rules), ``corpora`` (corpus sources, converted once to shards),
``run`` (the graph of each step and the ordered reduce), ``report`` (evaluation and artifacts),
``figures``. Worker-side code is in ``pgmflow.tasks.lda``.
"""

from pgmflow.core.registry import Workload

WORKLOAD = Workload(
    name="svi",
    run="pgmflow.svi.run:run",
    validate="pgmflow.svi.validate:check_svi",
    work="pgmflow.svi.plan:work_seconds",  # single-core seconds (pgmflow.core.smallwork)
    summary="stochastic variational inference for LDA on a sharded corpus, with posterior regularization",
    memory_hint=("svi-", "a smaller corpus.docs_per_shard (fewer documents per task)"),
    load_model="pgmflow.svi.model:load_transformer",
)
