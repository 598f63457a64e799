"""Runs on the test hosts, and what they left in the MLflow server's store (read as files: the test
process never connects to a test address)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("artifact_digest", REPO / "benchmarks" / "artifact_digest.py")
artifact_digest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(artifact_digest)

NET_CLUSTER = Path(__file__).with_name("cluster.yaml")


def digest_dir(base: Path) -> dict:
    """Digests of every artifact under ``base`` (benchmarks/artifact_digest.py: timings left out)."""
    out = {}
    for p in sorted(base.rglob("*")):
        if p.is_file():
            d = artifact_digest.digest_file(p)
            if d is not None:
                out[str(p.relative_to(base))] = d
    return out


def pgmflow_here(args: list[str], work: Path) -> subprocess.CompletedProcess:
    """``pgmflow ARGS`` on this host, outside the test hosts (no network), in ``work`` with its own SQLite
    store there; asserts that it succeeded."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(work), "MPLBACKEND": "Agg"}
    r = subprocess.run(
        [sys.executable, "-m", "pgmflow", *args, f"tracking.uri=sqlite:///{work / 'mlflow.db'}"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    return r


def local_reference(overrides: list[str], work: Path) -> tuple[dict, dict]:
    """The same run on the synchronous scheduler in a subprocess of this host (no network): its artifact
    digests and final metrics (timings left out)."""
    work.mkdir(parents=True, exist_ok=True)
    r = pgmflow_here([*overrides, "cluster.profile=synchronous"], work)
    run_id = run_id_of(r.stdout)
    store = Store(f"sqlite:///{work / 'mlflow.db'}")
    return digest_dir(store.artifact_dir(run_id, local_root=work)), store.results(run_id)


def run_id_of(stdout: str) -> str:
    for line in stdout.splitlines():
        if line.startswith("pgmflow: ") and " run " in line:
            return line.split(" run ")[1].split()[0]
    raise AssertionError(f"no run id in the output: {stdout[-2000:]}")


class Store:
    """An MLflow SQLite store read directly (the server's, through its file)."""

    def __init__(self, uri: str, artifacts: Path | None = None):
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        self.artifacts = artifacts

    def artifact_dir(self, run_id: str, local_root: Path | None = None) -> Path:
        uri = self.client.get_run(run_id).info.artifact_uri
        if uri.startswith("mlflow-artifacts:/"):
            return self.artifacts / uri[len("mlflow-artifacts:/") :].lstrip("/")
        if uri.startswith("file://"):
            return Path(uri[len("file://") :])
        p = Path(uri)
        return p if p.is_absolute() else (local_root or Path.cwd()) / p

    def results(self, run_id: str) -> dict:
        from pgmflow.core.reproduce import TIMING

        m = self.client.get_run(run_id).data.metrics
        return {k: v for k, v in m.items() if not TIMING.search(k) and "rss" not in k and "seconds" not in k}

    def assert_one_value_per_step(self, run_id: str):
        for key in self.client.get_run(run_id).data.metrics:
            steps = [m.step for m in self.client.get_metric_history(run_id, key)]
            assert len(steps) == len(set(steps)), (
                f"run {run_id}: metric {key} has two values at one step: {sorted(steps)}"
            )

    def runs(self, experiment: str = "pgmflow"):
        exp = self.client.get_experiment_by_name(experiment)
        return [] if exp is None else self.client.search_runs([exp.experiment_id], max_results=10000)


class DriverRun:
    """``pgmflow ARGS`` running inside the driver host, its output read line by line as it comes."""

    def __init__(self, hosts, args: list[str], work: Path, extra_env: dict | None = None):
        work.mkdir(parents=True, exist_ok=True)
        self.hosts, self.work = hosts, work
        env = {**hosts.env, "HOME": str(work), **(extra_env or {})}
        argv = [str(Path(sys.executable).with_name("pgmflow")), *args, f"tracking.uri={hosts.net.mlflow_uri}"]
        net = hosts.net
        cmd = [
            "ip",
            "netns",
            "exec",
            net.ns("driver"),
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            "driver",
        ]
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(
            [*cmd, *argv],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        net.procs.append(_Tracked(self.p))
        self.lines: list[tuple[float, str]] = []
        self.err: list[str] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()
        self._e = threading.Thread(target=lambda: self.err.extend(self.p.stderr), daemon=True)
        self._e.start()
        self.t_exit: float | None = None  # time.monotonic() when the process ended, set by the reaper
        self._w = threading.Thread(target=self._reap, daemon=True)
        self._w.start()

    def _reap(self):
        self.p.wait()
        self.t_exit = time.monotonic()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append((time.monotonic() - self.t0, line.rstrip("\n")))

    @property
    def stdout(self) -> str:
        return "\n".join(line for _, line in self.lines)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def wait(self, timeout: float = 600) -> int:
        """The exit code; sets ``wall``: seconds from the start until the process ended. That is when the reaper
        saw it end, not when this is called: a test calls this after its fault's block, and a run that finished
        during the fault (a worker's fault: the other workers did the work) had ended long before. (Measured at
        this call, a run that finished 14 s into a 25 s cut-off counted until the cut-off's end, which
        docs/reliability.md had taken for the process waiting 11-24 s at exit; it ended 0.5-0.7 s after.)"""
        rc = self.p.wait(timeout)
        self._w.join(10)
        self._t.join(10)
        self._e.join(10)
        self.wall = (self.t_exit if self.t_exit is not None else time.monotonic()) - self.t0
        return rc

    def run_id(self, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for _, line in self.lines:
                if line.startswith("pgmflow: ") and " run " in line:
                    return line.split(" run ")[1].split()[0]
            if self.p.poll() is not None and not self._t.is_alive():
                break
            time.sleep(0.2)
        raise AssertionError(f"the run did not start: {self.stdout[-2000:]} {self.stderr[-3000:]}")


class _Tracked:
    """A driver process in TestNet.procs, so that teardown stops it and leftovers() sees it."""

    def __init__(self, popen):
        self.popen, self.host, self.name = popen, "driver", "pgmflow"

    @property
    def pid(self):
        return self.popen.pid

    def alive(self):
        return self.popen.poll() is None


def wait_until(pred, timeout: float, every: float = 0.5, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"{what} did not hold within {timeout} s")
