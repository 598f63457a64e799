"""Where pgmflow's configs live, and which keys and groups they can produce."""

from __future__ import annotations

import functools
import os
from pathlib import Path


def conf_dir() -> str:
    """The config directory: ``PGMFLOW_CONF_DIR`` if set, else the ``pgmflow.conf`` package's folder (the
    source tree's conf/ in an editable install, site-packages/pgmflow/conf in a wheel)."""
    env = os.environ.get("PGMFLOW_CONF_DIR")
    if env:
        return str(Path(env).resolve())
    import pgmflow.conf

    here = Path(pgmflow.conf.__file__).resolve().parent
    if not (here / "config.yaml").exists():
        raise RuntimeError(f"pgmflow's configs are missing from {here}; reinstall pgmflow or set PGMFLOW_CONF_DIR")
    return str(here)


@functools.lru_cache(maxsize=1)
def check_install() -> None:
    """Stop with one line when Hydra cannot see pgmflow's plugins (the Dask launcher, the workloads' search path).

    Hydra finds plugins by walking the folders of the ``hydra_plugins`` namespace with ``pkgutil``. A wheel and
    the strict editable install (``make install``) put pgmflow's there; setuptools' default editable mode maps
    them with an import hook that the walk cannot see."""
    import pkgutil

    import hydra_plugins

    found = {m.name for m in pkgutil.iter_modules(list(hydra_plugins.__path__))}
    missing = sorted({"pgmflow_dask_launcher", "pgmflow_workloads"} - found)
    if missing:
        raise RuntimeError(
            f"Hydra cannot see pgmflow's plugins ({', '.join(missing)}): pgmflow is installed in setuptools' default "
            "editable mode, whose import hook Hydra's plugin scan does not walk; fix: make install, or "
            "pip install -e . --config-settings editable_mode=strict"
        )


def nested_compose(overrides: list[str]) -> dict:
    """A resolved config for ``overrides``, composable from inside a running Hydra app (a study's stages, under
    ``pgmflow`` itself): the app's global Hydra state is set aside and put back after, with Hydra's public
    ``GlobalHydra`` calls."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    gh = GlobalHydra.instance()
    saved = gh.hydra if gh.is_initialized() else None
    gh.clear()
    try:
        with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            return resolved(compose("config", overrides=list(overrides)))
    finally:
        if saved is not None:
            GlobalHydra.instance().clear()
            GlobalHydra.instance().initialize(saved)


def conf_dirs() -> list[str]:
    """pgmflow's own configs, then those of plug-in workloads (Hydra's search path, in order)."""
    from pgmflow.core import registry

    return [conf_dir(), *registry.extra_conf_dirs()]


def conf_groups() -> list[str]:
    """The config groups (folders of yaml files) of every config directory."""
    groups = set()
    for d in conf_dirs():
        groups |= {p.name for p in Path(d).iterdir() if p.is_dir() and any(p.glob("*.yaml"))}
    return sorted(groups)


def _package_prefix(rel: Path, text: str) -> str:
    """Where Hydra puts a config file's keys: '' (the top level) or a dotted section."""
    group = ".".join(rel.parent.parts)
    package = "_global_" if not group else "_group_"
    for line in text.splitlines():
        s = line.strip()
        if s and not s.startswith("#"):
            break
        if "@package" in s:
            package = s.split("@package", 1)[1].strip()
    package = package.replace("_group_", group).replace("_global_", "")
    return package.strip(".")


@functools.lru_cache(maxsize=4)
def conf_keys(*confs: str) -> tuple[frozenset, dict]:
    """Every top-level key that some composition of the configs under ``confs`` can produce, and for
    each section the keys any config file sets in it. Read from the files, so a new pipeline or
    experiment needs no change here."""
    import yaml

    top, sections = set(), {}
    files = [(Path(c), f) for c in confs for f in sorted(Path(c).rglob("*.yaml"))]
    for root, f in files:
        text = f.read_text()
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            continue  # Hydra reports it when the file is used
        if not isinstance(data, dict):
            continue
        data.pop("defaults", None)
        prefix = _package_prefix(f.relative_to(root), text)
        if not prefix:
            top |= set(data)
            for k, v in data.items():
                if isinstance(v, dict):
                    sections.setdefault(k, set()).update(v)
        else:
            head, _, rest = prefix.partition(".")
            top.add(head)
            if not rest:
                sections.setdefault(head, set()).update(data)
    return frozenset(top), {k: frozenset(v) for k, v in sections.items()}


def resolved(cfg) -> dict:
    """A composed config as a plain dict: Hydra's own section dropped, every ``${...}`` resolved (a
    ``${hydra:...}`` one from the running Hydra's config); an interpolation that cannot be resolved is a
    :class:`ConfigError` naming its key. The one way pgmflow turns a config into the dict that validation
    reads: the CLI, the Python API and each job of a sweep."""
    import copy

    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    from pgmflow.core.errors import ConfigError

    cfg = copy.deepcopy(cfg)
    if "hydra" in cfg:
        with open_dict(cfg):
            del cfg["hydra"]
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "config"
        raise ConfigError(
            str(key), "<interpolation>", f"cannot be resolved ({getattr(exc, 'msg', exc)})", "fix the ${...} reference"
        ) from None
