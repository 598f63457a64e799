"""``pgmflow warm start|status|stop``: a background process that has imported everything a run needs, so that
a small run starts in a fraction of a second instead of paying the imports again (docs/clusters.md, issue 38).

A debug-size run spends most of its wall time before any work: importing MLflow, Dask, NumPy, SciPy, Hydra and
matplotlib, and loading the numba kernels from numba's on-disk cache (benchmarks/startup.py). The warm server
pays that once::

    pgmflow warm start                  # or: pgmflow warm start --idle 60   (minutes idle before it stops)
    pgmflow pipeline=svi debug=default  # unchanged commands: run by a child of the warm server
    pgmflow warm status
    pgmflow warm stop

How a run goes through it: first thing in :func:`pgmflow.core.cli.main`, before any heavy import,
:func:`run_warm` looks for the server's socket. If one listens and its fingerprint (:func:`fingerprint`: the
Python executable, pgmflow's installed source and config files, the environment variables read at import time)
equals this command's, the command sends its argv, working directory, environment, umask and its stdin, stdout
and stderr descriptors (SCM_RIGHTS). The server forks a child, which takes all of these over, resets its signal
handlers and runs the ordinary ``main()``; the command waits for the child's exit status and exits with it,
forwarding SIGINT, SIGTERM and SIGHUP. The server itself never runs a command: every child is forked from the
pristine server, so nothing one run does is seen by the next. On any mismatch the command runs as always, in its
own process, after one line on stderr saying why the server was not used.

Only single runs (and ``--cfg``/``--help``) go through the server. Sweeps (``-m``) start clusters and their own
processes, and ``reproduce``, ``cache``, ``lineage``, ``cluster`` and ``warm`` run as before. ``PGMFLOW_WARM=0``
keeps a command off the server.

The server holds no threads when it forks (checked before each fork: OpenBLAS's idle threads are shut down the
way its own fork handler does, and the jemalloc that pyarrow bundles runs without its background thread; a
numba kernel is loaded from the cache, never run). Its socket lives in a per-user folder of mode 0700
(``$XDG_RUNTIME_DIR/pgmflow`` or ``~/.cache/pgmflow``); a connection from another user id is refused
(SO_PEERCRED).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import struct
import sys
import time

USAGE = "usage: pgmflow warm start [--idle MINUTES] | pgmflow warm status | pgmflow warm stop"
IDLE_DEFAULT_S = 30 * 60.0
START_TIMEOUT_S = 180.0
MAX_RUNS = 32  # runs at once; more are refused (they run in their own process)
KILL_GRACE_S = 5.0  # after a client went away: SIGTERM to the run, SIGKILL this much later
PROTOCOL = 1

# Environment read at import time (by Python, numba, the BLAS, Hydra, MLflow, pgmflow): a server started with
# other values would run a command differently from a fresh process, so they are part of the fingerprint.
ENV_PREFIXES = ("NUMBA_", "OMP_", "OPENBLAS_", "GOTO_", "MKL_", "PYTHON", "CUDA", "HYDRA_", "MLFLOW_", "PGMFLOW_")
ENV_NAMES = ("MPLBACKEND", "LANG", "LC_ALL", "LC_CTYPE")
# ... except those that name one run and are read only while it runs (each child gets the command's own).
ENV_PER_RUN = (
    "PGMFLOW_ORIG_CWD",
    "PGMFLOW_ATTEMPT",
    "PGMFLOW_IN_PROCESS",
    "PGMFLOW_BLAS_THREADS",
    "PGMFLOW_GP_KUF_CACHE_MB",
    "PGMFLOW_TRACKING_URI",
    "PGMFLOW_BAD_INPUT_SUBPROCESS",
    "PGMFLOW_WARM",
    "PGMFLOW_WARM_DIR",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_RUN_ID",
    "MLFLOW_EXPERIMENT_NAME",
    "MLFLOW_EXPERIMENT_ID",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_REGISTRY_URI",
)
ENV_PER_RUN_PREFIXES = ("PGMFLOW_SWEEP_", "PGMFLOW_NET_", "PGMFLOW_TEST_")
SOURCE_SUFFIXES = (".py", ".yaml", ".yml")
SUBCOMMANDS = ("reproduce", "cache", "lineage", "warm")

_IN_CHILD = False  # set in a child of the server: its main() must not look for a server again


# ---------------------------------------------------------------------------------------------------------------
# where the server lives, and what it must match


def folder() -> str:
    """The per-user folder of the socket (mode 0700): ``$PGMFLOW_WARM_DIR``, ``$XDG_RUNTIME_DIR/pgmflow`` or
    ``~/.cache/pgmflow``."""
    if os.environ.get("PGMFLOW_WARM_DIR"):
        return os.environ["PGMFLOW_WARM_DIR"]
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return os.path.join(xdg, "pgmflow")
    return os.path.join(os.path.expanduser("~"), ".cache", "pgmflow")


def _private_folder(create: bool) -> str | None:
    """The folder if it is this user's and nobody else's (created 0700 when ``create``); None otherwise."""
    d = folder()
    if create:
        os.makedirs(d, mode=0o700, exist_ok=True)
    try:
        st = os.lstat(d)
    except OSError:
        return None
    import stat

    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return None
    if st.st_mode & 0o077:
        if not create:
            return None
        os.chmod(d, 0o700)
    return d


def _name() -> str:
    """One server per Python environment and user: named after the executable."""
    return "warm-" + hashlib.sha1(os.path.realpath(sys.executable).encode()).hexdigest()[:12]


def socket_path() -> str:
    return os.path.join(folder(), _name() + ".sock")


def state_path() -> str:
    return os.path.join(folder(), _name() + ".json")


def log_path() -> str:
    return os.path.join(folder(), _name() + ".log")


def _source_roots() -> list[str]:
    """The folders pgmflow is imported from (the package and its Hydra plugins), as installed."""
    import pgmflow

    roots = [os.path.dirname(os.path.abspath(pgmflow.__file__))]
    plugins = os.path.join(os.path.dirname(roots[0]), "hydra_plugins")
    if os.path.isdir(plugins):
        roots.append(plugins)
    return roots


def _source_files() -> dict[str, list[int]]:
    """``{real path: [size, mtime_ns]}`` of every .py and config file under the real folders of pgmflow's
    installed files (an editable install links each file to the source tree: its folders are scanned, so a
    file edited there counts)."""
    real_dirs = set()
    for root in _source_roots():
        for d, dirs, files in os.walk(root, followlinks=True):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            for f in files:
                if f.endswith(SOURCE_SUFFIXES):
                    real_dirs.add(os.path.dirname(os.path.realpath(os.path.join(d, f))))
    out = {}
    for d in sorted(real_dirs):
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            if e.name.endswith(SOURCE_SUFFIXES):
                try:
                    st = e.stat()
                except OSError:
                    continue
                out[e.path] = [st.st_size, st.st_mtime_ns]
    return out


def _env() -> dict[str, str]:
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if (k.startswith(ENV_PREFIXES) or k in ENV_NAMES)
        and k not in ENV_PER_RUN
        and not k.startswith(ENV_PER_RUN_PREFIXES)
    }


def _site_packages() -> dict[str, int]:
    """The mtimes of the environment's site-packages folders: a package installed or removed changes them."""
    import sysconfig

    out = {}
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p and p not in out and os.path.isdir(p):
            out[p] = os.stat(p).st_mtime_ns
    return out


