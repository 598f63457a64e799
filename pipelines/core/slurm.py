"""SLURM and PBS profiles (``type: slurm`` / ``type: pbs``) through dask-jobqueue.

What pgmflow adds around dask-jobqueue's ``SLURMCluster`` / ``PBSCluster``:

- :func:`check_profile`: every key and type of the profile (after ``cluster.options.*`` from the
  command line are merged in), before anything starts: an unknown option suggests the profile's own
  keys; a walltime in a format SLURM refuses and a partition ``sinfo`` does not list are one line each.
- :func:`open_jobqueue`: starts the scheduler, asks SLURM with ``sbatch --test-only`` whether it
  would accept the job script (a partition, account, walltime or size it refuses is one line and exit
  2 before any job is submitted), submits the jobs (``n_jobs``, or ``adapt: {minimum, maximum}`` for
  dask-jobqueue's adaptive mode) and waits for ``wait_for_workers`` workers while a line on the
  terminal shows each job's SLURM state and reason (from ``squeue``). After ``wait_timeout`` every job
  it submitted is cancelled and the run stops with one line naming SLURM's reason and the fix, exit 2.
- :class:`JobWatch`: the job ids (recorded on the MLflow run) and, during the run, a watchdog: when no
  worker is left and none of the run's jobs is still pending or running (every worker job was
  cancelled or ended), the run stops with :class:`WorkerJobsEnded`, one line, instead of waiting forever.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import json
import numbers
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from pgmflow.core.errors import ConfigError

# pgmflow's own keys of a jobqueue profile; every other key is an option of the dask-jobqueue class
PGMFLOW_KEYS = ("type", "n_jobs", "wait_for_workers", "wait_timeout", "adapt")
ADAPT_KEYS = ("minimum", "maximum")
# the formats of sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes and days-hours:minutes:seconds; or no limit
WALLTIME = re.compile(r"^(\d+(:\d{1,2}){0,2}|\d+-\d+(:\d{1,2}){0,2}|INFINITE|UNLIMITED)$")
LIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING")
STRINGS = ("queue", "account", "log_directory", "local_directory", "interface", "job_name", "python", "shebang")
LISTS = ("job_extra_directives", "worker_extra_args", "job_script_prologue", "job_directives_skip")


@functools.lru_cache(maxsize=2)
def class_keys(kind: str) -> frozenset[str]:
    """The options of dask-jobqueue's cluster class and its job class for ``kind``."""
    import inspect

    import dask_jobqueue
    from dask_jobqueue.core import Job

    cls = dask_jobqueue.SLURMCluster if kind == "slurm" else dask_jobqueue.PBSCluster
    keys = set()
    for c in (cls, cls.job_cls, Job):
        keys |= {
            n
            for n, p in inspect.signature(c.__init__).parameters.items()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and n not in ("self", "scheduler", "job_cls")
        }
    return frozenset(keys)


def _namer(path, name, from_options):
    def field(key):
        return f"cluster.options.{key}" if key in from_options else f"{path.name}:profiles.{name}.{key}"

    return field


