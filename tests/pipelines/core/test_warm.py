"""``pgmflow warm``: a server that has imported everything forks a child per command (pgmflow.core.warm).

Real processes throughout: one warm server for the module, started with a temporary HOME and
XDG_RUNTIME_DIR, and ``pgmflow`` commands in temporary folders with a migrated MLflow store (tests/conftest.py).
A run through the server gives the bits and exit codes of the same command in its own process; a server whose
fingerprint differs is not used (one line says why); the socket is private to its user; a dead server's socket
is cleaned up; sweeps and subcommands never go through the server.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TIMING = re.compile(r"seconds|per_s|per_ns|rss|wall|_time|elapsed")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("warm")
    (base / "home").mkdir()
    (base / "xdg").mkdir(mode=0o700)
    e = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(base / "home"), "XDG_RUNTIME_DIR": str(base / "xdg")}
    e.pop("PGMFLOW_IN_PROCESS", None)  # debug runs: small work in the driver (the key's own default)
    e.pop("PGMFLOW_WARM", None)
    return e


def pgmflow(args, cwd, env, timeout=120, **extra):
    return subprocess.run(
        [sys.executable, "-m", "pgmflow", *args],
        cwd=cwd,
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def served(env) -> int:
    r = pgmflow(["warm", "status"], "/", env)
    assert r.returncode == 0, r.stdout + r.stderr
    return int(re.search(r"(\d+) runs served", r.stdout).group(1))


@pytest.fixture(scope="module")
def server(env, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("warm_start")
    r = pgmflow(["warm", "start", "--idle", "10"], cwd, env, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warm server ready" in r.stdout
    state = json.loads(next((Path(env["XDG_RUNTIME_DIR"]) / "pgmflow").glob("warm-*.json")).read_text())
    yield state
    pgmflow(["warm", "stop"], cwd, env)


def metrics(folder: Path) -> dict:
    """The run's metrics less its timings (the store's own rows: every logged value, every step)."""
    with sqlite3.connect(folder / "mlflow.db") as db:
        rows = db.execute("SELECT key, step, value FROM metrics ORDER BY key, step, timestamp").fetchall()
    return {(k, s): v for k, s, v in rows if not TIMING.search(k)}


def results(folder: Path) -> dict:
    (path,) = folder.glob("mlartifacts/*/artifacts/results.json")
    return {k: v for k, v in json.loads(path.read_text()).items() if not TIMING.search(k)}


def test_a_warm_run_gives_the_bits_of_a_cold_run(server, env, tmp_path):
    args = ["pipeline=svi", "debug=default", "progress=false"]
    (tmp_path / "cold").mkdir()
    (tmp_path / "warm").mkdir()
    for d in ("cold", "warm"):
        (tmp_path / d / "mlflow.db").write_bytes((tmp_path / "mlflow.db").read_bytes())
    before = served(env)
    t = time.monotonic()
    warm = pgmflow(args, tmp_path / "warm", env)
    warm_s = time.monotonic() - t
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert "warm server not used" not in warm.stderr
    assert served(env) == before + 1  # it went through the server
    cold = pgmflow(args, tmp_path / "cold", env, PGMFLOW_WARM="0")
    assert cold.returncode == 0, cold.stderr[-3000:]
    assert "finished. MLflow run" in warm.stdout and "topic" in warm.stdout
    assert metrics(tmp_path / "warm") == metrics(tmp_path / "cold") != {}
    assert results(tmp_path / "warm") == results(tmp_path / "cold")
    # the same lines on the same descriptors, less the run's identity and where it ran
    strip = re.compile(r"[0-9a-f]{32}|/\S*/(cold|warm)\b\S*|[\d.]+ documents/s")
    assert strip.sub("X", warm.stdout) == strip.sub("X", cold.stdout)
    print(f"warm run {warm_s:.2f} s")


def test_exit_codes_and_messages_are_those_of_a_cold_run(server, env, tmp_path):
    bad = ["pipeline=svi", "debug=default", "svi.nosuch=1"]
    w, c = pgmflow(bad, tmp_path, env), pgmflow(bad, tmp_path, env, PGMFLOW_WARM="0")
    assert w.returncode == c.returncode == 2
    assert w.stderr == c.stderr and len(w.stderr.strip().splitlines()) == 1, w.stderr
    # a run that fails while it runs: exit code 1 and its one line, from the child as from a fresh process
    before = served(env)
    failing = ["pipeline=bounds", "debug=default", "progress=false"]
    w = pgmflow(failing, tmp_path, env, PGMFLOW_BLAS_THREADS="x")
    assert served(env) == before + 1
    c = pgmflow(failing, tmp_path, env, PGMFLOW_BLAS_THREADS="x", PGMFLOW_WARM="0")
    assert w.returncode == c.returncode == 1
    assert w.stderr.strip().splitlines()[-1] == c.stderr.strip().splitlines()[-1]
    assert "PGMFLOW_BLAS_THREADS='x' is not a whole number" in w.stderr


def test_a_stale_server_is_not_used_and_says_why(server, env, tmp_path):
    before = served(env)
    r = pgmflow(["--cfg", "job", "seed=5"], tmp_path, env, PGMFLOW_UNUSED_SETTING="1")
    assert r.returncode == 0 and "seed: 5" in r.stdout
    lines = [ln for ln in r.stderr.splitlines() if "warm server not used" in ln]
    assert len(lines) == 1 and "PGMFLOW_UNUSED_SETTING" in lines[0], r.stderr
    assert served(env) == before
    # a source file edited since the server started (its mtime, put back afterwards)
    path = os.path.realpath(REPO / "pipelines" / "core" / "warm.py")
    st = os.stat(path)
    try:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        status = pgmflow(["warm", "status"], tmp_path, env)
        assert "STALE" in status.stdout and "warm.py" in status.stdout, status.stdout
        r = pgmflow(["--cfg", "job"], tmp_path, env)
        assert r.returncode == 0
        assert "warm server not used: pgmflow's files changed" in r.stderr and "warm.py" in r.stderr
    finally:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert "matches this environment" in pgmflow(["warm", "status"], tmp_path, env).stdout
    assert served(env) == before


def test_the_socket_is_private_and_other_users_are_refused(server, env):
    folder = Path(server["socket"]).parent
    assert (folder.stat().st_mode & 0o777) == 0o700 and folder.stat().st_uid == os.getuid()
    if os.getuid() != 0:
        pytest.skip("connecting as another user needs root")
    mode = folder.stat().st_mode & 0o777
    sock_mode = os.stat(server["socket"]).st_mode & 0o777
    try:  # let uid 65534 reach the socket: only the server's own check stands in the way
        os.chmod(folder, 0o711)
        os.chmod(server["socket"], 0o777)
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            code = 3
            try:
                os.chdir(folder)  # the folders above are root's own (0700): reach the socket from its folder
                os.setgid(65534)
                os.setuid(65534)
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(10)
                s.connect(os.path.basename(server["socket"]))
                try:
                    s.sendall(b"\0\0\0\x02{}")
                    code = 0 if s.recv(100) == b"" else 4  # closed without an answer
                except (BrokenPipeError, ConnectionResetError):
                    code = 0  # closed before the request
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    finally:
        os.chmod(folder, mode)
        os.chmod(server["socket"], sock_mode)
    assert os.waitstatus_to_exitcode(status) == 0
    log = next(folder.glob("warm-*.log")).read_text()
    assert "refused a connection from uid 65534" in log


def test_interrupt_is_forwarded_and_a_lost_client_stops_its_run(server, env, tmp_path):
    long = ["pipeline=tempering", "cluster.profile=synchronous", "progress=false"]  # tens of seconds of work

    def start():
        p = subprocess.Popen(
            [sys.executable, "-m", "pgmflow", *long], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True
        )
        assert "tempering run" in p.stdout.readline()  # the run has started, in a child of the server
        return p

    def children() -> list[int]:
        path = Path(f"/proc/{server['pid']}/task/{server['pid']}/children")
        return [int(x) for x in path.read_text().split()]

    p = start()
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=30) == 130
    p = start()
    assert len(children()) == 1
    p.kill()  # the command dies without a word: the server stops its run
    p.wait()
    deadline = time.monotonic() + 20
    while children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert children() == []


def test_stop_and_a_stale_socket(env, tmp_path):
    from pgmflow.core import warm_base

    e = {**env, "XDG_RUNTIME_DIR": str(tmp_path / "xdg")}
    (tmp_path / "xdg").mkdir(mode=0o700)
    folder = tmp_path / "xdg" / "pgmflow"
    folder.mkdir(mode=0o700)
    name = warm_base._name()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (folder / f"{name}.json").write_text(json.dumps({"pid": dead.pid, "fingerprint": {}}))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(folder / f"{name}.sock"))  # a socket file nobody listens on
    s.close()
    r = pgmflow(["--cfg", "job"], tmp_path, e)
    assert r.returncode == 0
    assert "its process is gone (stale socket removed)" in r.stderr
    assert not (folder / f"{name}.sock").exists() and not (folder / f"{name}.json").exists()
    r = pgmflow(["warm", "status"], tmp_path, e)
    assert r.returncode == 1 and "no warm server running" in r.stdout
    assert pgmflow(["warm", "stop"], tmp_path, e).stdout.startswith("pgmflow: no warm server running")
    r = pgmflow(["warm", "nosuch"], tmp_path, e)
    assert r.returncode == 2 and "usage: pgmflow warm start" in r.stderr


@pytest.mark.parametrize(
    "argv, warm_ok",
    [
        (["pipeline=svi", "debug=default"], True),
        (["--cfg", "job"], True),
        (["-m", "seed=0,1"], False),
        (["--multirun", "seed=0,1"], False),
        (["hydra.mode=MULTIRUN", "seed=0,1"], False),
        (["reproduce", "abc"], False),
        (["cluster", "start"], False),
        (["cache", "ls"], False),
        (["warm", "status"], False),
    ],
)
def test_only_single_runs_go_through_the_server(argv, warm_ok, monkeypatch):
    from pgmflow.core import warm

    monkeypatch.delenv("PGMFLOW_WARM", raising=False)
    monkeypatch.delenv("PGMFLOW_SWEEP_JOB", raising=False)
    assert warm._eligible(argv) is warm_ok
    monkeypatch.setenv("PGMFLOW_WARM", "0")
    assert warm._eligible(argv) is False
