"""Done-means 2 of issue 35, the SLURM row: a node cut off from slurmctld while it runs a pgmflow sweep as a
batch job.

A 2-node SLURM runs on the test hosts (tests/network/slurm2.py: slurmctld on its own host, one slurmd on
worker1 and one on worker2, one CPU each). The driver host submits ``pgmflow -m`` (a 4-job tempering sweep,
the jobs one after another on a local Dask cluster inside the batch job) as a batch job, logging to the
MLflow server on its own host. When the first job's child run has checkpoints in the server's store, the
node that runs the batch job is cut off from slurmctld (and only from it: it still reaches the MLflow server). After
``SlurmdTimeout`` slurmctld sets the node DOWN and requeues the job; SLURM holds a requeued job for about two
minutes (its BeginTime), which the test cuts short with ``scontrol update StartTime=now``, as an operator
would. The second attempt starts on the other node while the first still runs on the cut-off node: the sweep
runs twice at once.

pgmflow's answer (docs/reliability.md): the second attempt finds the sweep's parent run by its key and its
child runs by their config hashes, claims them (``pgmflow.attempt.owner``), and runs the jobs that had not
finished; the first attempt's job sees the claim at its next write and stops, and its launcher ends with
one line (``pgmflow: superseded: ...``) without writing to the sweep again. The test asserts: one parent
run; each job exactly one child run, FINISHED, with artifacts and metrics bit-identical to the same sweep
run on this host undisturbed; no metric with two values at one step; the first attempt said it was
superseded.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import pytest

from tests.network import slurm2
from tests.network.helpers import Store, digest_dir, pgmflow_here, wait_until
from tests.network.test_faults import FIGURES

pytestmark = pytest.mark.network

JOB = [
    "pipeline=tempering",
    "debug=default",
    "model.L=32",
    "tempering.n_replicas=12",
    "tempering.n_rounds=12",
    "tempering.figures=false",
    "progress=false",
]
SEEDS = (
    0,
    1,
    2,
    3,
)  # 4 jobs one after another (one local worker): the first attempt is mid-sweep when the second arrives
SWEEP = ["-m", *JOB, f"seed={','.join(map(str, SEEDS))}", "cluster.profile=local", "cluster.n_workers=1"]
EXPERIMENT = "slurm-partition"
TRIGGER_ROUND = 2


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """The same sweep run on this host, undisturbed (a local cluster, a SQLite store, no network): each
    job's artifact digests and final metrics, by job index."""
    work = tmp_path_factory.mktemp("local_sweep")
    pgmflow_here(list(SWEEP), work)
    store = Store(f"sqlite:///{work / 'mlflow.db'}")
    out = {}
    for run in store.runs():
        if run.data.tags.get("mlflow.parentRunId"):
            files = digest_dir(store.artifact_dir(run.info.run_id, local_root=work))
            files.pop("sweep_job.log")  # the job's own output
            out[run.data.tags["pgmflow.sweep.job"]] = (files, store.results(run.info.run_id))
    assert sorted(out) == [str(i) for i in range(len(SEEDS))], sorted(out)
    return out


@pytest.fixture(scope="module")
def slurm(hosts):
    from tests.slurm.testslurm import install

    reason = install() or slurm2.why_not()  # apt-get install slurm-wlm munge when missing (root), as make test-slurm
    if reason:
        pytest.skip(f"no SLURM: {reason}")
    s = slurm2.Slurm2(hosts.net, hosts.net.root, hosts.env)
    s.start()
    yield s
    s.stop()


