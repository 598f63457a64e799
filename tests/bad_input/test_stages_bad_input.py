"""Bad input to a study's ``stages:`` (docs/stages.md): an ``in:`` reference to a stage or output that does
not exist, a cycle among stages, a ``foreach`` over an output that is not a list, an input whose type does not
match what the stage declares, an unknown workload: one line naming the stage and the field, exit 2, before
any run or task starts."""

from __future__ import annotations

import pytest

from tests.bad_input.helpers import assert_refused, pgmflow

LEARN = "learn:{workload:tesla}"
MRF = "mrf:{workload:network_mrf,in:{estimates:learn.estimates}}"

CASES = {
    "missing_stage": (
        f"stages={{{LEARN},mrf:{{workload:network_mrf,in:{{estimates:lern.estimates}}}}}}",
        ["stages.mrf.in.estimates='lern.estimates'", "no stage named 'lern'"],
    ),
    "missing_output": (
        f"stages={{{LEARN},mrf:{{workload:network_mrf,in:{{estimates:learn.theta}}}}}}",
        ["stages.mrf.in.estimates='learn.theta'", "no output 'theta'", "estimates"],
    ),
    "cycle": (
        "stages={a:{workload:network_mrf,in:{estimates:b.bounds}},b:{workload:bounds,groups:['model=mrf'],"
        "in:{model:a.mrf},foreach:a.mrf}}",
        ["cycle", "a -> b -> a"],
    ),
    "foreach_not_a_list": (
        f"stages={{{LEARN},b:{{workload:bounds,groups:['model=mrf'],in:{{model:learn.estimates}},foreach:learn.estimates}}}}",
        ["stages.b.foreach='learn.estimates'", "foreach needs a list output"],
    ),
    "type_mismatch": (
        f"stages={{{LEARN},{MRF},b:{{workload:bounds,groups:['model=mrf'],in:{{model:mrf.mrf}}}}}}",
        ["stages.b.in.model='mrf.mrf'", "npz_list", "takes npz"],
    ),
    "unknown_workload": ("stages={a:{workload:tesl}}", ["stages.a.workload='tesl'", "no such workload"]),
    "unknown_input": (
        f"stages={{{LEARN},b:{{workload:bounds,in:{{data:learn.estimates}}}}}}",
        ["stages.b.in.data='learn.estimates'", "bounds has no input 'data'"],
    ),
}


COMMANDS = {
    "no_subcommand": (["cache"], ["cache command=None", "pgmflow cache explain"]),
    "unknown_subcommand": (["cache", "purge"], ["cache command='purge'", "pgmflow cache gc"]),
    "explain_bad_override": (["cache", "explain", "experiment=nope"], ["experiment/nope"]),
    "gc_bad_days": (["cache", "gc", "--older-than", "soon"], ["--older-than", "number of days"]),
    "verify_no_run": (["cache", "verify"], ["run id", "pgmflow cache verify RUN_ID"]),
    "lineage_unknown_run": (["lineage", "0123456789abcdef"], ["0123456789abcdef", "not found"]),
}


@pytest.mark.parametrize("case", list(COMMANDS))
def test_cache_commands_bad_input(tmp_path, case):
    args, needles = COMMANDS[case]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tail = [] if args[:2] in (["cache"], ["cache", "purge"]) else [f"tracking.uri={uri}"]
    r = pgmflow([*args, *tail], tmp_path, timeout=120)
    assert_refused(r, needles, tmp_path, uri, "study")


@pytest.mark.parametrize("case", list(CASES))
def test_stages_bad_input(tmp_path, case):
    override, needles = CASES[case]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = pgmflow([override, f"tracking.uri={uri}", "progress=false", "cluster.n_workers=1"], tmp_path, timeout=120)
    assert_refused(r, needles, tmp_path, uri, "study")
    assert "study run " not in r.stdout
