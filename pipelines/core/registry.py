"""The workload registry: the core finds workloads; it knows none of them by name.

A workload is a package whose ``WORKLOAD`` attribute is a :class:`Workload` value. Three places
are searched, in this order:

1. the sub-packages of ``pipelines`` (every folder beside ``core/`` that defines ``WORKLOAD``);
2. the ``pgmflow.workloads`` entry-point group of installed distributions (``name = "module"``);
3. the environment variable ``PGMFLOW_WORKLOADS``: comma-separated module names (for a workload
   under development, or one in a test).

The list comes from code and the environment, never from the config: a command-line override can
choose among the workloads found, not import a new module. A workload outside ``pipelines/`` ships
its Hydra configs in ``conf_dir`` (a ``pipeline/<name>.yaml`` at least); the search-path plugin in
``hydra_plugins/pgmflow_workloads`` adds that folder to Hydra's config search path.

Importing a workload package must stay cheap (no dask, mlflow or numba): ``run`` and ``validate``
are ``"module:function"`` strings, imported only when a run needs them.
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

WORKLOADS_ENV = "PGMFLOW_WORKLOADS"
ENTRY_POINT_GROUP = "pgmflow.workloads"
# the sub-packages of pgmflow that are not workloads: the core, the numerics (tasks/) and the configs (conf/)
NOT_WORKLOADS = frozenset({"core", "tasks", "conf"})


@dataclass(frozen=True)
class Port:
    """One typed input or output of a stage (docs/stages.md).

    name: how a study refers to it (``in: {network: learn.estimates}``).
    kind: ``npz`` (one array file, read without pickle) or ``npz_list`` (a folder of them, one per unit:
        what ``foreach`` iterates over).
    field: inputs only: the dotted config field that takes the file's path (``model.path``); the stage
        key covers the file's digest, not the path.
    path: outputs only: the artifact path in the run (``estimates.npz``, or the folder ``mrf/``).
    """

    name: str
    kind: str = "npz"
    field: str = ""
    path: str = ""


@dataclass(frozen=True)
class Stage:
    """What a workload declares as a stage of a study: its typed inputs and outputs, whether it draws
    random numbers (the seed enters its key only then), and the config sections its key covers (None: all
    but the core's own: where and how it runs)."""

    inputs: tuple[Port, ...] = ()
    outputs: tuple[Port, ...] = ()
    random: bool = True
    sections: tuple[str, ...] | None = None

    def input(self, name: str) -> Port | None:
        return next((p for p in self.inputs if p.name == name), None)

    def output(self, name: str) -> Port | None:
        return next((p for p in self.outputs if p.name == name), None)


@dataclass(frozen=True)
class Workload:
    """What a workload declares about itself.

    name: the value of ``pipeline.name`` that selects it (``conf/pipeline/<name>.yaml``).
    run: ``"module:function"``; the function takes a :class:`~pgmflow.core.runner.RunContext` and
        the plan ``validate`` returned, ``run(ctx, plan)``, and returns the result dict (``objective`` in it,
        optionally ``objective_name`` / ``_direction``).
    validate: ``"module:function"``; takes the resolved config (a dict), raises ``ConfigError`` on the
        first problem in the workload's own sections (its data included), and returns the run's plan: a
        frozen, typed value (a frozen dataclass or NamedTuple) with the settings and the resolved inputs,
        so that the config is read and every input loaded once per run.
    summary: one line for listings and help.
    memory_hint: ``(task-key prefix, setting)``: the first setting to change when one of the
        workload's tasks runs its worker out of memory (named in the out-of-memory message).
    flags: top-level boolean options this workload adds, ``{key: (what it does, fix)}``; such a key
        set true under another workload is refused with that sentence.
    conf_dir: a folder of Hydra configs to add to the search path (plug-in workloads).
    load_model: ``"module:function"`` or None; the function takes a finished run's artifact folder and
        returns its fitted model as an object (what ``pgmflow.load(run_id).model`` is), or None when the
        run logged none.
    stage: the workload as a stage of a study (:class:`Stage`: inputs, outputs, randomness).
    work: ``"module:function"`` or None; the function takes the plan and returns a rough estimate of the
        run's work in seconds on one core (or None: unknown). A run on a local profile whose estimate is
        under a second runs in the driver without starting workers (``pgmflow.core.smallwork``).
    """

    name: str
    run: str
    validate: str
    summary: str = ""
    memory_hint: tuple[str, str] | None = None
    flags: dict = field(default_factory=dict)
    conf_dir: str | None = None
    load_model: str | None = None
    stage: Stage = field(default_factory=Stage)
    work: str | None = None

    def load_run(self) -> Callable:
        return _load(self.run)

    def load_validate(self) -> Callable:
        return _load(self.validate)

    def load_model_reader(self) -> Callable | None:
        return _load(self.load_model) if self.load_model else None

    def load_work(self) -> Callable | None:
        return _load(self.work) if self.work else None


class WorkloadError(RuntimeError):
    """A module named as a workload cannot be imported or declares no ``WORKLOAD``."""


def _load(spec: str) -> Callable:
    mod, _, attr = spec.partition(":")
    return getattr(importlib.import_module(mod), attr)


def _from_module(name: str, where: str) -> Workload:
    try:
        mod = importlib.import_module(name)
    except Exception as exc:
        raise WorkloadError(
            f"{where}: workload module {name!r} cannot be imported ({type(exc).__name__}: {exc}); "
            "fix: check the module name and that it is importable"
        ) from None
    wl = getattr(mod, "WORKLOAD", None)
    if not isinstance(wl, Workload):
        raise WorkloadError(
            f"{where}: module {name!r} defines no WORKLOAD (a pgmflow.core.registry.Workload); "
            "fix: declare WORKLOAD = Workload(name=..., run=..., validate=...) in it"
        )
    return wl


def _builtin_modules() -> list[str]:
    import pgmflow

    return [
        f"pgmflow.{m.name}"
        for m in pkgutil.iter_modules(pgmflow.__path__)
        if m.ispkg and m.name not in NOT_WORKLOADS and not m.name.startswith("_")
    ]


def _entry_point_modules() -> list[str]:
    from importlib.metadata import entry_points

    return [ep.value.partition(":")[0] for ep in entry_points(group=ENTRY_POINT_GROUP)]


def _env_modules() -> list[str]:
    return [m.strip() for m in os.environ.get(WORKLOADS_ENV, "").split(",") if m.strip()]


@functools.lru_cache(maxsize=8)
def _discover(env_value: str) -> tuple[Workload, ...]:
    found: dict[str, Workload] = {}
    sources = (
        [(m, "pipelines/") for m in _builtin_modules()]
        + [(m, f"entry point group {ENTRY_POINT_GROUP}") for m in _entry_point_modules()]
        + [(m, WORKLOADS_ENV) for m in _env_modules()]
    )
    for module, where in sources:
        wl = _from_module(module, where)
        if wl.name in found and found[wl.name] != wl:
            raise WorkloadError(
                f"{where}: workload {wl.name!r} of module {module!r} is declared twice; "
                "fix: give the workload another name"
            )
        found[wl.name] = wl
    return tuple(found.values())


def workloads() -> tuple[Workload, ...]:
    """Every workload found (built-in first), each once."""
    return _discover(os.environ.get(WORKLOADS_ENV, ""))


def names() -> list[str]:
    return [w.name for w in workloads()]


def get(name: str) -> Workload:
    """The workload selected by ``pipeline.name``; ``ConfigError`` when there is none of that name."""
    for w in workloads():
        if w.name == name:
            return w
    from pgmflow.core.errors import ConfigError

    known = names()
    raise ConfigError(
        "pipeline.name",
        name,
        f"unknown value; expected one of {', '.join(known)}",
        f"set pipeline.name={known[0]}" if known else f"declare a workload (see {WORKLOADS_ENV})",
    )


def extra_conf_dirs() -> list[str]:
    """Config folders of workloads that ship their own (added to Hydra's search path)."""
    return [str(Path(w.conf_dir).resolve()) for w in workloads() if w.conf_dir]
