"""pgmflow's Hydra configs, installed as package data of ``pgmflow.conf``
(``pgmflow.pipelines.core.config.conf_dir``)."""
