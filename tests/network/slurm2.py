"""A 2-node SLURM on the test hosts of :mod:`tests.network.hosts`: ``slurmctld`` on the ``slurmctld`` host,
one ``slurmd`` on ``worker1`` and one on ``worker2`` (nodes named after their hosts, reached at their test
addresses), and one ``munged`` whose socket is a file in the test folder (munge does not use the network).

Every daemon runs in the foreground inside its host (:meth:`TestNet.spawn`), so the fixture's teardown stops
it, and so does anything a ``slurmd`` starts (a job's processes live in that host's namespaces). Every SLURM
command (``sbatch``, ``squeue``, ``scontrol``) runs inside the driver host: none talks to a test address from
this machine's own network. The configuration (``slurm.conf``, state, spool, logs) lives under the test
folder; commands find it through ``SLURM_CONF``.

Each node has one CPU, so that each runs one job at a time and a requeued job can only go to the other node.
``SlurmdTimeout`` is short (:data:`SLURMD_TIMEOUT`): a node that slurmctld cannot reach for that long is set
DOWN and its batch jobs are requeued (``JobRequeue=1``), while the processes of the old job go on running on
that node until it can be told to kill them.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

NODES = ("worker1", "worker2")
SLURMD_TIMEOUT = 6  # seconds without an answer before slurmctld sets a node DOWN


CGROUPS = ("freezer", "cpuset", "memory", "devices", "none,name=systemd")


def why_not() -> str | None:
    for d in ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol"):
        if shutil.which(d) is None and not Path("/usr/sbin", d).exists():
            return f"{d} is not installed (make test-slurm installs slurm-wlm and munge as root)"
    return None


def _sbin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class Slurm2:
    """The 2-node SLURM of the test hosts. ``start()``, then ``sbatch``/``jobs``/``node_state``."""

    __test__ = False

    def __init__(self, net, root: Path, env: dict):
        self.net, self.root = net, Path(root) / "slurm"
        self.conf = self.root / "slurm.conf"
        self.env = {**env, "SLURM_CONF": str(self.conf)}
        self.procs: dict = {}

    def _write(self):
        r = self.root
        for d in ("state", "log", "munge", "jobs", *(f"spool/{n}" for n in NODES)):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r, 0o755)
        os.chmod(r / "munge", 0o755)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        self.munge_socket = r / "munge" / "munge.sock"
        ip = self.net.ip
        lines = [
            "ClusterName=pgmflownet",
            f"SlurmctldHost=slurmctld({ip('slurmctld')})",
            "SlurmctldPort=6817",
            "SlurmdPort=6818",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd'}.%n.pid",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log'}/slurmd.%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobRequeue=1",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1",
            "SlurmctldTimeout=30",
            f"SlurmdTimeout={SLURMD_TIMEOUT}",
            "MessageTimeout=3",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=36000",
            *(f"NodeName={n} NodeAddr={ip(n)} CPUs=1 RealMemory=2000 State=UNKNOWN" for n in NODES),
            f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=01:00:00 State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 60):
        self._write()
        r = self.root
        munge = [
            _sbin("munged"),
            "--foreground",
            "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={r / 'munge' / 'munge.key'}",
            f"--log-file={r / 'log' / 'munged.log'}",
            f"--pid-file={r / 'munge' / 'munged.pid'}",
            f"--seed-file={r / 'munge' / 'seed'}",
        ]
        self.procs["munged"] = self.net.spawn("slurmctld", "munged", munge, env=self.env)
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.procs["slurmctld"] = self.net.spawn(
            "slurmctld", "slurmctld", [_sbin("slurmctld"), "-D", "-i", "-f", str(self.conf)], env=self.env
        )
        # `ip netns exec` mounts a fresh /sys in its own mount namespace, without the cgroup file systems
        # slurmd looks for: mount the cgroup v1 tree again there (in that private mount namespace only)
        dirs = [(c, "/sys/fs/cgroup/" + c.split("=")[-1]) for c in CGROUPS]
        mounts = " && ".join(f"mkdir -p {d} && mount -t cgroup -o {c} cgroup {d}" for c, d in dirs)
        for n in NODES:
            script = f'mount -t tmpfs cgroup_root /sys/fs/cgroup && {mounts} && exec "$@"'
            argv = ["sh", "-c", script, "slurmd", _sbin("slurmd"), "-D", "-N", n, "-f", str(self.conf)]
            self.procs[n] = self.net.spawn(n, "slurmd", argv, env=self.env)
        deadline = time.monotonic() + timeout
        states = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if all(states.get(n) == "idle" for n in NODES):
                return self
            for name, p in self.procs.items():
                if not p.alive():
                    raise RuntimeError(f"{name} exited: {p.tail()}")
            time.sleep(0.5)
        raise RuntimeError(f"the SLURM nodes did not become idle within {timeout} s: {states}; {self.log('slurmctld')}")

    def log(self, name: str, n: int = 2000) -> str:
        p = self.root / "log" / f"{name}.log"
        return p.read_text(errors="replace")[-n:] if p.exists() else ""

    # ---- commands, run inside the driver host ----------------------------------------------------------
    def cmd(self, *argv, check: bool = True, timeout: float = 30) -> str:
        r = self.net.run_in("driver", list(argv), env=self.env, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()[-500:]}")
        return r.stdout

    def node_states(self) -> dict[str, str]:
        out = self.cmd("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)

    def sbatch(self, script: str, *options) -> str:
        path = self.root / "jobs" / f"job{time.monotonic_ns()}.sh"
        path.write_text(script)
        out = self.cmd("sbatch", "--parsable", f"--output={self.root / 'jobs'}/slurm-%j.out", *options, str(path))
        return out.strip().split(";")[0]

    def job(self, job_id: str) -> dict:
        """``scontrol show job`` as a dict (JobState, NodeList, Restarts, ...)."""
        out = self.cmd("scontrol", "-o", "show", "job", job_id, check=False)
        fields = {}
        for word in out.split():
            if "=" in word:
                k, v = word.split("=", 1)
                fields.setdefault(k, v)
        return fields

    def stop(self):
        """Cancel every job (the daemons themselves are stopped by the test hosts' teardown)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].alive():
            self.cmd("scancel", "--full", "-u", "root", check=False)
