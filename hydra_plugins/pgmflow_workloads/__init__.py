"""pgmflow's config search path: the Hydra configs of workloads that live outside ``pipelines/``.

A workload package found by ``pgmflow.core.registry`` (an entry point of the ``pgmflow.workloads``
group, or a module in ``PGMFLOW_WORKLOADS``) may declare ``conf_dir``, a folder with its
``pipeline/<name>.yaml`` (and any group of its own). This plugin appends those folders to Hydra's
search path, after pgmflow's own ``conf/``, so ``pgmflow pipeline=<name>`` composes without an edit to
``conf/``. It acts only when the primary config directory is pgmflow's, and never raises: a
workload that cannot be imported is reported by the registry when the run starts.
"""