def fingerprint() -> dict:
    """What a server must share with a command to run it: ``{executable, files, env, site, digest}``."""
    fp = {
        "executable": os.path.realpath(sys.executable),
        "version": sys.version,
        "files": _source_files(),
        "env": _env(),
        "site": _site_packages(),
    }
    fp["digest"] = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()
    return fp


def mismatch(server: dict, mine: dict) -> str | None:
    """Why a server with fingerprint ``server`` may not run a command with fingerprint ``mine`` (None: it may)."""
    if server.get("digest") == mine["digest"]:
        return None
    if server.get("executable") != mine["executable"] or server.get("version") != mine["version"]:
        return f"it runs {server.get('executable')}, this command {mine['executable']}"
    theirs, ours = server.get("files", {}), mine["files"]
    changed = sorted(p for p in set(theirs) | set(ours) if theirs.get(p) != ours.get(p))
    if changed:
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        return f"pgmflow's files changed since it started ({changed[0]}{more})"
    env_s, env_m = server.get("env", {}), mine["env"]
    diff = sorted(k for k in set(env_s) | set(env_m) if env_s.get(k) != env_m.get(k))
    if diff:
        return f"the environment differs in {', '.join(diff[:4])}{' ...' if len(diff) > 4 else ''}"
    if server.get("site") != mine["site"]:
        return "packages were installed or removed since it started"
    return "its fingerprint differs"


