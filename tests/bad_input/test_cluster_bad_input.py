"""Bad ``dask_cluster.yaml`` files, profiles and ``cluster.*`` overrides: exit code 2, one line that
names the file's field (``<file>:profiles.<profile>.<key>``) or the override, the value and the fix,
no traceback, no cluster or MLflow run started. Includes TLS blocks whose certificates are missing,
unreadable or not certificates, an unreachable scheduler, and profiles that need a missing extra."""

from __future__ import annotations

import importlib.util
import time

import pytest
import yaml

from tests.bad_input.helpers import assert_refused, closed_port, make_certificates, pgmflow

FILE = "clusters.yaml"


def _file(tmp_path, profile: dict | str, name="p"):
    """Write a cluster file with one profile; returns the overrides that select it."""
    text = profile if isinstance(profile, str) else yaml.safe_dump({"profiles": {name: profile}})
    (tmp_path / FILE).write_text(text)
    return [f"cluster.file={FILE}", f"cluster.profile={name}"]


def _tls_file(tmp_path, kind="address", address=None, **tls_changes):
    certs = make_certificates(tmp_path)
    tls = {"ca_file": "ca.pem", "cert": "cert.pem", "key": "key.pem", **tls_changes}
    tls = {k: v for k, v in tls.items() if v is not None}
    prof = {"type": kind, "tls": tls}
    if kind == "address":
        prof.update(address=address or "tls://127.0.0.1:8786", timeout=1)
    return _file(tmp_path, prof), certs


def _garbage(tmp_path, name):
    (tmp_path / name).write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")


def _cert_is_a_directory(p):
    args, _ = _tls_file(p, cert="certdir")
    (p / "certdir").mkdir()
    return args, [f"{FILE}:profiles.p.tls.cert='certdir'", "is not a regular file"]


def _cert_missing(p):
    args, _ = _tls_file(p, cert="nope/cert.pem")
    return args, [f"{FILE}:profiles.p.tls.cert='nope/cert.pem'", "no such file", "fix: create it or point tls.cert"]


def _ca_missing(p):
    args, _ = _tls_file(p, ca_file="/nonexistent/ca.pem")
    return args, [f"{FILE}:profiles.p.tls.ca_file='/nonexistent/ca.pem'", "no such file"]


def _cert_not_a_certificate(p):
    args, _ = _tls_file(p)
    _garbage(p, "cert.pem")
    return args, [f"{FILE}:profiles.p.tls.cert='cert.pem'", "does not load as a PEM certificate"]


def _ca_not_a_certificate(p):
    args, _ = _tls_file(p)
    (p / "ca.pem").write_text("hello\n")
    return args, [f"{FILE}:profiles.p.tls.ca_file='ca.pem'", "is not a PEM CA certificate"]


def _key_of_another_certificate(p):
    args, _ = _tls_file(p, key="other_key.pem")
    make_certificates(p, prefix="other_")
    return args, [f"{FILE}:profiles.p.tls.key='other_key.pem'", "is not the private key of tls.cert='cert.pem'"]


def _cert_of_another_ca(p):
    args, _ = _tls_file(p, cert="other_cert.pem", key="other_key.pem")
    make_certificates(p, prefix="other_")  # a certificate and key that the CA in ca.pem did not sign
    return args, [
        f"{FILE}:profiles.p.tls.cert='other_cert.pem'",
        "is refused by a peer that trusts tls.ca_file",
        "CERTIFICATE_VERIFY_FAILED",
    ]


def _tls_unknown_key(p):
    args, _ = _tls_file(p, cert=None, certfile="cert.pem")
    return args, [f"{FILE}:profiles.p.tls.certfile='cert.pem'", "unknown key", "did you mean cert?"]


def _tls_with_tcp_address(p):
    args, _ = _tls_file(p, address="tcp://127.0.0.1:8786")
    return args, [f"{FILE}:profiles.p.address='tcp://127.0.0.1:8786'", "use the tls:// address"]


def _tls_address_without_certificates(p):
    return (
        _file(p, {"type": "address", "address": "tls://127.0.0.1:8786"}),
        [f"{FILE}:profiles.p.address='tls://127.0.0.1:8786'", "needs certificates", "add a tls: block"],
    )


def _tls_on_a_synchronous_profile(p):
    make_certificates(p)
    return (
        _file(p, {"type": "synchronous", "tls": {"ca_file": "ca.pem", "cert": "cert.pem"}}),
        [f"{FILE}:profiles.p.tls", "for the local, address types only"],
    )


def _tls_require_encryption_not_bool(p):
    args, _ = _tls_file(p, require_encryption="yes please")
    return args, [f"{FILE}:profiles.p.tls.require_encryption='yes please'", "must be true or false"]


def _unreachable(p):
    port = closed_port()
    args = _file(p, {"type": "address", "address": f"tcp://127.0.0.1:{port}", "timeout": 1})
    return args, [f"cluster.address='tcp://127.0.0.1:{port}'", "no Dask scheduler answered within 1 s"]


def _needs_extra(profile, module, extra):
    def case(p):
        if importlib.util.find_spec(module) is not None:
            pytest.skip(f"{module} is installed: cluster.profile={profile} is valid here")
        return [f"cluster.profile={profile}"], [f"cluster.profile='{profile}'", f"pip install 'pgmflow[{extra}]'"]

    return case


