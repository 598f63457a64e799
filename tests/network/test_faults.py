"""Done-means 2 of issue 35: faults injected mid-run on the test hosts; each run ends with the same bits as
the same run done locally and undisturbed, with no metric twice at one step.

A tempering run goes from the driver host over the ``address`` profile of tests/network/cluster.yaml (the
test daemons' short network settings) to the scheduler and three worker hosts, logging to the MLflow server
on its own host. When the run's checkpoint after round ``TRIGGER_ROUND`` (7 of 9; 2 for the faults of a
worker host, ``WORKER_TRIGGER_ROUND``) reaches the server's store, the fault starts. Each test records, for
docs/reliability.md (``pytest_terminal_summary`` prints the table; with ``PGMFLOW_NET_FIGURES=path`` it is
written there as markdown):

- detect: seconds from the fault's start until it was acted on: the scheduler removed the worker (its task
  log, tests/network/task_log.py), or the driver said it lost the scheduler; "-" when nothing had to be;
- recover: seconds from the end of the fault until the run's next checkpoint reached the store (the run is
  making durable progress again);
- recomputed: tasks of the run that reached memory more than once (the scheduler's task log);
- slowdown: the run's wall time (from its start until its process ended, however long the test's fault block
  lasts) over that of the undisturbed run on the same hosts (``test_undisturbed``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.network.helpers import NET_CLUSTER, DriverRun, Store, digest_dir, local_reference

pytestmark = pytest.mark.network

RUN = [
    "pipeline=tempering",
    "debug=default",
    "model.L=32",
    "tempering.n_replicas=12",
    "tempering.n_rounds=9",
    "tempering.figures=false",
    "progress=false",
]
NET = [
    f"cluster.file={NET_CLUSTER}",
    "cluster.profile=address",
    "cluster.reconnect_limit=180",
    "tracking.max_wait=300",
]
TRIGGER_ROUND = 7
# The worker faults start earlier, after round 2: the run then still has 7 rounds to compute, so a worker
# that is cut off or hung holds up tasks the run needs, and a removed worker's results are computed again
# (after round 7 the last two rounds were often done before the scheduler acted: nothing was recomputed).
WORKER_TRIGGER_ROUND = 2
FIGURES: list[dict] = []  # one row per fault, printed by conftest.pytest_terminal_summary
_STATE: dict = {}


def _store(hosts) -> Store:
    return Store(f"sqlite:///{hosts.store / 'server.db'}", hosts.store / "artifacts")


def _checkpoints(hosts, run_id: str) -> dict[int, float]:
    """round -> the time its checkpoint file appeared in the server's artifact store (its mtime)."""
    out = {}
    for p in (hosts.store / "artifacts").glob(f"*/{run_id}/artifacts/checkpoints/round_*.npz"):
        out[int(p.stem.split("_")[1])] = p.stat().st_mtime
    return out


