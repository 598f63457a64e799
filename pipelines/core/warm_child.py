"""What the warm server (``pgmflow.core.warm_server``) loads before it forks, and what each forked child does
to become the command it runs."""

from __future__ import annotations

import os
import signal
import sys
import time


def _preload() -> list[str]:
    """Import what a run needs and load the workloads' numba kernels from numba's cache, running nothing.
    Returns notes (what could not be loaded; the runs load it themselves)."""
    import importlib
    import pkgutil

    notes = []
    os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")  # pyarrow's jemalloc: no thread
    import matplotlib

    matplotlib.use("Agg")
    import pgmflow

    modules = [
        "numpy",
        "scipy",
        "scipy.linalg",
        "scipy.special",
        "scipy.optimize",
        "scipy.sparse",
        "scipy.stats",
        "numba",
        "matplotlib.pyplot",
        "omegaconf",
        "hydra",
        "hydra.main",
        "hydra._internal.hydra",
        "hydra._internal.utils",
        "hydra._internal.config_loader_impl",
        "hydra.core.plugins",
        "mlflow",
        "mlflow.entities",
        "mlflow.tracking",
        "mlflow.pyfunc",
        "mlflow.models",
        "mlflow.store.tracking.sqlalchemy_store",
        "mlflow.store.artifact.local_artifact_repository",
        "mlflow.store.model_registry.sqlalchemy_store",
        "dask",
        "dask.array",
        "distributed",
    ]
    pkg = os.path.dirname(pgmflow.__file__)
    for info in pkgutil.walk_packages([pkg], "pgmflow.", onerror=lambda name: notes.append(f"walk {name}")):
        name = info.name
        if name.startswith("pgmflow.tasks.") and ("cuda" in name or "gpu" in name):
            continue
        if name.startswith(("pgmflow.conf", "pgmflow.core.warm", "pgmflow.__main__")):
            continue
        modules.append(name)
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # an optional extra not installed, say: that run imports it itself
            notes.append(f"import {name}: {type(exc).__name__}: {exc}")
    from pgmflow.core import internals

    try:
        internals.hydra_plugins_scanned()  # Hydra's plugin scan (the same in every run of these files)
    except Exception as exc:
        notes.append(f"hydra plugins: {type(exc).__name__}: {exc}")
    notes += _load_kernels()
    return notes


def _load_kernels() -> list[str]:
    """Make the workloads' numba dispatchers (each module's cached ``compile_kernels`` accessor) and load every
    specialisation numba's on-disk cache holds for them, as a first call would, without calling a kernel."""
    from pgmflow.core import internals

    notes = []
    tasks = [m for name, m in sorted(sys.modules.items()) if name.startswith("pgmflow.tasks.") and m is not None]
    for mod in tasks:
        for attr, obj in list(vars(mod).items()):
            fn = getattr(obj, "__wrapped__", None)
            if not (callable(obj) and hasattr(obj, "cache_info")) or getattr(fn, "__module__", None) != mod.__name__:
                continue
            code = getattr(fn, "__code__", None)
            if code is None or code.co_argcount or "compile_kernels" not in code.co_names:
                continue
            try:
                obj()
            except Exception as exc:
                notes.append(f"{mod.__name__}.{attr}(): {type(exc).__name__}: {exc}")
    if "numba" not in sys.modules:
        return notes
    from numba.core.dispatcher import Dispatcher

    seen = set()
    for mod in tasks:
        for obj in list(vars(mod).values()):
            if not isinstance(obj, Dispatcher) or id(obj) in seen:
                continue
            seen.add(id(obj))
            if obj.targetoptions.get("parallel"):
                # loading one starts numba's threading layer, and GNU OpenMP's then refuses to run in a fork
                # (numba checks the pid it started in): a run loads its parallel kernels itself
                continue
            try:
                internals.numba_load_cached_overloads(obj)
            except Exception as exc:
                notes.append(f"{obj.py_func.__qualname__}: {type(exc).__name__}: {exc}")
    if internals.numba_threading_started():
        notes.append("numba's threading layer was started: parallel kernels in a child may refuse to run")
    return notes


def _blas_threads_down() -> None:
    """Stop OpenBLAS's idle worker threads (what its own fork handler does; a later BLAS call in a child starts
    them again, with the thread count the child sets)."""
    import ctypes

    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return
    for info in threadpool_info():
        if info.get("internal_api") != "openblas":
            continue
        try:
            lib = ctypes.CDLL(info["filepath"])
            lib.blas_thread_shutdown_()
        except (OSError, AttributeError):
            pass


def threads() -> list[str]:
    """The names of this process's threads (native ones included), from /proc."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        import threading

        return [t.name for t in threading.enumerate()]
    out = []
    for t in tids:
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                out.append(f.read().strip())
        except OSError:
            out.append("?")
    return out


def _child(req: dict, fds: list[int], close: list) -> None:
    """In the forked child: become the command (descriptors, folder, environment, umask, argv), run main(), exit."""
    from pgmflow.core import warm

    code = 1
    try:
        warm._IN_CHILD = True  # (the command-side module's flag: main() must not look for a server again)
        sys._pgmflow_warm_child = True  # also seen by a second copy of this module, should one be imported
        signal.set_wakeup_fd(-1)
        for c in close:
            c.close() if hasattr(c, "close") else os.close(c)
        os.setpgid(0, 0)  # a group of its own: the server signals the run and what it started together
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        for i, fd in enumerate(fds[:3]):
            os.dup2(fd, i)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(req["cwd"])
        os.umask(int(req["umask"]))
        os.environ.clear()
        os.environ.update(req["env"])
        time.tzset()
        sys.argv = list(req["argv"])
        if sys.path and req.get("path0") is not None:
            sys.path.insert(0, req["path0"])
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.reconfigure(line_buffering=stream is sys.stderr or os.isatty(stream.fileno()))
            except (AttributeError, ValueError, OSError):
                pass
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()  # numpy's global generator: fresh entropy, as in a new process
        from pgmflow.core.cli import main

        main()
        code = 0
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        import traceback

        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        # what the interpreter does at exit: wait for non-daemon threads, run atexit, flush
        try:
            from pgmflow.core import internals

            internals.interpreter_exit()
        except BaseException:
            pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code & 0xFF)