def check_profile(path, name: str, prof: dict, from_options=()) -> None:
    """Keys and types of a slurm/pbs profile; ``from_options``: the keys set by ``cluster.options.*``."""
    kind = prof["type"]
    field = _namer(path, name, set(from_options))
    known = set(PGMFLOW_KEYS) | class_keys(kind)
    for key, value in prof.items():
        if key not in known:
            own = [k for k in prof if k != "type" and k in known]
            near = difflib.get_close_matches(str(key), own, n=1) or difflib.get_close_matches(str(key), known, n=1)
            hint = (
                f"did you mean {near[0]}?" if near else f"the keys of profile {name}: {', '.join(own)}"
            ) + f" (any option of dask_jobqueue.{'SLURM' if kind == 'slurm' else 'PBS'}Cluster may be set)"
            raise ConfigError(field(key), value, f"unknown option of profile {name}", hint)
    where = f"in profile {name} of {path}" if path.name != "<built-in>" else "with cluster.options"
    _int(field, prof, "n_jobs", 0 if prof.get("adapt") else 1, f"set n_jobs: 2 {where} (or cluster.options.n_jobs=2)")
    _int(field, prof, "cores", 1, "set cores to the CPUs one job asks for, e.g. cluster.options.cores=2")
    _int(field, prof, "processes", 1, "set processes: 1 (one worker per job) or a divisor of cores", null=True)
    _int(field, prof, "wait_for_workers", 1, "set wait_for_workers: 1 (start once one worker has joined)")
    if prof.get("processes") and prof.get("cores") and prof["cores"] % prof["processes"]:
        raise ConfigError(
            field("processes"),
            prof["processes"],
            f"does not divide cores={prof['cores']}",
            "use a divisor of cores (each worker process gets cores/processes threads)",
        )
    t = prof.get("wait_timeout", 600)
    if isinstance(t, bool) or not isinstance(t, numbers.Real) or not t > 0:
        raise ConfigError(
            field("wait_timeout"),
            t,
            "must be a positive number of seconds",
            "set e.g. cluster.options.wait_timeout=600",
        )
    _memory(field, prof.get("memory"))
    _walltime(field, prof.get("walltime"), kind)
    for key in STRINGS:
        v = prof.get(key)
        if v is not None and (not isinstance(v, str) or not v.strip()):
            raise ConfigError(field(key), v, "must be a non-empty string or null", f"set {key}: null or a name")
    for key in LISTS:
        v = prof.get(key)
        if v is not None and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
            raise ConfigError(field(key), v, "must be a list of strings", f"write {key}: ['...', '...']")
    _adapt(field, prof.get("adapt"))
    if kind == "slurm":
        _partition(field, prof.get("queue"), prof.get("walltime"))


def _int(field, prof, key, lo, fix, null=False):
    v = prof.get(key)
    if v is None and (null or key not in prof):
        return
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
        raise ConfigError(field(key), v, f"must be an integer >= {lo}" + (" or null" if null else ""), fix)


def _memory(field, v):
    from dask.utils import parse_bytes

    try:
        ok = not isinstance(v, bool) and isinstance(v, (str, numbers.Real)) and parse_bytes(v) > 0
    except (ValueError, TypeError):
        ok = False
    if not ok:
        raise ConfigError(
            field("memory"), v, "must be the memory of one job, such as 4GB", "set e.g. cluster.options.memory=4GB"
        )


def _walltime(field, v, kind):
    if v is None:
        return
    text = str(v).strip()
    if (
        isinstance(v, bool)
        or not WALLTIME.match(text)
        or (kind == "pbs" and not re.match(r"^\d+(:\d{1,2}){0,2}$", text))
    ):
        raise ConfigError(
            field("walltime"),
            v,
            f"is not a time {kind.upper()} accepts (formats: MM, MM:SS, HH:MM:SS"
            + (", D-HH, D-HH:MM, D-HH:MM:SS)" if kind == "slurm" else ")"),
            'write e.g. cluster.options.walltime=01:30:00 (quoted in YAML: "01:30:00")',
        )


def _adapt(field, v):
    if v is None:
        return
    if not isinstance(v, dict):
        raise ConfigError(
            field("adapt"),
            v,
            "must be a mapping {minimum: N, maximum: M} (jobs) or null",
            "write adapt: {minimum: 1, maximum: 4}",
        )
    for key, value in v.items():
        if key not in ADAPT_KEYS:
            near = difflib.get_close_matches(str(key), ADAPT_KEYS, n=1)
            raise ConfigError(
                f"{field('adapt')}.{key}",
                value,
                "unknown key",
                f"did you mean {near[0]}?" if near else "use minimum and maximum",
            )
    lo, hi = v.get("minimum", 0), v.get("maximum")
    for key, x, least in (("minimum", lo, 0), ("maximum", hi, 1)):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x < least:
            raise ConfigError(
                f"{field('adapt')}.{key}",
                x,
                f"must be an integer >= {least}",
                "write adapt: {minimum: 1, maximum: 4} (numbers of jobs)",
            )
    if lo > hi:
        raise ConfigError(f"{field('adapt')}.minimum", lo, f"is above maximum={hi}", "make minimum <= maximum")