def _wait_for_checkpoint(hosts, run: DriverRun, run_id: str, rnd: int, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while rnd not in _checkpoints(hosts, run_id):
        assert run.p.poll() is None, (run.stdout[-2000:], run.stderr[-3000:])
        assert time.monotonic() < deadline, f"no checkpoint after round {rnd} within {timeout} s"
        time.sleep(0.2)
    finals = list((hosts.store / "artifacts").glob(f"*/{run_id}/artifacts/final_state.npz"))
    assert not finals, "the run had ended before the fault"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The run done locally on the synchronous scheduler: artifact digests and final metrics."""
    return local_reference(RUN, tmp_path_factory.mktemp("local"))


# A run's process ends within this many seconds of printing "pgmflow: finished" (closing the client and the
# tracker, interpreter shutdown: 0.5-0.7 s measured, with or without a worker cut off; docs/reliability.md). A process
# that waited at exit on a dead worker's connection would wait a TCP or connect timeout (10-12 s here) or longer.
EXIT_BOUND_S = 8.0


def _finished_at(run: DriverRun) -> float | None:
    done = [t for t, line in run.lines if line.startswith("pgmflow: finished")]
    return done[0] if done else None


def _check(hosts, run: DriverRun, reference, rc_ok=(0,)) -> str:
    rc = run.wait(900)
    assert rc in rc_ok, (rc, run.stdout[-2000:], run.stderr[-3000:])
    done = _finished_at(run)
    assert rc != 0 or (done is not None and run.wall - done <= EXIT_BOUND_S), (
        f"the process ended {run.wall - (done or 0):.1f} s after the run finished",
        run.stdout[-2000:],
    )
    store = _store(hosts)
    run_id = run.run_id()
    assert store.client.get_run(run_id).info.status == "FINISHED"
    want_files, want_metrics = reference
    got = digest_dir(store.artifact_dir(run_id))
    assert got and got == want_files
    assert store.results(run_id) == want_metrics
    store.assert_one_value_per_step(run_id)
    return run_id


def _recomputed(hosts, run_id: str, t0: float) -> int:
    token = run_id[:12]
    seen: dict = {}
    for _, who, key in hosts.events_since(t0):
        if who not in ("ADD", "REMOVE") and token in key:
            seen[key] = seen.get(key, 0) + 1
    return sum(n - 1 for n in seen.values() if n > 1)


def _removed_after(hosts, host: str, t0: float, t_end: float | None = None) -> float | None:
    """Seconds from ``t0`` until the scheduler acted on ``host``'s worker: it logged that the worker failed
    to heartbeat (worker-ttl; it then asks the nanny to restart it), or removed it (task log)."""
    ip = hosts.net.ip(host)
    times = [t for t, who, addr in hosts.events_since(t0) if who == "REMOVE" and f"//{ip}:" in addr]
    for line in hosts.scheduler.tail(200000).splitlines():
        if "failed to heartbeat" in line and f"//{ip}:" in line:
            stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000
            if stamp >= t0:
                times.append(stamp)
    times = [t for t in times if t_end is None or t <= t_end]
    return min(times) - t0 if times else None


def _record(name, hosts, run, run_id, t_start, fault_start, fault_end, detect, note="", recover=True):
    base = _STATE.get("baseline_wall")
    done = _finished_at(run)
    if done is not None and run.wall - done > 2:  # the run had ended (FINISHED in MLflow) but its process had not
        note = (note + "; " if note else "") + f"process exit waited {run.wall - done:.0f} s after the run finished"
    ckpts = sorted(t for t in _checkpoints(hosts, run_id).values() if t >= fault_end)
    ckpts += [p.stat().st_mtime for p in (hosts.store / "artifacts").glob(f"*/{run_id}/artifacts/final_state.npz")]
    FIGURES.append(
        {
            "fault": name,
            "fault_s": round(fault_end - fault_start, 1),
            "detect_s": None if detect is None else round(detect, 1),
            "recover_s": round(ckpts[0] - fault_end, 1) if ckpts and recover else None,
            "recomputed": _recomputed(hosts, run_id, t_start),
            "wall_s": round(run.wall, 1),
            "slowdown": round(run.wall / base, 2) if base else None,
            "note": note,
        }
    )


def _start(hosts, tmp_path, extra=()):
    t_start = time.time()
    run = DriverRun(hosts, [*RUN, *NET, *extra], tmp_path)
    return t_start, run, run.run_id()


def test_undisturbed(cluster_up, tmp_path, reference):
    """The baseline: the same run on the same hosts with no fault (its wall time is the slowdown's 1.0)."""
    t_start, run, run_id = _start(cluster_up, tmp_path)
    _check(cluster_up, run, reference)
    _STATE["baseline_wall"] = run.wall
    FIGURES.append(
        {
            "fault": "none (baseline)",
            "fault_s": 0,
            "detect_s": None,
            "recover_s": None,
            "recomputed": _recomputed(cluster_up, run_id, t_start),
            "wall_s": round(run.wall, 1),
            "slowdown": 1.0,
            "note": "",
        }
    )


@pytest.mark.parametrize("seconds", [5, 25], ids=["shorter_than_tcp_timeout", "longer_than_tcp_timeout"])
def test_worker_host_cut_off(cluster_up, tmp_path, reference, seconds):
    """worker2 reaches nobody for 5 s (under the 12 s TCP timeout and the 10 s worker-ttl: nothing is
    removed) or 25 s (past both: the scheduler removes it and its tasks run elsewhere)."""
    net = cluster_up.net
    t_start, run, run_id = _start(cluster_up, tmp_path)
    _wait_for_checkpoint(cluster_up, run, run_id, WORKER_TRIGGER_ROUND)
    t0 = time.time()
    with net.isolate("worker2", max_s=seconds + 10):
        time.sleep(seconds)
    t1 = time.time()
    _check(cluster_up, run, reference)
    detect = _removed_after(cluster_up, "worker2", t0)
    if seconds < 10:
        assert detect is None, "a worker cut off for less than worker-ttl and the TCP timeout was removed"
    else:
        assert detect is not None and detect <= 2 * 10 + 2, detect  # within 2 x worker-ttl
        # the recomputed count is recorded, not asserted: it is 0 when the removed worker held nothing the run
        # still needed at that moment (measured 0 to 5 over runs: docs/reliability.md); the bits are checked above
    _record(f"worker host cut off {seconds} s", cluster_up, run, run_id, t_start, t0, t1, detect)


def test_worker_paused(cluster_up, tmp_path, reference):
    """worker3's worker process SIGSTOPped for 25 s (hung; its nanny alive): its TCP connections stay up, so
    only the worker-ttl (10 s in the test daemons, checked every 10 s) can tell. The scheduler acts within
    2 x worker-ttl: the nanny kills the hung process and starts a new one, and the work moves on."""
    import psutil

    net = cluster_up.net
    nanny = cluster_up.workers["worker3"]
    (child,) = [c for c in psutil.Process(nanny.pid).children() if "spawn_main" in " ".join(c.cmdline())]
    t_start, run, run_id = _start(cluster_up, tmp_path)
    _wait_for_checkpoint(cluster_up, run, run_id, WORKER_TRIGGER_ROUND)
    t0 = time.time()
    with net.pause_pid(child.pid, "worker3/worker process", max_s=40):
        time.sleep(25)
    t1 = time.time()
    _check(cluster_up, run, reference)
    detect = _removed_after(cluster_up, "worker3", t0)
    assert detect is not None and detect <= 2 * 10 + 2, detect
    _record("worker process hung (SIGSTOP) 25 s", cluster_up, run, run_id, t_start, t0, t1, detect)


def test_loss_and_latency_on_a_worker_host(cluster_up, tmp_path, reference):
    """worker1 with 100 ms added to every byte it sends (from the run's start: the delay applies to new
    connections, so its worker is started again inside it) and 5 % of its packets dropped both ways from the
    trigger on."""
    net = cluster_up.net
    with net.latency("worker1", 100, max_s=400):
        net.stop(cluster_up.workers["worker1"])
        cluster_up.start_worker("worker1")
        cluster_up.wait_for_workers()
        t_start, run, run_id = _start(cluster_up, tmp_path)
        _wait_for_checkpoint(cluster_up, run, run_id, WORKER_TRIGGER_ROUND)
        t0 = time.time()
        with net.loss("worker1", 5, max_s=300):
            _check(cluster_up, run, reference)
            t1 = time.time()
    detect = _removed_after(cluster_up, "worker1", t_start, t_end=t1)
    net.stop(cluster_up.workers["worker1"])  # its connections went through the delayer, which is gone
    _record(
        "5 % loss + 100 ms latency on one worker host",
        cluster_up,
        run,
        run_id,
        t_start,
        t0,
        t1,
        detect,
        note="latency for the whole run, loss from the trigger to the end",
        recover=False,
    )


def test_driver_cut_off_from_the_scheduler_for_60_s(cluster_up, tmp_path, reference):
    """No packet between the driver and the scheduler for 60 s: the client's connection dies after the TCP
    timeout (12 s), every pending result is cancelled; pgmflow waits (cluster.reconnect_limit=180), opens a
    new client when the scheduler answers and continues from the run's newest checkpoint."""
    net = cluster_up.net
    t_start, run, run_id = _start(cluster_up, tmp_path)
    _wait_for_checkpoint(cluster_up, run, run_id, TRIGGER_ROUND)
    t0, m0 = time.time(), time.monotonic()
    with net.partition("driver", "scheduler", max_s=75):
        time.sleep(60)
    t1 = time.time()
    run_id = _check(cluster_up, run, reference)
    lost = [t for t, line in run.lines if "lost the Dask scheduler" in line]
    assert lost and any("reconnected to the scheduler" in line for _, line in run.lines), run.stdout
    assert _store(cluster_up).client.get_run(run_id).data.tags.get("pgmflow.reconnects") == "1"
    detect = lost[0] - (m0 - run.t0)
    _record("driver cut off from the scheduler 60 s", cluster_up, run, run_id, t_start, t0, t1, detect)


def test_mlflow_server_cut_off_for_60_s(cluster_up, tmp_path, reference):
    """No packet between the driver and the MLflow server for 60 s: the run goes on computing, metrics wait
    in memory and blocking calls retry (tracking.max_wait=300); everything is delivered after, once."""
    net = cluster_up.net
    t_start, run, run_id = _start(cluster_up, tmp_path)
    _wait_for_checkpoint(cluster_up, run, run_id, TRIGGER_ROUND)
    t0 = time.time()
    with net.partition("driver", "mlflow", max_s=75):
        time.sleep(60)
    t1 = time.time()
    _check(cluster_up, run, reference)
    _record("MLflow server cut off from the driver 60 s", cluster_up, run, run_id, t_start, t0, t1, None)


def write_figures(path: Path | None, terminal=None):
    if not FIGURES:
        return
    head = "| fault | fault (s) | detect (s) | recover (s) | tasks recomputed | wall (s) | slowdown | note |"
    lines = [head, "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for f in FIGURES:
        cells = [f["fault"], f["fault_s"], f["detect_s"], f["recover_s"], f["recomputed"], f["wall_s"], f["slowdown"]]
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + f" | {f['note']} |")
    text = "\n".join(lines) + "\n"
    if path is not None:
        Path(path).write_text(text)
    if terminal is not None:
        terminal.write_line("")
        for line in lines:
            terminal.write_line(line)


@pytest.mark.parametrize("host", ["worker2", "driver"])
def test_connections_reset(cluster_up, tmp_path, reference, host):
    """Every TCP connection of a host reset at once (``ss -K``): a worker host's worker loses its scheduler
    stream and is replaced (its tasks run again elsewhere); the driver's client reconnects at once and pgmflow
    continues from the newest checkpoint."""
    net = cluster_up.net
    t_start, run, run_id = _start(cluster_up, tmp_path)
    _wait_for_checkpoint(cluster_up, run, run_id, WORKER_TRIGGER_ROUND if host != "driver" else TRIGGER_ROUND)
    t0, m0 = time.time(), time.monotonic()
    net.reset(host)
    net.fault_log.append((f"reset {host}", m0, m0))
    _check(cluster_up, run, reference)
    if host == "driver":
        lost = [t for t, line in run.lines if "lost the Dask scheduler" in line]
        assert lost, run.stdout
        detect = lost[0] - (m0 - run.t0)
    else:
        detect = _removed_after(cluster_up, host, t0)
    _record(f"connections of the {host} host reset (ss -K)", cluster_up, run, run_id, t_start, t0, t0, detect)