def read_state() -> dict | None:
    try:
        with open(state_path()) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clean_stale() -> bool:
    """Remove the socket and record of a server whose process is gone; True if something was removed."""
    state = read_state()
    if state and _alive(int(state.get("pid", -1))):
        return False
    removed = False
    for p in (socket_path(), state_path()):
        try:
            os.unlink(p)
            removed = True
        except FileNotFoundError:
            pass
    return removed


# ---------------------------------------------------------------------------------------------------------------
# the command's side


def _eligible(argv: list[str]) -> bool:
    if (
        _IN_CHILD
        or getattr(sys, "_pgmflow_warm_child", False)
        or os.environ.get("PGMFLOW_WARM", "") == "0"
        or os.environ.get("PGMFLOW_SWEEP_JOB")
    ):
        return False
    if argv and (argv[0] in SUBCOMMANDS or (argv[0] == "cluster" and not any("=" in a for a in argv))):
        return False
    return not (any(a in ("-m", "--multirun") for a in argv) or "hydra.mode=MULTIRUN" in argv)


def _say(why: str) -> None:
    print(f"pgmflow: warm server not used: {why}; running in this process", file=sys.stderr, flush=True)


def _send(sock: socket.socket, msg: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(msg).encode()
    frame = struct.pack("!I", len(data)) + data
    if fds:
        n = socket.send_fds(sock, [frame], fds)
        if n < len(frame):
            sock.sendall(frame[n:])
    else:
        sock.sendall(frame)


def _recv_exact(sock: socket.socket, n: int, head: bytes = b"") -> bytes:
    buf = bytearray(head)
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket, with_fds: bool = False):
    """One framed message: ``msg`` (or ``(msg, fds)`` with ``with_fds``). ConnectionError at the end."""
    fds: list[int] = []
    data = b""
    if with_fds:
        data, fds, _flags, _addr = socket.recv_fds(sock, 65536, 8)
        if not data:
            raise ConnectionError("connection closed")
    data = _recv_exact(sock, 4, data)
    (length,) = struct.unpack("!I", data[:4])
    body = _recv_exact(sock, length, data[4:])
    msg = json.loads(body[:length])
    return (msg, fds) if with_fds else msg


def _connect(timeout: float | None = None) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(socket_path())
    except BaseException:
        s.close()
        raise
    return s


def run_warm(argv: list[str]) -> None:
    """Run this command in a child of the warm server and exit with its status; return (run here) when there is
    no server, the command is not one it runs, or the server does not match (one line on stderr says why)."""
    if not _eligible(argv):
        return
    sock_file = socket_path()
    if not os.path.exists(sock_file):
        return
    if _private_folder(create=False) is None:
        return _say(f"{folder()} is not a folder of this user with mode 0700")
    state = read_state()
    if state is None or not _alive(int(state.get("pid", -1))):
        _clean_stale()
        return _say("its process is gone (stale socket removed); start it again with: pgmflow warm start")
    why = mismatch(state.get("fingerprint", {}), mine := fingerprint())
    if why:
        return _say(f"{why}; restart it with: pgmflow warm start")
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            return _say(f"descriptor {fd} is closed")
    try:
        sock = _connect(timeout=10.0)
        _send(
            sock,
            {
                "op": "run",
                "v": PROTOCOL,
                "digest": mine["digest"],
                "argv": list(sys.argv),
                "path0": sys.path[0] if sys.path else "",
                "cwd": os.getcwd(),
                "env": dict(os.environ),
                "umask": _umask(),
            },
            [0, 1, 2],
        )
        reply = _recv(sock)
    except (OSError, ValueError, ConnectionError) as exc:
        if isinstance(exc, ConnectionRefusedError | FileNotFoundError):
            _clean_stale()
        return _say(f"it did not answer ({type(exc).__name__}: {exc})")
    if not reply.get("ok"):
        sock.close()
        return _say(str(reply.get("why", "it refused")))
    sock.settimeout(None)
    child = int(reply["pid"])

    def forward(signum, _frame):
        try:
            _send(sock, {"signal": signum})
        except OSError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        code = int(_recv(sock)["exit"])
    except (OSError, ValueError, KeyError, ConnectionError):
        print(
            f"pgmflow: error: the warm server went away while it ran this command (process {child})",
            file=sys.stderr,
            flush=True,
        )
        code = 1
    sock.close()
    if code < 0:  # the child died of a signal: so does this command
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code
    sys.exit(code)


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


