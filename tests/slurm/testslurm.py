"""A real single-node SLURM for tests and benchmarks: ``munged``, ``slurmctld`` and ``slurmd`` on this
host, with every file they write in one temporary folder.

``TestSlurm(root).start()`` installs Debian's ``slurm-wlm`` and ``munge`` when they are missing
(root only), writes a ``slurm.conf`` for this host (its CPUs and memory, as ``slurmd -C`` reports
them) with two partitions (``debug``, the default, up, time limit 4 h; ``closed``, down: a job there pends with
reason ``PartitionDown``), starts the three daemons on free ports with their own munge key and
socket, and waits until the node is idle. ``stop()`` cancels every job, waits for the queue to
drain and stops the daemons (by the pids they wrote). Nothing is written outside ``root``: the
commands find the configuration through ``SLURM_CONF`` (set in ``env`` and by :meth:`activate`),
so a system SLURM, if any, is left alone.

``why_not()`` says why a SLURM cannot be started here (not root and not installed, no apt), or None.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
PACKAGES = ("slurm-wlm", "munge")


def _missing() -> list[str]:
    return [
        d
        for d in (*DAEMONS, "sbatch", "squeue", "scancel", "sinfo")
        if shutil.which(d) is None and not Path("/usr/sbin", d).exists()
    ]


def why_not() -> str | None:
    """None when a test SLURM can be started (installed, or installable by apt as root)."""
    if not _missing():
        return None if os.geteuid() == 0 else "the slurm daemons must run as root (this user is not)"
    if os.geteuid() != 0:
        return f"slurm-wlm/munge are not installed ({', '.join(_missing())} missing) and this user cannot install them"
    if shutil.which("apt-get") is None:
        return "slurm-wlm/munge are not installed and there is no apt-get to install them"
    return None


def install() -> str | None:
    """apt-get install slurm-wlm munge when missing; returns why it failed, or None."""
    if not _missing():
        return None
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *PACKAGES]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            return f"{' '.join(cmd)} failed: {' '.join((r.stderr or r.stdout).split())[-300:]}"
    return None if not _missing() else f"still missing after apt-get install: {', '.join(_missing())}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """Running (a daemon that exited but was not reaped, a zombie, is not: in a container whose
    init does not reap, it stays in the process table)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _sbin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class TestSlurm:
    """One SLURM cluster of one node (this host) under ``root``."""

    __test__ = False  # not a pytest test class

    def __init__(self, root):
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.node = None  # the NodeName line of slurm.conf
        self.cpus = self.memory_mb = None
        self._saved_env = None

    # -- set-up ---------------------------------------------------------------------------------
    def _write_conf(self):
        out = subprocess.run([_sbin("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout
        node = next(ln for ln in out.splitlines() if ln.startswith("NodeName="))
        fields = dict(f.split("=", 1) for f in node.split())
        self.hostname = fields["NodeName"]
        self.cpus, self.memory_mb = int(fields["CPUs"]), int(fields["RealMemory"])
        self.node = f"{node} State=UNKNOWN NodeAddr=127.0.0.1"
        r = self.root
        for d in ("state", "spool", "log", "munge"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r, 0o755)
        os.chmod(r / "munge", 0o755)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        self.munge_socket = r / "munge" / "munge.sock"
        lines = [
            "ClusterName=pgmflowtest",
            f"SlurmctldHost={self.hostname}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=2",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=36000",
            self.node,
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=04:00:00 State=UP",
            "PartitionName=closed Nodes=ALL Default=NO MaxTime=INFINITE State=DOWN",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 90.0) -> TestSlurm:
        problem = install()
        if problem:
            raise RuntimeError(problem)
        self._write_conf()
        r = self.root
        subprocess.run(
            [
                _sbin("munged"),
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={r / 'munge' / 'munge.key'}",
                f"--log-file={r / 'log' / 'munged.log'}",
                f"--pid-file={r / 'munge' / 'munged.pid'}",
                f"--seed-file={r / 'munge' / 'seed'}",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        subprocess.run(
            [_sbin("slurmctld"), "-f", str(self.conf)], check=True, env=self.env, capture_output=True, timeout=30
        )
        subprocess.run(
            [_sbin("slurmd"), "-f", str(self.conf)], check=True, env=self.env, capture_output=True, timeout=30
        )
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.sinfo("%T", partition="debug")
            if state.strip() == "idle":
                return self
            time.sleep(0.5)
        log = (r / "log" / "slurmctld.log").read_text()[-1500:] if (r / "log" / "slurmctld.log").exists() else ""
        self.stop()
        raise RuntimeError(f"the node did not become idle within {timeout} s (state {state.strip()!r}): {log}")

    # -- use ------------------------------------------------------------------------------------
    def run(self, *cmd, check=True) -> str:
        r = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
        return r.stdout

    def sinfo(self, fmt: str, partition: str | None = None) -> str:
        cmd = ["sinfo", "-h", "-o", fmt] + (["-p", partition] if partition else [])
        return self.run(*cmd, check=False)

    def jobs(self) -> dict[str, tuple[str, str]]:
        """Every job in the queue: {job id: (state, reason)}."""
        out = self.run("squeue", "-h", "-a", "-t", "all", "-o", "%i|%T|%r", check=False)
        return {i: (s, why) for i, s, why in (ln.split("|", 2) for ln in out.splitlines() if ln.count("|") == 2)}

    def log_lines(self, job: str, limit: int = 40) -> str:
        """The last ``limit`` lines of slurmctld's and slurmd's logs that name ``job`` (for a failing test's message:
        the daemons' logs are removed with the cluster at the end of the session)."""
        keys = (f"JobId={job} ", f"JobId={job}\n", f"job {job} ", f"job {job}\n", f"jobid {job}", f"job_id={job}")
        out = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.root / "log" / name
            text = path.read_text(errors="replace") if path.exists() else ""
            hits = [ln for ln in text.splitlines(keepends=True) if any(k in ln for k in keys)]
            head = f"--- {name} ({len(hits)} lines name job {job}; the last {limit}) ---\n"
            out.append(head + "".join(hits[-limit:]))
        return "\n".join(out)

    def live_jobs(self) -> dict[str, tuple[str, str]]:
        return {
            i: v
            for i, v in self.jobs().items()
            if v[0] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED")
        }

    def submitted(self) -> int:
        """How many jobs this SLURM has been given so far (finished jobs stay listed: MinJobAge is 10 h;
        ``sbatch --test-only`` takes a job id but submits no job, so job ids do not count them)."""
        return len(self.jobs())

    def activate(self):
        """Point this process's SLURM commands at this cluster (undone by :meth:`stop`)."""
        self._saved_env = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(self.conf)

    def wait_drained(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.live_jobs():
                return True
            time.sleep(0.5)
        return False

    # -- tear-down ------------------------------------------------------------------------------
    def stop(self):
        """Cancel every job, wait for the queue to drain, stop the daemons, restore SLURM_CONF."""
        if self.conf.exists():
            subprocess.run(["scancel", "--full", "-u", "root"], env=self.env, capture_output=True, timeout=30)
            self.wait_drained(60)
        for pidfile in (self.root / "slurmd.pid", self.root / "slurmctld.pid", self.root / "munge" / "munged.pid"):
            self._kill(pidfile)
        if self._saved_env is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = self._saved_env

    @staticmethod
    def _kill(pidfile: Path, timeout: float = 20.0):
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.2)
        if not alive(pid):
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
