"""Shared by the warm server (``pgmflow.core.warm_server``) and the commands that use it (``pgmflow.core.warm``):
where it lives, the fingerprint both sides must match, its state file and the message protocol."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import sys

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
    "PGMFLOW_MRF_PLAN",
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
    """Whether process ``pid`` exists (another user's counts: it is not ours to reuse the record of)."""
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


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m
