"""The quarantine: every use of another library's internals that pgmflow still needs, in one place.

pgmflow uses the public APIs of dask, distributed, scipy, hydra and mlflow. What is here has no public
equivalent yet; each entry says why it is needed and what replaces it when the library offers one, and
``tests/test_internals.py`` pins each to the versions it was checked with (and checks, with ``ast``, that
no other module of pgmflow imports or touches a private name of those libraries).

* :class:`KilledWorkerLogFilter`: matches the wording of the scheduler's ERROR line for a task whose
  workers all died, which pgmflow reports itself as one line with the fix (``WorkerMemoryError``). A
  change of wording only brings the scheduler's line back beside pgmflow's; nothing breaks.
* :func:`mlflow_requirements_unchecked`: while pgmflow saves a pyfunc model, MLflow's check that this
  environment satisfies the model's requirements (``mlflow.utils.environment.
  warn_dependency_requirement_mismatches``, looked up by name when a model is saved) is a no-op. pgmflow's
  requirements are the installed versions themselves (``pgmflow.core.models.requirements``), so the check
  cannot find a mismatch, and it maps every installed distribution's files to modules first
  (``importlib.metadata.packages_distributions``: 0.7 s of a 5 s debug run with 190 packages installed,
  issue 38). MLflow has no option to skip it. Where the name is gone, nothing is skipped and the save only
  takes longer; so it is not pinned to versions.
* For the warm server (``pgmflow.core.warm``, issue 38), which imports in advance what a run needs and forks a
  child per run:

  * :func:`hydra_plugins_scanned`: Hydra's plugin scan (``hydra.core.plugins.Plugins.instance()``), done once
    in the server instead of in every run. Without it (a rename), each run scans as before.
  * :func:`numba_load_cached_overloads`: loads every specialisation numba's on-disk cache holds for a
    dispatcher, as its first call would, without calling it (the dispatcher's ``_cache``, its cache file's
    ``_load_index`` and ``_cache_hits``; numba 0.58-0.68). numba has no public "load from cache" call. Where
    these are gone, nothing is loaded and each run loads its kernels itself (slower, same results).
  * :func:`numba_threading_started`: whether numba's threading layer has been started in this process
    (``numba.np.ufunc.parallel._is_initialized``): the server must not fork after that.
  * :func:`interpreter_exit`: in a forked child that ends with ``os._exit``, what the interpreter does at exit:
    wait for non-daemon threads (``threading._shutdown``) and run the ``atexit`` handlers
    (``atexit._run_exitfuncs``), so that MLflow's and Dask's exit handlers run as in a process of its own.
"""

from __future__ import annotations

import contextlib
import logging

# The versions these were last checked with (tests/test_internals.py fails outside them, so that an
# upgrade is a decision, not a surprise).
CHECKED = {"distributed": ("2024.8", "2027")}


class KilledWorkerLogFilter(logging.Filter):
    """Drops the in-process scheduler's log line about a task whose workers all died ("... marked as failed
    because N workers died while trying to run it"): the driver reports it itself, as one line that says
    what to change (pgmflow.core.graph.WorkerMemoryError)."""

    def filter(self, record):
        msg = record.getMessage()
        return not ("marked as failed because" in msg and "workers died" in msg)


@contextlib.contextmanager
def mlflow_requirements_unchecked():
    """Within: MLflow's environment check of a saved model's requirements does nothing (see the module's
    docstring); restored on the way out."""
    import mlflow.utils.environment as env

    check = getattr(env, "warn_dependency_requirement_mismatches", None)
    if check is None:
        yield
        return
    env.warn_dependency_requirement_mismatches = lambda requirements: None
    try:
        yield
    finally:
        env.warn_dependency_requirement_mismatches = check


def hydra_plugins_scanned() -> None:
    """Hydra's plugin scan, done now (see the module's docstring)."""
    from hydra.core.plugins import Plugins

    Plugins.instance()


def numba_load_cached_overloads(dispatcher) -> int:
    """Load into ``dispatcher`` every specialisation numba's on-disk cache holds for it (as a first call with
    those argument types would), without calling it; the number loaded. 0 where the dispatcher has no cache
    file or numba's internals have moved (see the module's docstring)."""
    from numba.core.compiler_lock import global_compiler_lock

    cache = getattr(dispatcher, "_cache", None)
    cache_file = getattr(cache, "_cache_file", None)
    if cache_file is None:
        return 0
    sigs = {key[0] for key in cache_file._load_index()}
    loaded = 0
    for sig in sigs:
        with global_compiler_lock:
            if tuple(sig) in dispatcher.overloads:
                continue
            cres = cache.load_overload(sig, dispatcher.targetctx)
            if cres is None:
                continue
            dispatcher._cache_hits[sig] += 1
            if not cres.objectmode:
                dispatcher.targetctx.insert_user_function(cres.entry_point, cres.fndesc, [cres.library])
            dispatcher.add_overload(cres)
            loaded += 1
    return loaded


def numba_threading_started() -> bool:
    """Whether numba's threading layer has been started in this process (see the module's docstring)."""
    from numba.np.ufunc import parallel

    return bool(getattr(parallel, "_is_initialized", False))


def interpreter_exit() -> None:
    """What the interpreter does at a normal exit before it tears down: wait for the non-daemon threads, then
    run the ``atexit`` handlers (see the module's docstring)."""
    import atexit
    import threading

    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