def _run(cmd, input=None, timeout=30):
    """Run a SLURM command; (exit code, stdout, stderr); (127, '', why) when it cannot run."""
    if shutil.which(cmd[0]) is None:
        return 127, "", f"{cmd[0]} not found"
    try:
        r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, "", f"{type(exc).__name__}: {exc}"
    return r.returncode, r.stdout, r.stderr


def minutes(text) -> float | None:
    """A SLURM time (walltime or sinfo's limit) in minutes; None for no limit."""
    text = str(text).strip()
    if text.upper() in ("INFINITE", "UNLIMITED"):
        return None
    days, _, rest = text.rpartition("-") if "-" in text else ("0", "", text)
    parts = [int(x) for x in rest.split(":")]
    if "-" in text:  # D-HH, D-HH:MM, D-HH:MM:SS
        h, m, sec = (parts + [0, 0])[:3]
    else:  # MM, MM:SS, HH:MM:SS
        h, m, sec = [0, *parts, 0][:3] if len(parts) < 3 else parts
        if len(parts) == 1:
            h, m, sec = 0, parts[0], 0
    return int(days or 0) * 1440 + h * 60 + m + sec / 60


def _partition(field, queue, walltime):
    """The partition exists (sinfo lists it) and the walltime is within its time limit."""
    code, out, _ = _run(["sinfo", "-h", "-o", "%P|%l"])
    if code != 0:
        return  # no SLURM client here (a profile checked on a laptop): sbatch --test-only tells later
    limits = {}
    for ln in out.splitlines():
        name, _, limit = ln.strip().partition("|")
        if name:
            limits.setdefault(name, limit)
    default = next((n[:-1] for n in limits if n.endswith("*")), None)
    limits = {n.rstrip("*"): v for n, v in limits.items()}
    if queue is not None and queue not in limits:
        near = difflib.get_close_matches(queue, list(limits), n=1)
        raise ConfigError(
            field("queue"),
            queue,
            f"no such SLURM partition (sinfo lists {', '.join(sorted(limits))})",
            (f"did you mean {near[0]}? " if near else "") + "set cluster.options.queue=NAME or null "
            "(the default partition)",
        )
    part = queue or default
    if walltime is None or part not in limits:
        return
    try:
        limit, asked = minutes(limits[part]), minutes(walltime)
    except ValueError:  # a limit sinfo prints in a form not parsed here: SLURM decides
        return
    if limit is not None and (asked is None or asked > limit):
        raise ConfigError(
            field("walltime"),
            walltime,
            f"is above the time limit of partition {part} ({limits[part]})",
            f"ask for {limits[part]} or less, e.g. cluster.options.walltime="
            f"{limits[part]}, or choose a partition with a longer limit (sinfo -o '%P %l')",
        )


def node_sizes(queue=None) -> str:
    """'2 CPUs and 23.5 GiB' for the largest node of the partition, or '' when sinfo cannot tell."""
    code, out, _ = _run(["sinfo", "-h", "-N", "-o", "%c %m"] + (["-p", queue] if queue else []))
    sizes = (
        [
            tuple(int(x) for x in ln.split())
            for ln in out.splitlines()
            if len(ln.split()) == 2 and all(x.isdigit() for x in ln.split())
        ]
        if code == 0
        else []
    )
    if not sizes:
        return ""
    cpus, mem = max(c for c, _ in sizes), max(m for _, m in sizes)
    return f"{cpus} CPUs and {mem / 1024:.1f} GiB"


def _job_size(prof) -> str:
    from dask.utils import format_bytes, parse_bytes

    return f"{prof.get('cores')} CPUs and {format_bytes(parse_bytes(prof.get('memory')))}"