CASES = {
    # the file itself
    "malformed_yaml": lambda p: (
        _file(p, "profiles:\n  local:\n    type: local\n   oops: [\n"),
        [f"cluster.file='{p / FILE}'", "is not valid YAML at line"],
    ),
    "empty_file": lambda p: (_file(p, ""), [f"cluster.file='{p / FILE}'", "has no 'profiles:' mapping"]),
    "profiles_is_a_list": lambda p: (_file(p, "profiles:\n  - local\n"), ["has no 'profiles:' mapping"]),
    "file_not_found": lambda p: (["cluster.file=nowhere.yaml"], ["cluster.file='nowhere.yaml'", "file not found"]),
    "unknown_type": lambda p: (
        _file(p, {"type": "spark"}),
        [f"{FILE}:profiles.p.type='spark'", "unknown cluster type", "use one of local, address"],
    ),
    "profile_without_type": lambda p: (_file(p, {"n_workers": 2}), [f"{FILE}:profiles.p.type=None"]),
    # the profile's keys
    "unknown_profile_name": lambda p: (["cluster.profile=moon"], ["cluster.profile='moon'", "no such profile"]),
    "n_workers_wrong_type_in_file": lambda p: (
        _file(p, {"type": "local", "n_workers": "four"}),
        [f"{FILE}:profiles.p.n_workers='four'", "positive integer or null"],
    ),
    "n_workers_zero_in_file": lambda p: (
        _file(p, {"type": "local", "n_workers": 0}),
        [f"{FILE}:profiles.p.n_workers=0"],
    ),
    "threads_per_worker_negative": lambda p: (
        _file(p, {"type": "local", "threads_per_worker": -1}),
        [f"{FILE}:profiles.p.threads_per_worker=-1"],
    ),
    "memory_limit_not_a_size": lambda p: (
        _file(p, {"type": "local", "memory_limit": "lots"}),
        [f"{FILE}:profiles.p.memory_limit='lots'", "e.g. 4GB"],
    ),
    "local_profile_unknown_key": lambda p: (
        _file(p, {"type": "local", "n_worker": 2}),
        [f"{FILE}:profiles.p.n_worker=2", "did you mean n_workers?"],
    ),
    "address_profile_unknown_key": lambda p: (
        _file(p, {"type": "address", "adress": "tcp://127.0.0.1:8786"}),
        [f"{FILE}:profiles.p.adress", "did you mean address?"],
    ),
    "processes_false": lambda p: (
        _file(p, {"type": "local", "processes": False}),
        [f"{FILE}:profiles.p.processes=False", "cluster.profile=synchronous"],
    ),
    "timeout_negative": lambda p: (
        _file(p, {"type": "address", "address": "tcp://127.0.0.1:8786", "timeout": -5}),
        [f"{FILE}:profiles.p.timeout=-5", "positive number of seconds"],
    ),
    # cluster.* overrides
    "n_workers_wrong_type": lambda p: (["cluster.n_workers=two"], ["cluster.n_workers='two'"]),
    "unknown_cluster_key": lambda p: (["+cluster.workers=4"], ["cluster.workers=4", "did you mean cluster.n_workers?"]),
    "address_without_port": lambda p: (
        ["cluster.profile=address", "cluster.address=tcp://127.0.0.1"],
        ["cluster.address='tcp://127.0.0.1'", ":PORT"],
    ),
    "address_unknown_protocol": lambda p: (
        ["cluster.profile=address", "cluster.address=http://127.0.0.1:8786"],
        ["cluster.address='http://127.0.0.1:8786'", "unknown protocol"],
    ),
    "unreachable_scheduler": _unreachable,
    # optional extras
    "slurm_without_dask_jobqueue": _needs_extra("slurm", "dask_jobqueue", "slurm"),
    "kubernetes_without_dask_kubernetes": _needs_extra("kubernetes", "dask_kubernetes", "kubernetes"),
    # TLS
    "tls_cert_missing": _cert_missing,
    "tls_ca_file_missing": _ca_missing,
    "tls_cert_is_a_directory": _cert_is_a_directory,
    "tls_cert_not_a_certificate": _cert_not_a_certificate,
    "tls_ca_file_not_a_certificate": _ca_not_a_certificate,
    "tls_key_of_another_certificate": _key_of_another_certificate,
    "tls_cert_signed_by_another_ca": _cert_of_another_ca,
    "tls_unknown_key": _tls_unknown_key,
    "tls_block_with_tcp_address": _tls_with_tcp_address,
    "tls_address_without_certificates": _tls_address_without_certificates,
    "tls_on_a_synchronous_profile": _tls_on_a_synchronous_profile,
    "tls_require_encryption_not_a_bool": _tls_require_encryption_not_bool,
}


@pytest.mark.parametrize("case", list(CASES))
def test_cluster_bad_input(tmp_path, case):
    args, needles = CASES[case](tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    t0 = time.monotonic()
    r = pgmflow([*args, f"tracking.uri={uri}", "progress=false"], tmp_path)
    assert_refused(r, needles, tmp_path, uri, "tempering")
    assert time.monotonic() - t0 < 30  # an unreachable scheduler is given up after the profile's timeout
