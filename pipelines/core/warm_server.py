"""The warm server's process (``python -m pgmflow.core.warm_server IDLE_SECONDS``, started by ``pgmflow warm
start``, ``pgmflow.core.warm``): imports, socket, then a child forked per command until stopped."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time

from pgmflow.core.warm_base import (
    KILL_GRACE_S,
    MAX_RUNS,
    PROTOCOL,
    _private_folder,
    _recv,
    _send,
    fingerprint,
    folder,
    read_state,
    socket_path,
    state_path,
)
from pgmflow.core.warm_child import _blas_threads_down, _child, _preload, threads


def serve(idle_s: float) -> int:
    """The background process: fingerprint, imports, socket, then fork a child per command until stopped."""
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
    server = _Server(listener, path, fp, idle_s)
    try:
        while server.step():
            pass
    finally:
        server.close()
    print("pgmflow warm: stopped", flush=True)
    return 0


def _kill(pid: int, sig: int, group: bool) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _refuse(conn: socket.socket, why: str) -> None:
    try:
        _send(conn, {"ok": False, "why": why})
    except OSError:
        pass
    conn.close()


class _Server:
    """The server's loop and what it holds: the listening socket, the runs (child pid -> its command's
    connection), the runs to kill (their command went away), the signal pipe."""

    def __init__(self, listener: socket.socket, path: str, fp: dict, idle_s: float):
        self.listener, self.path, self.fp, self.idle_s = listener, path, fp, idle_s
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        self.stopping: list[bool] = []
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: self.stopping.append(True))
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.runs: dict[int, socket.socket] = {}  # child pid -> its command's connection
        self.kill_at: dict[int, float] = {}  # child pid -> when to SIGKILL it (its command went away)
        self.served = 0
        self.last = time.monotonic()

    def finish(self, pid: int, status: int) -> None:
        conn = self.runs.pop(pid, None)
        self.kill_at.pop(pid, None)
        code = os.waitstatus_to_exitcode(status)
        if conn is not None:
            try:
                _send(conn, {"exit": code})
            except OSError:
                pass
            conn.close()

    def accept(self) -> None:
        conn, _ = self.listener.accept()
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
            self.answer(conn, req, fds)
        finally:
            for fd in fds:
                os.close(fd)

    def answer(self, conn: socket.socket, req: dict, fds: list[int]) -> None:
        op = req.get("op")
        if op in ("status", "stop"):
            if op == "stop":
                self.stopping.append(True)
            _send(conn, {"ok": True, "pid": os.getpid(), "served": self.served, "running": len(self.runs)})
            conn.close()
            return
        if op != "run" or req.get("v") != PROTOCOL:
            return _refuse(conn, f"it does not know {op!r} (protocol {req.get('v')})")
        if self.stopping:
            return _refuse(conn, "it is stopping")
        if req.get("digest") != self.fp["digest"]:
            return _refuse(conn, "its fingerprint differs from this command's")
        if len(self.runs) >= MAX_RUNS:
            return _refuse(conn, f"it runs {len(self.runs)} commands already")
        if len(fds) < 3:
            return _refuse(conn, "the descriptors did not arrive")
        _blas_threads_down()
        live = threads()
        if len(live) != 1:
            return _refuse(conn, f"it holds threads ({', '.join(live)})")
        pid = os.fork()
        if pid == 0:  # never returns
            _child(req, fds, [self.listener, conn, self.wake_r, self.wake_w, *self.runs.values()])
        try:
            os.setpgid(pid, pid)  # also here: no race with a signal sent before the child did it
        except OSError:
            pass
        self.runs[pid] = conn
        self.served += 1
        self.last = time.monotonic()
        conn.settimeout(None)
        _send(conn, {"ok": True, "pid": pid})

    def wait(self) -> list:
        """Block until a connection, a command's message, a signal or a deadline; what is ready."""
        import select

        now = time.monotonic()
        waits = [self.wake_r] + ([] if self.stopping else [self.listener])
        waits += [c for c in self.runs.values() if not isinstance(c, _Closed)]
        deadlines = [at - now for at in self.kill_at.values()]
        timeout = min([self.idle_s - (now - self.last) if not self.runs else 60.0, 60.0, *deadlines])
        poller = select.poll()
        byfd = {}
        for w in waits:
            fd = w if isinstance(w, int) else w.fileno()
            byfd[fd] = w
            poller.register(fd, select.POLLIN)
        ready = [byfd[fd] for fd, _ev in poller.poll(max(timeout, 0.05) * 1000.0)]
        if self.wake_r in ready:
            try:
                while os.read(self.wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        return ready

    def step(self) -> bool:
        """One turn of the loop; False when the server should stop."""
        now = time.monotonic()
        if self.stopping and not self.runs:
            return False
        if not self.runs and now - self.last > self.idle_s:
            print(f"pgmflow warm: idle for {self.idle_s:.0f} s: stopping", flush=True)
            return False
        for pid, at in list(self.kill_at.items()):
            if now >= at:
                _kill(pid, signal.SIGKILL, group=True)
                self.kill_at[pid] = now + 3600
        ready = self.wait()
        while self.runs:  # reap finished children
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            self.finish(pid, status)
            self.last = time.monotonic()
        if self.listener in ready and not self.stopping:
            try:
                self.accept()
            except OSError as exc:
                print(f"pgmflow warm: accept: {exc}", flush=True)
        for pid, conn in list(self.runs.items()):
            if conn in ready:
                self.relay(pid, conn)
        return True

    def relay(self, pid: int, conn: socket.socket) -> None:
        """A message from a running command: a signal to pass on, or its end (it went away: stop its run)."""
        try:
            msg = _recv(conn)
            sig = int(msg["signal"])
            _kill(pid, sig, group=sig != signal.SIGTERM)  # a terminal's ^C reaches the whole group
        except (OSError, ValueError, KeyError, ConnectionError):
            self.runs[pid] = _Closed()  # SIGTERM now, SIGKILL after a grace
            conn.close()
            _kill(pid, signal.SIGTERM, group=True)
            self.kill_at[pid] = time.monotonic() + KILL_GRACE_S

    def close(self) -> None:
        import stat

        signal.set_wakeup_fd(-1)
        self.listener.close()
        for p in (self.path, state_path()):
            try:
                owner = (read_state() or {}).get("pid")
                if p == state_path() and owner != os.getpid():
                    continue  # a newer server's record
                if p == self.path and stat.S_ISSOCK(os.lstat(p).st_mode) and owner not in (None, os.getpid()):
                    continue
                os.unlink(p)
            except OSError:
                pass
        for pid in list(self.runs):
            _kill(pid, signal.SIGTERM, group=True)


class _Closed:
    """Stands for a command's connection that has gone: select never reports it, sends fail."""

    def fileno(self) -> int:
        return -1

    def sendall(self, _data) -> None:
        raise OSError("closed")

    def close(self) -> None:
        pass


def main(argv: list[str]) -> int:
    """``python -m pgmflow.core.warm_server IDLE_SECONDS``: serve until stopped or idle that long."""
    if len(argv) != 1:
        print("usage: python -m pgmflow.core.warm_server IDLE_SECONDS (pgmflow warm start runs it)", file=sys.stderr)
        return 2
    return serve(float(argv[0]))


if __name__ == "__main__":  # run as pgmflow.core.warm_server itself, not as a second copy named __main__
    from pgmflow.core import warm_server as _this

    sys.exit(_this.main(sys.argv[1:]))