def _children(store: Store):
    runs = store.runs(EXPERIMENT)
    parents = [r for r in runs if r.data.tags.get("pgmflow.sweep") == "true"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    return parents, children


def _checkpoints(hosts, run_id: str) -> list[Path]:
    return list((hosts.store / "artifacts").glob(f"*/{run_id}/artifacts/checkpoints/round_*.npz"))


def test_a_node_cut_off_from_slurmctld_runs_the_sweep_twice_and_the_older_attempt_stops(
    cluster_up, slurm, references, tmp_path
):
    net, store = cluster_up.net, Store(f"sqlite:///{cluster_up.store / 'server.db'}", cluster_up.store / "artifacts")
    pgmflow = str(Path(sys.executable).with_name("pgmflow"))
    args = [
        *SWEEP,
        f"tracking.uri={net.mlflow_uri}",
        f"tracking.experiment={EXPERIMENT}",
        "tracking.max_wait=300",
    ]
    out = tmp_path / "attempts"
    out.mkdir()
    script = (
        "#!/bin/sh\n"
        f"exec > {out}/attempt-$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}.out 2>&1\n"
        'echo "attempt $SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0} on $(hostname)"\n'
        f"exec {shlex.join([pgmflow, *args])}\n"
    )
    t_start, m_start = time.time(), time.monotonic()
    job = slurm.sbatch(script, f"--chdir={tmp_path}", "--job-name=pgmflow-sweep")
    first = wait_until(lambda: slurm.job(job).get("JobState") == "RUNNING" and slurm.job(job), 120, what="job start")
    node = first["NodeList"]
    other = next(n for n in slurm2.NODES if n != node)

    def job0_checkpoints():
        _, children = _children(store)
        c0 = [c for c in children if c.data.tags.get("pgmflow.sweep.job") == "0"]
        return c0 and len(_checkpoints(cluster_up, c0[0].info.run_id)) >= TRIGGER_ROUND

    wait_until(job0_checkpoints, 240, every=0.3, what=f"job 0's checkpoint of round {TRIGGER_ROUND}")
    t0 = time.time()
    with net.partition(node, "slurmctld", max_s=200):
        requeued = wait_until(lambda: (j := slurm.job(job)).get("Restarts", "0") != "0" and j, 90, what="the requeue")
        t_requeue = time.time()
        assert requeued["JobState"] == "PENDING", requeued
        assert slurm.node_states().get(node, "").startswith("down"), slurm.node_states()
        slurm.cmd("scontrol", "update", f"JobId={job}", "StartTime=now")
        second = wait_until(lambda: (j := slurm.job(job)).get("JobState") == "RUNNING" and j, 60, what="restart")
        assert second["NodeList"] == other, second
        first_out = out / f"attempt-{job}-0.out"
        wait_until(lambda: "pgmflow: superseded" in first_out.read_text(), 240, what="the first attempt to stop")
        t_superseded = time.time()
    t1 = time.time()
    final = wait_until(
        lambda: (j := slurm.job(job)).get("JobState") not in ("RUNNING", "PENDING", "CONFIGURING") and j,
        400,
        what="the second attempt to end",
    )
    wall = time.monotonic() - m_start
    second_out = (out / f"attempt-{job}-1.out").read_text()
    assert final["JobState"] == "COMPLETED", (final, second_out[-3000:])
    first_text = first_out.read_text()
    superseded = [line for line in first_text.splitlines() if line.startswith("pgmflow: superseded")]
    assert len(superseded) == 1 and "Traceback" not in first_text, first_text[-3000:]

    parents, children = _children(store)
    assert len(parents) == 1, [p.info.run_id for p in parents]
    store.assert_one_value_per_step(parents[0].info.run_id)
    assert parents[0].info.status == "FINISHED"
    by_job: dict = {}
    for c in children:
        by_job.setdefault(c.data.tags["pgmflow.sweep.job"], []).append(c)
    assert sorted(by_job) == sorted(references) and all(len(v) == 1 for v in by_job.values()), by_job
    taken_over, missing_logs = [], []
    for j in sorted(by_job):
        (child,) = by_job[j]
        run_id = child.info.run_id
        assert child.info.status == "FINISHED", (j, child.data.tags.get("pgmflow.error"))
        if f"slurm job {job} restart 1 on {other}" in child.data.tags["pgmflow.attempt.launch"]:
            taken_over.append(j)
        want_files, want_metrics = references[j]
        got = digest_dir(store.artifact_dir(run_id))
        # the job's own output, logged by the launcher after the run ended: the older attempt does not log it
        # when the newer one claimed the sweep between the two (its writes stop), so a job it finished right
        # at the takeover may have none; a job the newer attempt ran has its own
        if got.pop("sweep_job.log", None) is None:
            missing_logs.append(j)
            assert f"slurm job {job} restart 0 " in child.data.tags["pgmflow.attempt.launch"], j
        error = (store.artifact_dir(run_id) / "error.txt").read_text() if "error.txt" in got else ""
        assert got and got == want_files, (j, error, child.data.tags.get("pgmflow.attempt.launch"))
        assert store.results(run_id) == want_metrics, j
        store.assert_one_value_per_step(run_id)
    assert taken_over and taken_over[-1] == sorted(by_job)[-1], taken_over  # the second attempt ran the rest
    ckpts = sorted(p.stat().st_mtime for j in taken_over for p in _checkpoints(cluster_up, by_job[j][0].info.run_id))
    later = [t for t in ckpts if t >= t1]
    FIGURES.append(
        {
            "fault": "a SLURM node cut off from slurmctld (the batch job requeued, two attempts at once)",
            "fault_s": round(t1 - t0, 1),
            "detect_s": round(t_requeue - t0, 1),
            "recover_s": round(later[0] - t1, 1) if later else None,
            "recomputed": None,
            "wall_s": round(wall, 1),
            "slowdown": None,
            "note": (
                f"node DOWN and job requeued {t_requeue - t0:.1f} s after the cut; the older attempt stopped itself "
                f"{t_superseded - t0:.1f} s after the cut; the newer attempt ran jobs {', '.join(taken_over)} of "
                f"{len(SEEDS)} (the job the older attempt was running again from its start); the sweep started "
                f"{t0 - t_start:.0f} s before the cut"
                + (
                    f"; job {', '.join(missing_logs)}, finished by the older attempt as the newer one took over, has "
                    "no sweep_job.log"
                    if missing_logs
                    else ""
                )
            ),
        }
    )
