"""TLS between client, scheduler and workers, configured in a ``dask_cluster.yaml`` profile.

Certificates are made on the fly: a self-signed CA and a certificate for 127.0.0.1 that it signed.
A real LocalCluster with a worker process listens on tls://127.0.0.1 and requires encryption: a
client with the certificates computes a task; a plain tcp:// client, a TLS client without a
certificate, and a client whose certificate another CA signed are all refused. Then a real pipeline
runs through an ``address`` profile with a ``tls:`` block, from the ``pgmflow`` command line."""

from __future__ import annotations

import logging
import socket
import ssl

import pytest
import yaml

from tests.bad_input.helpers import make_certificates, pgmflow, run_statuses
from tests.conftest import REPO
from tests.pipelines.helpers import SMALL_ISING


def _security(c):
    from distributed.security import Security

    return Security(
        tls_ca_file=c["ca_file"],
        tls_client_cert=c["cert"],
        tls_client_key=c["key"],
        tls_scheduler_cert=c["cert"],
        tls_scheduler_key=c["key"],
        tls_worker_cert=c["cert"],
        tls_worker_key=c["key"],
        require_encryption=True,
    )


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    return {"good": make_certificates(d), "other": make_certificates(d, prefix="other_"), "dir": d}


@pytest.fixture(scope="module")
def tls_cluster(certs):
    """A LocalCluster with one worker process, every connection over TLS with the test CA."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=True,
        protocol="tls://",
        host="127.0.0.1",
        security=_security(certs["good"]),
        dashboard_address="127.0.0.1:0",
        silence_logs=logging.ERROR,
        env={"PYTHONPATH": str(REPO), "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
    ) as cl:
        yield cl


def test_a_client_with_the_certificates_computes(tls_cluster, certs):
    from distributed import Client

    assert tls_cluster.scheduler_address.startswith("tls://127.0.0.1:")
    with Client(tls_cluster.scheduler_address, security=_security(certs["good"]), timeout=10) as c:
        workers = c.scheduler_info()["workers"]
        assert workers and all(addr.startswith("tls://127.0.0.1:") for addr in workers)  # workers speak TLS too
        assert c.submit(pow, 3, 4, pure=False).result(timeout=30) == 81


# Dask clients that fail to connect are tried in a separate process: a Client whose start raised can
# be garbage-collected later inside this process's event-loop thread and stall the next Client.
_BAD_CLIENTS = r"""
import json, os, sys
from distributed import Client
from distributed.security import Security
address, other_ca, other_cert, other_key = sys.argv[1:5]
port = address.rsplit(":", 1)[1]
other = Security(tls_ca_file=other_ca, tls_client_cert=other_cert, tls_client_key=other_key, require_encryption=True)
attempts = {
    "plain_tcp": lambda: Client("tcp://127.0.0.1:" + port, timeout=3),
    "certificate_of_another_ca": lambda: Client(address, security=other, timeout=3),
    "tls_without_certificates": lambda: Client(address, timeout=3),
}
for name, attempt in attempts.items():
    try:
        attempt().close()
        out = {"connected": True}
    except BaseException as exc:
        out = {"connected": False, "types": [k.__name__ for k in type(exc).__mro__], "message": str(exc)}
    print(json.dumps({"case": name, **out}), flush=True)
