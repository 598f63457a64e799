"""Run the real ``pgmflow`` command on bad input and check the refusal.

``pgmflow(args, cwd)`` calls the real entry point :func:`pgmflow.core.cli.main` with ``args`` as its
command line, in this process (about 0.2 s a case instead of about 1 s for a new Python process),
and returns what a subprocess would: the exit code, stdout and stderr. Hydra's and pgmflow's
process-wide state is reset around each call, so each case starts as a fresh process would:

- Hydra's GlobalHydra singleton (cleared before and after);
- the working directory, ``sys.argv`` and the environment (``PGMFLOW_ORIG_CWD`` is the case's
  folder; the sweep and ``HYDRA_FULL_ERROR`` variables are removed);
- the root logger's handlers (Hydra reconfigures logging for each run);
- warnings are recorded under Python's default filters and appended to stderr, as a new
  process would print them;
- ``pgmflow.core.runner.execute`` prints "<pipeline> run <id>" to the ``sys.stdout`` it saw at import;
  it is pointed at the captured stdout for the call.

``test_in_process_matches_subprocess`` runs cases both ways and compares. Set
``PGMFLOW_BAD_INPUT_SUBPROCESS=1`` to run the whole catalogue through real subprocesses.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUBPROCESS = os.environ.get("PGMFLOW_BAD_INPUT_SUBPROCESS", "") not in ("", "0")
_DROP_ENV = ("PGMFLOW_SWEEP_RUN_ID", "PGMFLOW_SWEEP_SCHEDULER", "PGMFLOW_SWEEP_JOB", "HYDRA_FULL_ERROR")


@dataclass
class Result:
    """What a finished ``pgmflow`` command left: like ``subprocess.CompletedProcess``."""

    returncode: int
    stdout: str
    stderr: str


def pgmflow_subprocess(args, cwd, timeout=120) -> Result:
    env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
    env["PYTHONPATH"] = str(REPO)
    r = subprocess.run(
        [sys.executable, "-m", "pgmflow", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Result(r.returncode, r.stdout, r.stderr)


def pgmflow_in_process(args, cwd) -> Result:
    from hydra.core.global_hydra import GlobalHydra

    from pgmflow.core import cli, runner

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_argv, saved_cwd = dict(os.environ), sys.argv, os.getcwd()
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    saved_defaults = runner.execute.__defaults__
    code = 0
    for k in _DROP_ENV:
        os.environ.pop(k, None)
    os.environ["PGMFLOW_ORIG_CWD"] = str(cwd)
    GlobalHydra.instance().clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()  # Python's defaults for a script run outside __main__
        warnings.simplefilter("default")
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", category)
        try:
            os.chdir(cwd)
            sys.argv = ["pgmflow", *map(str, args)]
            runner.execute.__defaults__ = (out, *saved_defaults[1:])  # stream=out; the others as they are
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                cli.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # what an uncaught exception does to a process: a traceback, exit code 1
            import traceback

            err.write(traceback.format_exc())
            code = 1
        finally:
            runner.execute.__defaults__ = saved_defaults
            GlobalHydra.instance().clear()
            os.chdir(saved_cwd)
            sys.argv = saved_argv
            os.environ.clear()
            os.environ.update(saved_env)
            for h in list(root.handlers):
                if h not in saved_handlers:
                    root.removeHandler(h)
                    with contextlib.suppress(Exception):
                        h.close()
            for h in saved_handlers:
                if h not in root.handlers:
                    root.addHandler(h)
            root.setLevel(saved_level)
    for w in caught:
        err.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line))
    return Result(code, out.getvalue(), err.getvalue())


def pgmflow(args, cwd, timeout=120) -> Result:
    """The ``pgmflow`` command with ``args``, run in ``cwd``: in this process, or in a subprocess when
    ``PGMFLOW_BAD_INPUT_SUBPROCESS=1``."""
    return pgmflow_subprocess(args, cwd, timeout) if SUBPROCESS else pgmflow_in_process(args, cwd)


def run_statuses(tmp_path, uri) -> list:
    """(status, pgmflow.error tag) of every MLflow run in the store at ``uri`` (none without a store)."""
    if not (Path(tmp_path) / "mlflow.db").exists():
        return []
    from pgmflow.core.tracking import Tracker

    tr = Tracker(uri, "pgmflow")
    exp = tr.client.get_experiment_by_name("pgmflow")
    if exp is None:
        return []
    return [(run.info.status, run.data.tags.get("pgmflow.error")) for run in tr.client.search_runs([exp.experiment_id])]


def assert_refused(r, needles, tmp_path, uri, pipeline):
    """A bad-input refusal (``r``: a finished ``pgmflow`` command): exit code 2, one stderr line
    ``pgmflow: error: ... fix: ...`` holding every needle, no traceback, no run started, no MLflow
    run left RUNNING or FINISHED in the store at ``uri`` (a run that was started ended FAILED with the
    same message), and no results presented as complete."""
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert line.startswith("pgmflow: error: ") and "; fix: " in line, line
    assert line.count("; fix: ") == 1, line  # one problem, one fix
    assert line.partition("; fix: ")[2].strip(), line  # a fix that says something
    for needle in needles:
        assert needle in line, (needle, line)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    assert f"{pipeline} run " not in r.stdout  # refused before a run (and any task) started
    for status, error in run_statuses(tmp_path, uri):
        assert status not in ("RUNNING", "FINISHED"), status
        assert status != "FAILED" or error == line[len("pgmflow: error: ") :], (error, line)
    for name in ("results.json", "final_state.npz"):
        assert not list(Path(tmp_path).rglob(name)), f"{name} written for a refused run"


def make_certificates(folder, prefix: str = "") -> dict:
    """A fresh self-signed CA and a certificate + key it signed (for 127.0.0.1), as PEM files in
    ``folder``: {"ca_file": ..., "cert": ..., "key": ..., "ca_key": ...} (paths as str)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = Path(folder)
    now = datetime.datetime.now(datetime.timezone.utc)
    valid = dict(not_valid_before=now - datetime.timedelta(minutes=5), not_valid_after=now + datetime.timedelta(days=1))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"pgmflow test CA {prefix}")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid["not_valid_before"])
        .not_valid_after(valid["not_valid_after"])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid["not_valid_before"])
        .not_valid_after(valid["not_valid_after"])
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    no_pw = serialization.NoEncryption()
    paths = {n: folder / f"{prefix}{n}.pem" for n in ("ca", "cert", "key", "ca-key")}
    paths["ca"].write_bytes(ca.public_bytes(pem))
    paths["cert"].write_bytes(cert.public_bytes(pem))
    paths["key"].write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, no_pw))
    paths["ca-key"].write_bytes(ca_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, no_pw))
    for p in paths.values():
        p.chmod(0o600)
    return {
        "ca_file": str(paths["ca"]),
        "cert": str(paths["cert"]),
        "key": str(paths["key"]),
        "ca_key": str(paths["ca-key"]),
    }


def closed_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
