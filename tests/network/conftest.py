"""Several hosts for the tests in tests/network (``make test-network``): see :mod:`tests.network.hosts`.

The ``net`` session fixture makes the hosts (driver, scheduler, slurmctld, worker1-3, mlflow), checks their routes,
and starts the daemons inside them: an ``mlflow server`` with a SQLite store on ``mlflow``, ``dask
scheduler`` on ``scheduler`` and one ``dask worker`` (with its nanny) on each worker host, all from this
checkout's virtual environment. At the end it stops everything and removes every namespace, and fails
the session if anything is left (``TestNet.leftovers``). Not root, or a tool missing: every test here
skips with the reason.

Tests here are marked ``network`` and deselected unless the marker expression names ``network``
(``make test-network`` runs ``pytest -m network tests/network``).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.network.hosts import TestNet, why_not

BIN = Path(sys.executable).parent
WORKERS = ("worker1", "worker2", "worker3")
# The Dask settings the daemons of the test cluster start with: those of the `address` profile of
# tests/network/cluster.yaml, shortened so that each fault costs seconds, not minutes (docs/clusters.md
# gives the production values and the reasons). Set as DASK_* variables, as an operator would.
DAEMON_DASK = {
    "DASK_DISTRIBUTED__COMM__TIMEOUTS__TCP": "12s",
    "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "10s",
    "DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "10s",
    "DASK_DISTRIBUTED__COMM__RETRY__COUNT": "3",
    "DASK_DISTRIBUTED__WORKER__PROFILE__INTERVAL": "100ms",
    "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "500ms",
    "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "2s",
    "DASK_DISTRIBUTED__LOGGING__DISTRIBUTED": "info",
}
BASE_ENV = {
    "PYTHONPATH": str(REPO),
    "PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
    "PGMFLOW_ALLOWED_MODULES": "tests",
    "MPLBACKEND": "Agg",
    "NUMBA_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    "no_proxy": "*",
    "NO_PROXY": "*",
}


def pytest_collection_modifyitems(config, items):
    if "network" in (config.getoption("markexpr", "") or ""):
        return
    keep = [item for item in items if "network" not in item.keywords]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if "network" in item.keywords])
        items[:] = keep


class Cluster:
    """The running daemons of the test hosts, and how to restart them."""

    def __init__(self, net: TestNet, root: Path, mlflow_template: Path | None):
        self.net, self.root = net, root
        self.store = root / "mlflow"
        self.store.mkdir()
        if mlflow_template is not None:
            shutil.copyfile(mlflow_template, self.store / "server.db")
        self.workers: dict = {}
        self.scheduler = None
        self.mlflow = None

    @property
    def env(self) -> dict:
        return {**BASE_ENV, "HOME": str(self.root), **DAEMON_DASK}

    def start_mlflow(self):
        self.mlflow = self.net.spawn(
            "mlflow",
            "mlflow",
            [
                str(BIN / "mlflow"),
                "server",
                "--host",
                self.net.ip("mlflow"),
                "--port",
                "5000",
                "--backend-store-uri",
                f"sqlite:///{self.store / 'server.db'}",
                "--artifacts-destination",
                str(self.store / "artifacts"),
                "--workers",
                "1",
                # 198.18.0.0/15 is not among MLflow's default "private" hosts: name the address
                "--allowed-hosts",
                f"{self.net.ip('mlflow')}:5000,{self.net.ip('mlflow')},mlflow:5000,mlflow",
            ],
            env=self.env,
            cwd=self.store,
        )

    def start_scheduler(self):
        self.scheduler = self.net.spawn(
            "scheduler",
            "scheduler",
            [
                str(BIN / "dask"),
                "scheduler",
                "--host",
                self.net.ip("scheduler"),
                "--port",
                "8786",
                "--no-dashboard",
                "--preload",
                str(Path(__file__).with_name("task_log.py")),
            ],
            env={**self.env, "PGMFLOW_NET_TASK_LOG": str(self.task_log)},
            cwd=self.root,
        )

    @property
    def task_log(self) -> Path:
        return self.root / "tasks.log"

    def events_since(self, t0: float) -> list[tuple[float, str, str]]:
        """(unix time, worker or ADD/REMOVE, key or worker) of the scheduler's task log after ``t0``."""
        out = []
        if self.task_log.exists():
            for line in self.task_log.read_text().splitlines():
                parts = line.split(" ", 2)
                if len(parts) == 3 and float(parts[0]) >= t0:
                    out.append((float(parts[0]), parts[1], parts[2]))
        return out

    def start_worker(self, host: str):
        wdir = self.root / f"dask-{host}"
        wdir.mkdir(exist_ok=True)
        self.workers[host] = self.net.spawn(
            host,
            "worker",
            [
                str(BIN / "dask"),
                "worker",
                self.net.scheduler_address,
                "--host",
                self.net.ip(host),
                "--name",
                host,
                "--nthreads",
                "1",
                "--nworkers",
                "1",
                "--memory-limit",
                "3GB",
                "--no-dashboard",
                "--local-directory",
                str(wdir),
            ],
            env=self.env,
            cwd=self.root,
        )

    def probe(self, host: str, code: str, timeout: float = 30) -> str:
        """Run a little Python inside ``host`` (e.g. to ask the scheduler something); its stdout."""
        r = self.net.run_in(host, [sys.executable, "-c", code], env=self.env, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"probe in {host} failed: {r.stderr[-1500:]}")
        return r.stdout

    def worker_names(self) -> list[str]:
        code = (
            "from distributed import Client\n"
            f"c = Client({self.net.scheduler_address!r}, timeout=5)\n"
            "print(' '.join(sorted(w['name'] for w in c.scheduler_info(n_workers=-1)['workers'].values())))\n"
            "c.close()\n"
        )
        try:
            return self.probe("driver", code, timeout=30).split()
        except Exception:
            return []

    def wait_for_workers(self, names=WORKERS, timeout: float = 90):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            have = self.worker_names()
            if set(names) <= set(have):
                return have
            for h in names:  # a worker whose nanny gave up (removed after a long partition): start it again
                if h in self.workers and not self.workers[h].alive():
                    self.start_worker(h)
            time.sleep(1)
        raise RuntimeError(
            f"workers {names} did not join within {timeout} s (have {self.worker_names()}); "
            + " | ".join(f"{h}: {p.tail(800)}" for h, p in self.workers.items())
        )

    def wait_for_mlflow(self, timeout: float = 90):
        code = (
            "import urllib.request\n"
            f"print(urllib.request.urlopen({self.net.mlflow_uri + '/health'!r}, timeout=2).status)\n"
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.mlflow.alive():
                raise RuntimeError(f"mlflow server exited: {self.mlflow.tail()}")
            try:
                if self.probe("driver", code, timeout=10).strip() == "200":
                    return
            except Exception:
                pass
            time.sleep(1)
        raise RuntimeError(f"mlflow server did not answer within {timeout} s: {self.mlflow.tail()}")

    def ensure(self):
        """Every daemon up and all three workers joined (after a test that broke something)."""
        if self.scheduler is None or not self.scheduler.alive():
            self.start_scheduler()
        for h in WORKERS:
            if h not in self.workers or not self.workers[h].alive():
                self.start_worker(h)
        if self.mlflow is None or not self.mlflow.alive():
            self.start_mlflow()
        self.wait_for_mlflow()
        self.wait_for_workers()


@pytest.fixture(scope="session")
def net(request):
    """The test hosts (TestNet), removed at the end of the session; fails the session on leftovers."""
    reason = why_not()
    if reason:
        pytest.skip(f"no test network: {reason}")
    root = Path(tempfile.mkdtemp(prefix="pgmflow-net-"))
    n = TestNet(root)

    def interrupted(signum, frame):  # `timeout`, a CI's cancel: tear down on the way out too
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, interrupted)
    try:
        n.build()  # ends with check_routes(): raises before any traffic when a route is wrong
        yield n
    finally:
        n.teardown()
        signal.signal(signal.SIGTERM, old)
        left = n.leftovers()
        if os.environ.get("PGMFLOW_NET_KEEP") is None:
            shutil.rmtree(root, ignore_errors=True)
        if left:
            pytest.fail(f"the test network left behind: {', '.join(left)}")


@pytest.fixture(scope="session")
def hosts(net, request):
    """The daemons running on the test hosts (Cluster), all three workers joined."""
    template = None
    with __import__("contextlib").suppress(Exception):
        template = request.getfixturevalue("mlflow_template")
    c = Cluster(net, net.root, template)
    c.start_mlflow()
    c.start_scheduler()
    for h in WORKERS:
        c.start_worker(h)
    c.wait_for_mlflow()
    c.wait_for_workers()
    return c


@pytest.fixture
def cluster_up(hosts):
    """``hosts``, every daemon checked (and restarted where a previous test left one down) before the test."""
    hosts.ensure()
    return hosts


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The fault figures of tests/network/test_faults.py (docs/reliability.md), and with
    ``PGMFLOW_NET_FIGURES=path`` the same table as markdown in that file."""
    import sys as _sys

    mod = _sys.modules.get("tests.network.test_faults")
    if mod is not None:
        mod.write_figures(os.environ.get("PGMFLOW_NET_FIGURES"), terminalreporter)
