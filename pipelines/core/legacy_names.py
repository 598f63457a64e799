"""The import names of pgmflow 0.2 before its layout change: ``pgmflow.pipelines.<x>`` is now ``pgmflow.<x>``.

MLflow models logged before the change pickle their classes by those names, and recorded configs and run
metadata name them (``generator=pgmflow.pipelines.bounds.models.ising_model``). :class:`OldNames`, a meta
path finder that ``import pgmflow`` installs, answers an old name with the module of the new one (the same
module object, so pickled classes compare equal) and says so once with a ``DeprecationWarning``. It uses
only ``importlib``'s public finder and loader protocols (PEP 451).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

OLD, NEW = "pgmflow.pipelines", "pgmflow"
_warned: set[str] = set()


def new_name(fullname: str) -> str | None:
    """``pgmflow.pipelines.core.api`` -> ``pgmflow.core.api``; ``pgmflow.pipelines`` -> ``pgmflow``; others None."""
    if fullname == OLD:
        return NEW
    if fullname.startswith(OLD + "."):
        return NEW + fullname[len(OLD) :]
    return None


class _Alias(importlib.abc.Loader):
    """Loads an old name as the already imported module of its new name, whose own ``__spec__`` it keeps."""

    def __init__(self, module):
        self.module = module
        self.spec = module.__spec__

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):  # executed already, under its new name; the import system set __spec__ to
        module.__spec__ = self.spec  # the alias's spec: give the module its own back


class OldNames(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path`` (an old name must never reach the path finder, which would load a second copy
    of the module from the new package's folder); answers only names under ``pgmflow.pipelines``."""

    def find_spec(self, fullname, path=None, target=None):
        new = new_name(fullname)
        if new is None:
            return None
        if fullname not in _warned:
            _warned.add(fullname)
            warnings.warn(f"{fullname} is pgmflow's import name before 0.3; it is now {new}", DeprecationWarning, 2)
        module = importlib.import_module(new)
        return importlib.machinery.ModuleSpec(fullname, _Alias(module), is_package=hasattr(module, "__path__"))


def install() -> None:
    if not any(isinstance(f, OldNames) for f in sys.meta_path):
        sys.meta_path.insert(0, OldNames())
