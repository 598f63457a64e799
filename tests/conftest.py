"""Shared fixtures: real Hydra composition, real MLflow stores in temporary directories, real
LocalClusters with worker processes (session-scoped, shared through the `address` profile)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"
sys.path.insert(0, str(REPO))
# the test densities (tests/pipelines/densities.py) may be imported by configs; the CLI subprocesses
# inherit this, and tests/test_security.py checks what stays refused
os.environ.setdefault("PGMFLOW_ALLOWED_MODULES", "tests")
# tests on the local profile are about its worker processes: small work must not run in-process there
# unless a test asks for it (cluster.in_process=auto; pgmflow.core.smallwork)
os.environ.setdefault("PGMFLOW_IN_PROCESS", "false")


def compose(overrides=()) -> dict:
    """The resolved config for these overrides, composed by Hydra exactly as the CLI does."""
    from hydra import compose as hcompose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = hcompose("config", overrides=list(overrides))
    d = OmegaConf.to_container(cfg, resolve=True)
    d.pop("hydra", None)
    return d


def gpu_available() -> bool:
    from pgmflow.tasks import backend

    return backend.gpu_status()[0]


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def numba_kernels_compiled(tmp_path_factory):
    """Compile the numba kernels into numba's on-disk cache once, in two processes in parallel, before
    the first test (tests/warm_kernels.py says why). ``PGMFLOW_TEST_WARM=0`` skips it."""
    import subprocess
    import time

    import pgmflow.tasks

    # numba caches beside the module as imported: the editable install's link tree (build/), not tasks/
    tasks = Path(pgmflow.tasks.__file__).parent
    cached = {p.name.split("-")[0].split(".")[0] for p in tasks.rglob("__pycache__/*.nbi")}
    if (
        os.environ.get("PGMFLOW_TEST_WARM", "1") == "0"
        or {"ising_cpu", "estep", "gibbs", "lattice_kernel", "pr_kernels", "mrf_lanes"} <= cached
    ):
        yield  # switched off, or the cache is warm already (a second run in this checkout)
        return
    store = tmp_path_factory.mktemp("warm_kernels")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.warm_kernels", part, str(store)],
            cwd=store,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for part in ("A", "B")
    ]
    notes = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:  # only time is lost: the tests compile what they need themselves
            notes.append(f"warm_kernels failed (exit {p.returncode}): {out[-500:]}")
    print(
        f"\nnumba kernels compiled into the cache in {time.monotonic() - t0:.1f} s" + "".join(f"\n{n}" for n in notes)
    )
    yield


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory):
    """An empty SQLite MLflow store with every table made. Creating a store runs MLflow's ~70 alembic
    migrations, about 5 s on this machine class, and most tests open a fresh store: they start from
    a copy of this one instead (same MLflow version, same schema, same default rows)."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow_template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    MlflowServer.template = path  # tracking servers of the tests start from it too
    return path


@pytest.fixture(autouse=True)
def _premigrated_store(request, mlflow_template):
    """``tmp_path/mlflow.db`` (where the tests keep their store) starts as a copy of the migrated empty
    store. A test marked ``fresh_store`` gets none (it checks that pgmflow creates the store)."""
    if "tmp_path" not in request.fixturenames or request.node.get_closest_marker("fresh_store"):
        return
    import shutil

    dst = request.getfixturevalue("tmp_path") / "mlflow.db"
    if not dst.exists():
        shutil.copyfile(mlflow_template, dst)


@pytest.fixture
def mlflow_uri(tmp_path):
    """A fresh SQLite MLflow store in a temporary directory."""
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _cluster(n):
    import logging

    from distributed import LocalCluster

    env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return LocalCluster(
        n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=logging.ERROR, env=env
    )


@pytest.fixture(scope="session")
def cluster2():
    """A real LocalCluster with 2 worker processes, shared by the tests of a session."""
    c = _cluster(2)
    yield c
    c.close()


@pytest.fixture(scope="session")
def cluster_factory():
    """Start LocalClusters of a given size on demand (kept for the session)."""
    made = {}

    def get(n):
        if n not in made:
            made[n] = _cluster(n)
        return made[n]

    yield get
    for c in made.values():
        c.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """A real ``mlflow server`` on 127.0.0.1 with a SQLite store in a temporary directory; it can
    be stopped and started again on the same port and store (a tracking-server outage)."""

    def __init__(self, root, port=None):
        self.root = root
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self, timeout=60):
        import os
        import subprocess
        import sys
        import time
        import urllib.request
        from pathlib import Path

        template = getattr(MlflowServer, "template", None)
        if template is not None and not (self.root / "server.db").exists():
            import shutil

            shutil.copyfile(template, self.root / "server.db")
        mlflow = str(Path(sys.executable).with_name("mlflow"))
        self.log = open(self.root / "server.log", "a")
        self.proc = subprocess.Popen(
            [
                mlflow,
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--backend-store-uri",
                f"sqlite:///{self.root / 'server.db'}",
                "--artifacts-destination",
                str(self.root / "server-artifacts"),
                "--workers",
                "2",
            ],
            cwd=self.root,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # no background job runners (huey consumers): a tracking server only
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.25)
        raise RuntimeError("mlflow server did not answer /health in time")

    def stop(self):
        import os
        import signal

        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None


@pytest.fixture(scope="session")
def _mlflow_server_session(tmp_path_factory):
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).start()
    yield srv
    srv.stop()


@pytest.fixture
def mlflow_server(_mlflow_server_session):
    """A real MLflow tracking server on 127.0.0.1, shared by the tests of a session (started once:
    it takes seconds); a test that stops it gets it started again. Tests use their own
    experiment names."""
    srv = _mlflow_server_session
    if srv.proc is None:
        srv.start()
    yield srv
    if srv.proc is None:
        srv.start()
