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

The modules: this one is the command's side (:func:`run_warm`, ``pgmflow warm start|status|stop``);
``pgmflow.core.warm_base`` what both sides share (where the server lives, the fingerprint, the protocol);
``pgmflow.core.warm_server`` the server's process (``python -m pgmflow.core.warm_server IDLE_SECONDS``) and
``pgmflow.core.warm_child`` what it loads and what a forked child does. The command's side never imports the
server's, so the CLI's import graph has no cycle.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from pgmflow.core.warm_base import (
    IDLE_DEFAULT_S,
    PROTOCOL,
    START_TIMEOUT_S,
    SUBCOMMANDS,
    USAGE,
    _alive,
    _clean_stale,
    _connect,
    _private_folder,
    _recv,
    _send,
    _umask,
    fingerprint,
    folder,
    log_path,
    mismatch,
    read_state,
    socket_path,
)

_IN_CHILD = False  # set in a child of the server: its main() must not look for a server again


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
    cmd = [sys.executable, "-m", "pgmflow.core.warm_server", str(idle_s)]
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