def test_submit(cluster, name: str, prof: dict, field):
    """``sbatch --test-only`` on the job script: SLURM's own refusal, before any job is submitted."""
    code, out, err = _run(["sbatch", "--test-only"], input=cluster.job_script())
    if code in (0, 127):
        return
    reason = (
        " ".join(
            " ".join(ln.replace("sbatch: error:", "").split())
            for ln in err.splitlines()
            if "error" in ln or "failure" in ln
        )
        or " ".join(err.split())
        or f"exit code {code}"
    )
    low = reason.lower()
    fixes = {
        "partition": ("queue", "set cluster.options.queue to a partition sinfo lists, or null (the default)"),
        "time": (
            "walltime",
            "set a walltime within the partition's limit (sinfo -o '%P %l'), e.g. cluster.options.walltime=01:00:00",
        ),
        "account": (
            "account",
            "set cluster.options.account to an account you may use (sacctmgr show assoc user=$USER), or null",
        ),
        "qos": ("job_extra_directives", "drop or fix the --qos directive"),
    }
    key, fix = next((v for k, v in fixes.items() if k in low), (None, None))
    if key is None and ("node configuration" in low or "memory" in low or "cpu" in low):
        nodes = node_sizes(prof.get("queue"))
        key = "cores"
        reason += f" (each job asks for {_job_size(prof)}" + (f"; the largest node has {nodes})" if nodes else ")")
        fix = (
            "ask for what one node has, e.g. cluster.options.cores=1 cluster.options.memory=2GB, or choose a "
            "partition with larger nodes (cluster.options.queue=...)"
        )
    key = key or "type"
    value = prof.get(key) if key != "type" else name
    raise ConfigError(
        field(key) if key != "type" else "cluster.profile",
        value,
        f"SLURM refuses the job script: {reason}",
        fix or "fix the profile's options (sbatch --test-only on the job script says the same)",
    )


class WorkerJobsEnded(RuntimeError):
    """Every worker job of the run ended (cancelled, failed, out of time) and no worker is left."""