os._exit(0)
"""


@pytest.fixture(scope="module")
def bad_clients(tls_cluster, certs):
    import json
    import subprocess
    import sys

    o = certs["other"]
    r = subprocess.run(
        [sys.executable, "-c", _BAD_CLIENTS, tls_cluster.scheduler_address, o["ca_file"], o["cert"], o["key"]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    results = {d["case"]: d for d in map(json.loads, (ln for ln in r.stdout.splitlines() if ln.startswith("{")))}
    assert len(results) == 3, (r.stdout, r.stderr[-3000:])
    return results


@pytest.mark.parametrize(
    "case,types,message",
    [
        ("plain_tcp", ("OSError", "TimeoutError"), ""),  # the scheduler resets a connection that is not TLS
        ("certificate_of_another_ca", ("CommClosedError",), "certificate"),
        ("tls_without_certificates", ("TypeError",), "TLS expects a `ssl_context`"),
    ],
)
def test_a_client_without_the_certificates_is_refused(bad_clients, case, types, message):
    got = bad_clients[case]
    assert not got["connected"], got
    assert set(types) & set(got["types"]), got
    assert message.lower() in got["message"].lower(), got


def _first_byte(address: str, ctx: ssl.SSLContext):
    """Open a TLS connection with ``ctx`` and read the first byte the scheduler sends (it greets
    every accepted connection): the byte, or the exception that ended the connection."""
    host, port = address.removeprefix("tls://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw) as tls:  # TLS 1.3: a refused certificate shows on the first read
                return tls.recv(1) or ConnectionResetError("closed by the scheduler")
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as exc:
            return exc


def test_a_tls_client_without_a_certificate_is_refused_by_the_scheduler(tls_cluster, certs):
    """Raw TLS connections that trust the CA: the scheduler greets the one that presents the
    certificate and ends the handshake of the one that presents none (the refusal is the
    scheduler's, not a client-side check)."""

    def context(with_certificate):
        ctx = ssl.create_default_context(cafile=certs["good"]["ca_file"])
        ctx.check_hostname = False
        if with_certificate:
            ctx.load_cert_chain(certs["good"]["cert"], certs["good"]["key"])
        return ctx

    accepted = _first_byte(tls_cluster.scheduler_address, context(True))
    assert isinstance(accepted, bytes) and accepted, accepted
    refused = _first_byte(tls_cluster.scheduler_address, context(False))
    assert isinstance(refused, (ssl.SSLError, ConnectionResetError, BrokenPipeError)), refused


def test_a_pipeline_runs_through_a_tls_address_profile(tls_cluster, certs, tmp_path):
    """pgmflow pipeline=tempering with cluster.file= a cluster file whose address profile has a tls:
    block (paths relative to the file): the run finishes and its tasks ran on the TLS cluster."""
    from pgmflow.core import cluster as cluster_mod

    good = certs["good"]
    (tmp_path / "certs").mkdir()
    for k in ("ca_file", "cert", "key"):
        (tmp_path / "certs" / f"{k}.pem").write_bytes(open(good[k], "rb").read())
    tls = {"ca_file": "certs/ca_file.pem", "cert": "certs/cert.pem", "key": "certs/key.pem", "require_encryption": True}
    (tmp_path / "tls_cluster.yaml").write_text(
        yaml.safe_dump(
            {
                "profiles": {
                    "secure": {"type": "address", "address": tls_cluster.scheduler_address, "timeout": 10, "tls": tls}
                }
            }
        )
    )
    ccfg = {"file": str(tmp_path / "tls_cluster.yaml"), "profile": "secure"}
    sec = cluster_mod.security_for(ccfg)  # what a sweep job uses to reach the same scheduler
    assert sec.require_encryption and sec.tls_client_cert == str((tmp_path / "certs" / "cert.pem").resolve())

    before = set(tls_cluster.scheduler.task_prefixes)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = pgmflow(
        [
            *SMALL_ISING,
            "tempering.n_rounds=2",
            "tempering.figures=false",
            "cluster.file=tls_cluster.yaml",
            "cluster.profile=secure",
            f"tracking.uri={uri}",
        ],
        tmp_path,
    )
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert "tempering run " in r.stdout and "on secure (1 worker)" in r.stdout
    assert [s for s, _ in run_statuses(tmp_path, uri)] == ["FINISHED"]
    assert {p for p in tls_cluster.scheduler.task_prefixes if p.startswith("pt-")} - before


def test_sparse_gp_evaluations_reach_the_workers_over_tls(tls_cluster, certs, tmp_path):
    """The sparse GP's evaluations (one graph each: statistics and objective-and-gradient tasks) run on the
    workers of a TLS cluster, through the client's TLS connection."""
    from pgmflow.core.tracking import Tracker

    good = certs["good"]
    tls = {"ca_file": good["ca_file"], "cert": good["cert"], "key": good["key"], "require_encryption": True}
    (tmp_path / "tls_cluster.yaml").write_text(
        yaml.safe_dump(
            {
                "profiles": {
                    "secure": {"type": "address", "address": tls_cluster.scheduler_address, "timeout": 10, "tls": tls}
                }
            }
        )
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    before = set(tls_cluster.scheduler.task_prefixes)
    r = pgmflow(
        [
            "pipeline=sparse_gp",
            "gp_data=diabetes",
            "sparse_gp.m=8",
            "sparse_gp.max_iter=4",
            "sparse_gp.chunk_size=150",
            "sparse_gp.in_process=false",
            "sparse_gp.figures=false",
            "progress=false",
            "cluster.file=tls_cluster.yaml",
            "cluster.profile=secure",
            f"tracking.uri={uri}",
        ],
        tmp_path,
    )
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    tr = Tracker(uri, "pgmflow")
    (run,) = tr.client.search_runs([tr.client.get_experiment_by_name("pgmflow").experiment_id])
    assert run.info.status == "FINISHED" and "pgmflow.gp.direct_evaluations" not in run.data.tags
    assert {"gp-stats", "gp-objgrad"} <= set(tls_cluster.scheduler.task_prefixes) - before


def test_the_local_tls_profile_starts_a_tls_cluster(certs, tmp_path):
    """cluster.profile of type local with a tls: block: pgmflow's LocalCluster listens on tls://127.0.0.1
    and its own client computes; a plain client is refused."""
    from distributed import Client

    from pgmflow.core import cluster as cluster_mod

    good = certs["good"]
    (tmp_path / "c.yaml").write_text(
        yaml.safe_dump(
            {
                "profiles": {
                    "local_tls": {
                        "type": "local",
                        "n_workers": 1,
                        "dashboard_address": "127.0.0.1:0",
                        "tls": {"ca_file": good["ca_file"], "cert": good["cert"], "key": good["key"]},
                    }
                }
            }
        )
    )
    with cluster_mod.open_cluster({"file": str(tmp_path / "c.yaml"), "profile": "local_tls"}) as ch:
        assert ch.address.startswith("tls://127.0.0.1:")
        assert ch.client.submit(sum, [1, 2, 3], pure=False).result(timeout=30) == 6
        with pytest.raises((OSError, TimeoutError)):
            Client("tcp://" + ch.address.removeprefix("tls://"), timeout=3)


def test_servers_pgmflow_starts_listen_on_this_machine_only():
    """The MLflow UI of `make ui` and the Dask dashboard of the shipped local profiles bind 127.0.0.1
    (a server on every interface would publish runs, configs and task graphs to the network)."""
    import re

    commands = [ln for ln in (REPO / "Makefile").read_text().splitlines() if re.search(r"mlflow (ui|server)\b", ln)]
    assert commands and all("--host 127.0.0.1" in ln for ln in commands), commands
    profiles = yaml.safe_load((REPO / "dask_cluster.yaml").read_text())["profiles"]
    local = {n: p for n, p in profiles.items() if p["type"] == "local"}
    assert local and all(str(p.get("dashboard_address", "")).startswith("127.0.0.1:") for p in local.values()), local


@pytest.mark.slow
def test_a_sweep_over_the_local_tls_profile(certs, tmp_path):
    """``pgmflow -m`` on a local profile with a tls: block: the sweep's LocalCluster speaks TLS, each
    job's own tasks reach it with the profile's certificates, every child run FINISHES, and each job's
    objective equals the same config run undisturbed on the synchronous scheduler."""
    import subprocess
    import sys

    from tests.pipelines.core.test_sweeps import runs
    from tests.pipelines.helpers import run

    good = certs["good"]
    (tmp_path / "c.yaml").write_text(
        yaml.safe_dump(
            {
                "profiles": {
                    "local_tls": {
                        "type": "local",
                        "n_workers": 2,
                        "dashboard_address": "127.0.0.1:0",
                        "tls": {"ca_file": good["ca_file"], "cert": good["cert"], "key": good["key"]},
                    }
                }
            }
        )
    )
    job = [*SMALL_ISING, "tempering.n_rounds=3", "tempering.figures=false"]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pgmflow",
            "-m",
            *job,
            "seed=0,1",
            "cluster.file=c.yaml",
            "cluster.profile=local_tls",
            f"tracking.uri={uri}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert "pgmflow: sweep cluster: local_tls (2 workers)" in r.stdout, r.stdout[-2000:]
    tr, parents, children = runs(uri)
    assert len(parents) == 1 and len(children) == 2 and all(c.info.status == "FINISHED" for c in children)
    assert all(c.data.tags.get("pgmflow.cluster.profile", "").endswith("local_tls") for c in children), [
        c.data.tags.get("pgmflow.cluster.profile") for c in children
    ]
    for c in children:
        seed = c.data.tags["pgmflow.sweep.overrides"].split("seed=")[1].split()[0]
        ref, _ = run(job + [f"seed={seed}"], f"sqlite:///{tmp_path / 'ref.db'}")
        assert c.data.metrics["objective"] == ref["objective"], seed
