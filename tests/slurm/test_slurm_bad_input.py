"""Bad input on the SLURM path (Done 5), as the catalogue of tests/bad_input does it: the real
``pgmflow`` entry point, one line ``pgmflow: error: <field>=<value>: <problem>; fix: <fix>``, exit
code 2, no run started; and here also: no SLURM job submitted (the queue's job count is unchanged).
What pgmflow can tell is refused before the cluster starts; what only SLURM can tell (a job no node
can hold) comes from ``sbatch --test-only``, still before any job is submitted."""

from __future__ import annotations

import pytest
import yaml

from tests.bad_input.helpers import assert_refused, pgmflow
from tests.conftest import REPO
from tests.slurm.test_slurm import TEMPERING, on_slurm

pytestmark = pytest.mark.slurm


def _file(tmp_path, **changes):
    """A cluster file whose profile ``p`` is the shipped slurm profile with ``changes``."""
    base = yaml.safe_load((REPO / "dask_cluster.yaml").read_text())
    prof = {**base["profiles"]["slurm"], **changes}
    (tmp_path / "clusters.yaml").write_text(yaml.safe_dump({"profiles": {"p": prof}}))
    return ["cluster.file=clusters.yaml", "cluster.profile=p"]


CASES = {
    "option_of_the_wrong_type": (
        lambda p: on_slurm(p, "cluster.options.cores=two"),
        ["cluster.options.cores='two'", "must be an integer >= 1"],
    ),
    "memory_not_a_size": (
        lambda p: on_slurm(p, "cluster.options.memory=lots"),
        ["cluster.options.memory='lots'", "such as 4GB"],
    ),
    "unknown_option_added": (
        lambda p: on_slurm(p, "+cluster.options.corse=2"),
        ["cluster.options.corse=2", "unknown option of profile slurm", "did you mean cores?"],
    ),
    "unknown_option_far_from_any": (
        lambda p: on_slurm(p, "+cluster.options.zzz=1"),
        ["cluster.options.zzz=1", "the keys of profile slurm: n_jobs, cores, memory"],
    ),
    "unknown_option_without_plus": (
        lambda p: on_slurm(p, "cluster.options.corse=2"),
        ["cluster.options.corse: unknown key", "did you mean cluster.options.cores?"],
    ),
    "unknown_key_in_the_file": (
        lambda p: _file(p, walltme="01:00:00"),
        ["clusters.yaml:profiles.p.walltme='01:00:00'", "did you mean walltime?"],
    ),
    "walltime_in_a_format_slurm_refuses": (
        lambda p: on_slurm(p, "cluster.options.walltime=2h"),
        ["cluster.options.walltime='2h'", "is not a time SLURM accepts"],
    ),
    "walltime_above_the_partition_limit": (
        lambda p: on_slurm(p, "cluster.options.walltime=05:00:00"),
        ["cluster.options.walltime='05:00:00'", "above the time limit of partition debug (4:00:00)"],
    ),
    "partition_that_does_not_exist": (
        lambda p: on_slurm(p, "cluster.options.queue=debgu"),
        ["cluster.options.queue='debgu'", "no such SLURM partition", "did you mean debug?"],
    ),
    "adapt_minimum_above_maximum": (
        lambda p: on_slurm(p, "cluster.options.adapt={minimum:3,maximum:1}"),
        ["cluster.options.adapt.minimum=3", "is above maximum=1"],
    ),
    "processes_not_dividing_cores": (
        lambda p: on_slurm(p, "cluster.options.cores=2", "+cluster.options.processes=3"),
        ["cluster.options.processes=3", "does not divide cores=2"],
    ),
    # only SLURM can tell: no node of the partition holds the job (the shipped profile: 8 CPUs, 32GB)
    "job_larger_than_any_node": (
        lambda p: ["cluster.profile=slurm"],
        [
            "dask_cluster.yaml:profiles.slurm.cores=8",
            "SLURM refuses the job script",
            "Requested node configuration is not available",
            "the largest node has",
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_before_any_job(case, slurm, tmp_path):
    args, needles = CASES[case]
    if case == "job_larger_than_any_node" and slurm.cpus >= 8:
        pytest.skip(f"this node has {slurm.cpus} CPUs: the shipped profile's 8 fit")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    before = slurm.submitted()
    r = pgmflow([*TEMPERING, *args(tmp_path), f"tracking.uri={uri}"], tmp_path)
    assert_refused(r, needles, tmp_path, uri, "tempering")
    assert slurm.submitted() == before, slurm.jobs()