class JobWatch:
    """The jobs one cluster submitted: their ids, their SLURM state, the waiting line, the watchdog."""

    def __init__(self, cluster, kind: str, name: str, prof: dict):
        self.cluster, self.kind, self.name, self.prof = cluster, kind, name, prof
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._thread = None
        self._old_handler = None

    def ids(self) -> list[str]:
        for job in list(getattr(self.cluster, "workers", {}).values()):
            jid = getattr(job, "job_id", None)
            if jid and str(jid) not in self.seen:
                self.seen.append(str(jid))
        return list(self.seen)

    def states(self) -> dict[str, tuple[str, str]]:
        """{job id: (state, reason)} from squeue (scontrol for jobs squeue no longer lists)."""
        ids = self.ids()
        if not ids or self.kind != "slurm":
            return {}
        code, out, _ = _run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T|%r"])
        found = {}
        for ln in out.splitlines() if code == 0 else []:
            parts = ln.split("|")
            if len(parts) == 3:
                found[parts[0]] = (parts[1], parts[2])
        for jid in ids:
            if jid not in found:
                found[jid] = ("GONE", "no longer in squeue")
        return found

    def line(self, joined: int, wanted: int, waited: float, timeout: float) -> str:
        states = self.states()
        jobs = ", ".join(f"job {j} {s}" + (f" ({r})" if r and r != "None" else "") for j, (s, r) in states.items())
        if not jobs:
            ids = self.ids()
            jobs = f"job{'s' if len(ids) != 1 else ''} {', '.join(ids)}" if ids else "submitting jobs"
        return (
            f"pgmflow: waiting for {self.kind.upper()} workers: {joined}/{wanted} joined after {waited:.0f} s "
            f"(gives up at {timeout:g} s); {jobs}"
        )

    def cancel_all(self):
        ids = self.ids()
        if ids:
            _run(["scancel" if self.kind == "slurm" else "qdel", *ids])

    def explain(self, joined: int, wanted: int, timeout: float) -> ConfigError:
        """The one line after ``wait_timeout``: SLURM's reason for the first job that did not start, the fix."""
        states = self.states()
        ids = ", ".join(states) or "none"
        state, reason = next(
            ((s, r) for s, r in states.values() if s != "RUNNING"), next(iter(states.values()), ("UNKNOWN", ""))
        )
        fix = {
            "PartitionConfig": None,
            "Resources": "wait longer (cluster.options.wait_timeout=N) or ask for less "
            "(cores, memory, walltime) or another partition",
            "Priority": "wait longer (cluster.options.wait_timeout=N): other jobs come first",
            "PartitionDown": "choose a partition that is up (sinfo lists them): cluster.options.queue=NAME",
            "PartitionInactive": "choose a partition that is up (sinfo lists them): cluster.options.queue=NAME",
            "ReqNodeNotAvail": "the nodes it needs are down or "
            "reserved: choose another partition (cluster.options.queue=NAME)",
        }
        if reason in ("PartitionConfig", "PartitionNodeLimit", "BadConstraints") or "node configuration" in reason:
            nodes = node_sizes(self.prof.get("queue"))
            why = f"each job asks for {_job_size(self.prof)}" + (f" and the largest node has {nodes}" if nodes else "")
            fix_text = f"{why}: ask for what one node has, e.g. cluster.options.cores=1 cluster.options.memory=2GB"
        elif state == "RUNNING":
            fix_text = (
                "the job runs but its worker did not reach the scheduler at "
                f"{getattr(self.cluster, 'scheduler_address', '?')}: read the job's log (log_directory) and "
                "check that the compute nodes can reach this host (interface, ports, firewall)"
            )
        elif state not in LIVE:
            fix_text = f"the job ended ({state}) before its worker joined: read its log (log_directory)"
        else:
            fix_text = fix.get(reason) or f"see scontrol show job {next(iter(states), '?')}"
        what = (
            f"{joined} of {wanted} worker{'s' if wanted != 1 else ''} joined within {timeout:g} s; SLURM job"
            f"{'s' if len(states) != 1 else ''} {ids}: {state}"
            + (f" ({reason})" if reason else "")
            + "; every job was cancelled"
        )
        return ConfigError("cluster.profile", self.name, what, fix_text)

    # -- the watchdog ---------------------------------------------------------------------------
    def start_watchdog(self, client, period: float = 2.0):
        """In the main thread only: stop the run with WorkerJobsEnded when every worker job ended."""
        if self.kind != "slurm" or threading.current_thread() is not threading.main_thread():
            return
        message = {}

        def handler(signum, frame):
            raise WorkerJobsEnded(message.get("text", "every worker job ended"))

        self._old_handler = signal.signal(signal.SIGUSR1, handler)

        def watch():
            strikes = 0
            while not self._stop.wait(period):
                with contextlib.suppress(Exception):
                    if client.status != "running" or len(client.nthreads()) > 0:
                        strikes = 0
                        continue
                    states = self.states()
                    if states and all(s not in LIVE for s, _ in states.values()):
                        strikes += 1
                    else:
                        strikes = 0
                    if strikes >= 2:
                        ended = ", ".join(f"{j} {s}" for j, (s, _) in states.items())
                        message["text"] = (
                            f"every SLURM worker job of this run ended ({ended}) and no worker is "
                            "left, so no task can run; fix: run again (the jobs were cancelled or "
                            "ran out of walltime: a longer cluster.options.walltime), or use "
                            "adapt: {minimum, maximum} so that lost jobs are replaced"
                        )
                        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
                        return

        self._thread = threading.Thread(target=watch, name="pgmflow-slurm-watchdog", daemon=True)
        self._thread.start()

    def stop_watchdog(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._old_handler is not None:
            signal.signal(signal.SIGUSR1, self._old_handler)
            self._old_handler = None


class _Line:
    """The waiting line: rewritten in place on a terminal, a new line when it changes otherwise."""

    def __init__(self, stream):
        self.stream = stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.last = None

    def show(self, text: str):
        key = re.sub(r"after \d+ s", "", text)
        if self.tty:
            print("\r" + text[:200].ljust(len(self.last or "")), end="", file=self.stream, flush=True)
            self.last = text[:200]
        elif key != self.last:
            print(text, file=self.stream, flush=True)
            self.last = key

    def done(self):
        if self.tty and self.last:
            print(file=self.stream, flush=True)


def wait_for_workers(client, watch: JobWatch, wanted: int, timeout: float, stream=None):
    """Wait for ``wanted`` workers with the waiting line; after ``timeout`` cancel every job, raise."""
    line = _Line(stream if stream is not None else sys.stderr)
    start = time.monotonic()
    while True:
        joined = len(client.nthreads())
        waited = time.monotonic() - start
        if joined >= wanted:
            line.done()
            return joined
        if waited >= timeout:
            line.done()
            err = watch.explain(joined, wanted, timeout)
            watch.cancel_all()
            raise err
        line.show(watch.line(joined, wanted, waited, timeout))
        time.sleep(min(2.0, max(timeout - waited, 0.05)))


def open_jobqueue(stack, name: str, kind: str, prof: dict, n_override=None, file=None, from_options=()):
    """Start the dask-jobqueue cluster of a checked profile inside ``stack``; returns (client, tags, want)
    where ``tags`` are for the MLflow run and ``want(n)`` tells an adaptive cluster how many jobs the
    caller could use now (None for a fixed number of jobs)."""
    import dask_jobqueue
    from distributed import Client

    prof = dict(prof)
    resolved = {"type": kind, **prof}
    n_jobs = n_override or prof.pop("n_jobs", 1)
    prof.pop("n_jobs", None)
    wait_n = prof.pop("wait_for_workers", 1)
    wait_t = prof.pop("wait_timeout", 600)
    adapt = prof.pop("adapt", None)
    cls = dask_jobqueue.SLURMCluster if kind == "slurm" else dask_jobqueue.PBSCluster
    cluster = stack.enter_context(cls(**{k: v for k, v in prof.items() if v is not None}))
    if kind == "slurm":
        from pathlib import Path

        test_submit(cluster, name, resolved, _namer(Path(file or "dask_cluster.yaml"), name, set(from_options)))
    watch = JobWatch(cluster, kind, name, resolved)
    stack.callback(watch.cancel_all)
    want_jobs = None
    if adapt:
        per_job = int(prof.get("processes") or 1)
        wait_n = max(1, min(wait_n, adapt["maximum"] * per_job))
        # at least the jobs that wait_for_workers needs: an idle cluster at minimum 0 would start none
        lo, hi = max(int(adapt.get("minimum", 0)), -(-wait_n // per_job)), int(adapt["maximum"])
        cluster.adapt(minimum_jobs=lo, maximum_jobs=hi)

        def want_jobs(n: int):
            cluster.adapt(minimum_jobs=max(lo, min(int(n), hi)), maximum_jobs=hi)
    else:
        cluster.scale(jobs=int(n_jobs))
    client = stack.enter_context(Client(cluster))
    wait_for_workers(client, watch, int(wait_n), float(wait_t))
    watch.start_watchdog(client)
    stack.callback(watch.stop_watchdog)
    tags = {
        "pgmflow.cluster.options": json.dumps(resolved, sort_keys=True, default=str)[:5000],
        f"pgmflow.cluster.{kind}.job_ids": ",".join(watch.ids()),
        f"pgmflow.cluster.{kind}.job_header": cluster.job_header[:5000],
    }
    if os.environ.get("SLURM_JOB_ID"):
        tags["pgmflow.cluster.slurm.driver_job_id"] = os.environ["SLURM_JOB_ID"]
    return client, tags, want_jobs