# ---------------------------------------------------------------------------------------------------------------
# the server


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
    global _IN_CHILD
    code = 1
    try:
        _IN_CHILD = True
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


def serve(idle_s: float) -> int:
    """The background process: fingerprint, imports, socket, then fork a child per command until stopped."""
    import select
    import stat

    cwd = os.getcwd()
    if sys.path and os.path.abspath(sys.path[0] or ".") == cwd:
        del sys.path[0]  # python -m put the server's folder first; each child puts its command's there
    d = _private_folder(create=True)
    if d is None:
        print(f"pgmflow: error: {folder()} is not a folder of this user with mode 0700", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    fp = fingerprint()  # before the imports: a file edited while they run makes the server stale, not wrong
    notes = _preload()
    _blas_threads_down()
    preload_s = time.monotonic() - t0
    for n in notes:
        print(f"pgmflow warm: {n}", flush=True)
    live = threads()
    if len(live) != 1:
        print(f"pgmflow: error: the warm server holds threads after its imports: {live}", file=sys.stderr)
        return 1
    path = socket_path()
    tmp = f"{path}.{os.getpid()}.tmp"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(tmp)
    finally:
        os.umask(old)
    listener.listen(16)
    os.rename(tmp, path)  # in place only once it listens: a connection refused means a dead server
    state = {
        "pid": os.getpid(),
        "socket": path,
        "started": time.time(),
        "idle_s": idle_s,
        "preload_s": round(preload_s, 3),
        "fingerprint": fp,
    }
    with open(state_path() + ".tmp", "w") as f:
        json.dump(state, f)
    os.replace(state_path() + ".tmp", state_path())
    print(f"pgmflow warm: ready in {preload_s:.2f} s, pid {os.getpid()}, socket {path}", flush=True)

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stopping.append(True))
    signal.signal(signal.SIGCHLD, lambda *_: None)

    runs: dict[int, socket.socket] = {}  # child pid -> its command's connection
    kill_at: dict[int, float] = {}  # child pid -> when to SIGKILL it (its command went away)
    served = 0
    last = time.monotonic()

    def finish(pid: int, status: int) -> None:
        conn = runs.pop(pid, None)
        kill_at.pop(pid, None)
        code = os.waitstatus_to_exitcode(status)
        if conn is not None:
            try:
                _send(conn, {"exit": code})
            except OSError:
                pass
            conn.close()

    def kill(pid: int, sig: int, group: bool) -> None:
        try:
            (os.killpg if group else os.kill)(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def refuse(conn: socket.socket, why: str) -> None:
        try:
            _send(conn, {"ok": False, "why": why})
        except OSError:
            pass
        conn.close()

    def accept() -> None:
        nonlocal served, last
        conn, _ = listener.accept()
        conn.settimeout(10.0)
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():
            print(f"pgmflow warm: refused a connection from uid {uid}", flush=True)
            conn.close()
            return
        try:
            req, fds = _recv(conn, with_fds=True)
        except (OSError, ValueError, ConnectionError):
            conn.close()
            return
        try:
            op = req.get("op")
            if op == "status":
                _send(conn, {"ok": True, "pid": os.getpid(), "served": served, "running": len(runs)})
                conn.close()
                return
            if op == "stop":
                stopping.append(True)
                _send(conn, {"ok": True, "pid": os.getpid(), "running": len(runs)})
                conn.close()
                return
            if op != "run" or req.get("v") != PROTOCOL:
                return refuse(conn, f"it does not know {op!r} (protocol {req.get('v')})")
            if stopping:
                return refuse(conn, "it is stopping")
            if req.get("digest") != fp["digest"]:
                return refuse(conn, "its fingerprint differs from this command's")
            if len(runs) >= MAX_RUNS:
                return refuse(conn, f"it runs {len(runs)} commands already")
            if len(fds) < 3:
                return refuse(conn, "the descriptors did not arrive")
            _blas_threads_down()
            live = threads()
            if len(live) != 1:
                return refuse(conn, f"it holds threads ({', '.join(live)})")
            pid = os.fork()
            if pid == 0:
                _child(req, fds, [listener, conn, wake_r, wake_w, *runs.values()])  # never returns
            try:
                os.setpgid(pid, pid)  # also here: no race with a signal sent before the child did it
            except OSError:
                pass
            runs[pid] = conn
            served += 1
            last = time.monotonic()
            conn.settimeout(None)
            _send(conn, {"ok": True, "pid": pid})
        finally:
            for fd in fds:
                os.close(fd)

    try:
        while True:
            now = time.monotonic()
            if stopping and not runs:
                break
            if not runs and now - last > idle_s:
                print(f"pgmflow warm: idle for {idle_s:.0f} s: stopping", flush=True)
                break
            for pid, at in list(kill_at.items()):
                if now >= at:
                    kill(pid, signal.SIGKILL, group=True)
                    kill_at[pid] = now + 3600
            waits = (
                [wake_r] + ([] if stopping else [listener]) + [c for c in runs.values() if not isinstance(c, _Closed)]
            )
            timeout = min([idle_s - (now - last) if not runs else 60.0, 60.0, *[at - now for at in kill_at.values()]])
            poller = select.poll()
            byfd = {}
            for w in waits:
                fd = w if isinstance(w, int) else w.fileno()
                byfd[fd] = w
                poller.register(fd, select.POLLIN)
            ready = [byfd[fd] for fd, _ev in poller.poll(max(timeout, 0.05) * 1000.0)]
            if wake_r in ready:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            while runs:  # reap finished children
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                finish(pid, status)
                last = time.monotonic()
            if listener in ready and not stopping:
                try:
                    accept()
                except OSError as exc:
                    print(f"pgmflow warm: accept: {exc}", flush=True)
            for pid, conn in list(runs.items()):
                if conn not in ready:
                    continue
                try:
                    msg = _recv(conn)
                    sig = int(msg["signal"])
                    kill(pid, sig, group=sig != signal.SIGTERM)  # a terminal's ^C reaches the whole group
                except (OSError, ValueError, KeyError, ConnectionError):
                    # the command went away: stop its run (SIGTERM, then SIGKILL after a grace)
                    runs[pid] = _Closed()
                    conn.close()
                    kill(pid, signal.SIGTERM, group=True)
                    kill_at[pid] = time.monotonic() + KILL_GRACE_S
    finally:
        signal.set_wakeup_fd(-1)
        listener.close()
        for p in (path, state_path()):
            try:
                if p == state_path() and (read_state() or {}).get("pid") != os.getpid():
                    continue  # a newer server's record
                if (
                    p == path
                    and stat.S_ISSOCK(os.lstat(p).st_mode)
                    and (read_state() or {}).get("pid")
                    not in (
                        None,
                        os.getpid(),
                    )
                ):
                    continue
                os.unlink(p)
            except OSError:
                pass
        for pid in list(runs):
            kill(pid, signal.SIGTERM, group=True)
    print("pgmflow warm: stopped", flush=True)
    return 0


class _Closed:
    """Stands for a command's connection that has gone: select never reports it, sends fail."""

    def fileno(self) -> int:
        return -1

    def sendall(self, _data) -> None:
        raise OSError("closed")

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------------------------
# pgmflow warm start|status|stop


def _ask(op: str) -> dict | None:
    try:
        sock = _connect(timeout=10.0)
    except OSError:
        return None
    try:
        _send(sock, {"op": op, "v": PROTOCOL}, [0])
        return _recv(sock)
    except (OSError, ValueError, ConnectionError):
        return None
    finally:
        sock.close()


def _start(idle_s: float) -> int:
    import subprocess

    if _private_folder(create=True) is None:
        print(f"pgmflow: error: {folder()} is not a folder of this user with mode 0700", file=sys.stderr)
        return 1
    if len(socket_path()) > 100:
        print(f"pgmflow: error: the socket path {socket_path()} is too long for a Unix socket", file=sys.stderr)
        return 1
    _clean_stale()
    state = read_state()
    if state:
        why = mismatch(state.get("fingerprint", {}), fingerprint())
        if why is None:
            print(
                f"pgmflow: a warm server is already running (process {state['pid']}); stop it with: pgmflow warm stop"
            )
            return 0
        print(f"pgmflow: replacing the warm server (process {state['pid']}): {why}")
        _stop(quiet=True)
    cmd = [sys.executable, "-m", "pgmflow.core.warm", "--serve", str(idle_s)]
    with open(log_path(), "w") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=folder(),
            close_fds=True,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        state = read_state()
        if state and state.get("pid") == proc.pid and os.path.exists(socket_path()):
            print(
                f"pgmflow: warm server ready (process {proc.pid}, imports {state['preload_s']:.1f} s); single runs of "
                f"this environment go through it; it stops after {idle_s / 60:g} min idle or with: pgmflow warm stop"
            )
            return 0
        if proc.poll() is not None:
            with open(log_path()) as f:
                tail = f.read().strip().splitlines()
            last = tail[-1] if tail else "no output"
            print(f"pgmflow: error: the warm server did not start: {last} (log: {log_path()})", file=sys.stderr)
            return 1
        time.sleep(0.05)
    proc.terminate()
    print(f"pgmflow: error: the warm server did not start within {START_TIMEOUT_S:.0f} s", file=sys.stderr)
    return 1


def _status() -> int:
    if _clean_stale():
        print("pgmflow: no warm server running (removed the socket of one whose process is gone)")
        return 1
    state = read_state()
    if not state:
        print("pgmflow: no warm server running (start one with: pgmflow warm start)")
        return 1
    live = _ask("status") or {}
    why = mismatch(state.get("fingerprint", {}), fingerprint())
    up = time.time() - float(state.get("started", time.time()))
    print(
        f"pgmflow: warm server process {state['pid']}, up {up:.0f} s, imports {state.get('preload_s', 0):.1f} s, "
        f"{live.get('served', '?')} runs served, {live.get('running', '?')} running, stops after "
        f"{float(state.get('idle_s', IDLE_DEFAULT_S)) / 60:g} min idle; socket {state.get('socket')}"
    )
    print(
        "pgmflow: fingerprint: matches this environment (runs go through it)"
        if why is None
        else f"pgmflow: fingerprint: STALE ({why}); runs here run in their own process; restart: pgmflow warm start"
    )
    return 0


def _stop(quiet: bool = False) -> int:
    if _clean_stale():
        if not quiet:
            print("pgmflow: no warm server running (removed the socket of one whose process is gone)")
        return 0
    state = read_state()
    if not state:
        if not quiet:
            print("pgmflow: no warm server running")
        return 0
    pid = int(state["pid"])
    answer = _ask("stop")
    if answer is None:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        _clean_stale()
    if not quiet:
        print(f"pgmflow: stopped the warm server (process {pid})")
    return 0


def main(argv: list[str]) -> int:
    from pgmflow.core.errors import EXIT_BAD_INPUT

    args = list(argv[1:]) if argv and argv[0] == "warm" else list(argv)
    if args and args[0] == "--serve":
        return serve(float(args[1]))
    if not args or args[0] not in ("start", "status", "stop"):
        what = repr(args[0]) if args else "no command"
        print(f"pgmflow: error: warm: {what} is not a command; {USAGE}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args[0] == "start":
        rest = args[1:]
        idle_s = IDLE_DEFAULT_S
        if rest:
            try:
                if len(rest) != 2 or rest[0] != "--idle" or float(rest[1]) <= 0:
                    raise ValueError
                idle_s = float(rest[1]) * 60.0
            except ValueError:
                print(
                    f"pgmflow: error: warm start: {' '.join(rest)!r} is not --idle MINUTES (> 0); {USAGE}",
                    file=sys.stderr,
                )
                return EXIT_BAD_INPUT
        return _start(idle_s)
    if len(args) > 1:
        print(f"pgmflow: error: warm {args[0]} takes no arguments; {USAGE}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return _status() if args[0] == "status" else _stop()


if __name__ == "__main__":  # python -m pgmflow.core.warm: run as the module itself, whose _IN_CHILD main() reads
    from pgmflow.core import warm as _this

    sys.exit(_this.main(sys.argv[1:]))
