"""Declarative validation rules (scikit-learn style) with one message format.

Every rule raises :class:`~pgmflow.core.errors.ConfigError` naming the field, the value, the problem
and the fix. Workloads declare their own rule tables beside their code (``<workload>/validate.py``)
and apply them with :func:`apply` and :func:`unknown_keys`.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable

from pgmflow.core.errors import ConfigError


def get(cfg: dict, path: str):
    node = cfg
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(
                path, "<missing>", "required field is missing", f"add {path}=... or restore the default config"
            )
        node = node[part]
    return node


def integer(lo: int | None = None, hi: int | None = None, even: bool = False, allow: tuple = ()) -> Callable:
    def check(path, v):
        if v in allow and not isinstance(v, bool):
            return
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            alt = f" or one of {', '.join(map(str, allow))}" if allow else ""
            raise ConfigError(path, v, f"must be an integer{alt}", f"set {path} to a whole number")
        if lo is not None and v < lo:
            raise ConfigError(path, v, f"must be >= {lo}", f"set {path}={lo} or larger")
        if hi is not None and v > hi:
            raise ConfigError(path, v, f"must be <= {hi}", f"set {path}={hi} or smaller")
        if even and v % 2:
            raise ConfigError(
                path, v, "must be even (checkerboard updates on a periodic lattice)", f"set {path}={v + 1}"
            )

    return check


def real(gt: float | None = None, ge: float | None = None, nonzero: bool = False) -> Callable:
    def check(path, v):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise ConfigError(path, v, "must be a number", f"set {path} to a finite number")
        if not math.isfinite(v):
            raise ConfigError(path, v, "must be finite", f"set {path} to a finite number")
        if gt is not None and not v > gt:
            raise ConfigError(path, v, f"must be > {gt}", f"set {path} to a value above {gt}")
        if ge is not None and not v >= ge:
            raise ConfigError(path, v, f"must be >= {ge}", f"set {path}={ge} or larger")
        if nonzero and v == 0:
            raise ConfigError(path, v, "must not be zero", f"set {path} to a non-zero value")

    return check


def choice(*options) -> Callable:
    def check(path, v):
        if v not in options:
            raise ConfigError(
                path, v, f"unknown value; expected one of {', '.join(map(str, options))}", f"set {path}={options[0]}"
            )

    return check


def boolean(path, v):
    if not isinstance(v, bool):
        raise ConfigError(path, v, "must be true or false", f"set {path}=true or {path}=false")


def optional_str(path, v):
    if v is not None and not isinstance(v, str):
        raise ConfigError(path, v, "must be a string or null", f"set {path}=null or a string")


def apply(cfg: dict, rules: dict[str, Callable]):
    for path, rule in rules.items():
        rule(path, get(cfg, path))


def unknown_keys(cfg: dict, section: str, known):
    node = cfg.get(section) or {}
    for key in node:
        if key not in known:
            import difflib

            near = difflib.get_close_matches(key, list(known), n=1)
            hint = f"did you mean {section}.{near[0]}?" if near else f"known keys: {', '.join(sorted(known))}"
            raise ConfigError(f"{section}.{key}", node[key], "unknown key", hint)


def number_list(path, v, *, ge=None, gt=None, nonempty=True):
    if not isinstance(v, (list, tuple)) or (nonempty and len(v) == 0):
        raise ConfigError(path, v, "must be a non-empty list of numbers", f"set {path}=[0.1,0.05] (a list)")
    for x in v:
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x):
            raise ConfigError(path, v, f"{x!r} is not a finite number", f"list only finite numbers in {path}")
        if ge is not None and x < ge:
            raise ConfigError(path, v, f"{x:g} is negative; penalties must be >= {ge}", f"use values >= {ge} in {path}")
        if gt is not None and not x > gt:
            raise ConfigError(path, v, f"{x:g} must be > {gt}", f"use values above {gt} in {path}")
    if len(set(float(x) for x in v)) != len(v):
        raise ConfigError(path, v, "has repeated values", f"list each value of {path} once")


ALLOWED_MODULES_ENV = "PGMFLOW_ALLOWED_MODULES"
ALLOWED_MODULES_BUILTIN = ("pgmflow.tasks",)  # pgmflow's own numerics (the shipped example densities live there)


def allowed_modules() -> tuple[str, ...]:
    """Module prefixes a config may import code from: pgmflow's ``pgmflow.tasks`` plus the comma-separated
    prefixes in the environment variable ``PGMFLOW_ALLOWED_MODULES``. The list comes from the
    environment, never from the config, so a command-line override cannot widen it."""
    extra = os.environ.get(ALLOWED_MODULES_ENV, "")
    return ALLOWED_MODULES_BUILTIN + tuple(p.strip() for p in extra.split(",") if p.strip())


def check_importable(path: str, spec: str):
    """Refuse, before importing anything, a ``package.module:function`` outside the allow-list."""
    mod = spec.partition(":")[0] if ":" in spec else spec.rpartition(".")[0]
    allowed = allowed_modules()
    if not mod or not any(mod == p or mod.startswith(p + ".") for p in allowed):
        top = (mod or spec).split(".")[0]
        if top in ("tasks", "pipelines"):  # pgmflow < 0.2 installed these top-level names
            raise ConfigError(
                path,
                spec,
                f"pgmflow's modules live under the pgmflow namespace (pgmflow.{top}) since 0.2",
                f"write {path}=pgmflow.{spec}",
            )
        raise ConfigError(
            path,
            spec,
            f"module {mod or spec!r} is not on the allow-list of modules a config may "
            f"import ({', '.join(allowed)}), so that a command-line override cannot run arbitrary "
            "code",
            f"export {ALLOWED_MODULES_ENV}={top} (comma-separated module prefixes) in the shell that runs pgmflow",
        )
