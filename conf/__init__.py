"""pgmflow's Hydra configs, installed as package data of ``pgmflow.conf``
(``pgmflow.core.config.conf_dir``)."""
