"""``pgmflow reproduce <run id> [key=value ...]``: re-run a logged run from its recorded config and
check that every metric comes out the same.

The recorded ``config.yaml`` of the run is executed again as a new run (tagged
``pgmflow.reproduces=<run id>``). Only where and how it runs may be changed on the command line
(``cluster.*``, ``tracking.*``, ``progress``, ``verbose``, ``backend``); anything else would not be a
reproduction. Then the last value of every metric of the new run is compared, exactly, with the
original's; timings (``*seconds*``, ``*_per_s``, ...) are reported apart and never compared.

Exit codes: 0 all metrics match; 1 some differ (each difference is named); 2 bad input (no such
run, no recorded config, an override of a field that determines the results).
"""

from __future__ import annotations

import re
import sys

from pgmflow.core.errors import EXIT_BAD_INPUT, ConfigError

TIMING = re.compile(r"(seconds|_per_s$|_per_ns$|per_second|throughput|wall|_eta$|elapsed)")
MAY_CHANGE = ("cluster", "tracking", "progress", "verbose", "backend")
USAGE = "usage: pgmflow reproduce <mlflow run id> [tracking.uri=...] [cluster.profile=...] [progress=false]"


def _parse_overrides(items) -> dict:
    import yaml

    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ConfigError("reproduce", item, "is not key=value", USAGE)
        if key.split(".")[0] not in MAY_CHANGE:
            raise ConfigError(
                key,
                value,
                "cannot change in a reproduction (it would change the results)",
                f"only {', '.join(k + '.*' if k in ('cluster', 'tracking') else k for k in MAY_CHANGE)} may be given",
            )
        out[key] = yaml.safe_load(value) if value else None
    return out


def _set(cfg: dict, dotted: str, value):
    node = cfg
    parts = dotted.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def compare_metrics(original: dict, new: dict) -> tuple[list[str], list[str], list[str]]:
    """(matching names, differences as text, timing names skipped); exact float comparison."""
    same, diffs, timing = [], [], []
    for k in sorted(set(original) | set(new)):
        if TIMING.search(k):
            timing.append(k)
        elif k not in new:
            diffs.append(f"{k}: {original[k]!r} in the original, missing in the reproduction")
        elif k not in original:
            diffs.append(f"{k}: missing in the original, {new[k]!r} in the reproduction")
        elif original[k] == new[k] or (original[k] != original[k] and new[k] != new[k]):
            same.append(k)
        else:
            a, b = original[k], new[k]
            rel = abs(a - b) / max(abs(a), abs(b), 1e-300)
            diffs.append(f"{k}: {a!r} in the original, {b!r} in the reproduction (relative difference {rel:.2e})")
    return same, diffs, timing


ENVIRONMENT = ("version.", "env.", "git.commit", "git.dirty")  # tags a run's bits depend on


def compare_environment(original: dict, new: dict) -> list[str]:
    """The environment tags (library versions, BLAS, CPU model, git commit) that differ, as text."""
    keys = sorted(k for k in set(original) | set(new) if k.startswith(ENVIRONMENT))
    return [
        f"{k}: {original.get(k, '(not recorded)')!r} -> {new.get(k, '(not recorded)')!r}"
        for k in keys
        if original.get(k) != new.get(k)
    ]


def reproduce(run_id: str, overrides: dict, stream=sys.stdout) -> tuple[int, dict]:
    """Re-run ``run_id``; returns (exit code, report dict)."""
    import yaml

    from pgmflow.core import tracking
    from pgmflow.core.runner import execute

    uri = overrides.get("tracking.uri") or "sqlite:///mlflow.db"
    tr = tracking.Tracker(uri, "pgmflow")
    try:
        run = tr.client.get_run(run_id)
    except Exception:
        raise ConfigError(
            "reproduce",
            run_id,
            f"no such MLflow run in {tr.uri}",
            "pass a run id from that store (and tracking.uri=... for another store)",
        ) from None
    tr.run_id = run_id
    try:
        recorded = yaml.safe_load(tr.read_text("config.yaml"))
    except Exception:
        raise ConfigError(
            "reproduce", run_id, "the run has no recorded config.yaml", "only runs started by pgmflow can be reproduced"
        ) from None
    if run.info.status != "FINISHED":
        print(f"pgmflow: note: run {run_id} ended {run.info.status}; its metrics may be incomplete", file=stream)
    exp = tr.client.get_experiment(run.info.experiment_id)
    cfg = dict(recorded)
    cfg["resume"] = None
    cfg.setdefault("tracking", {})
    cfg["tracking"]["uri"] = tr.uri
    cfg["tracking"]["experiment"] = exp.name
    cfg["tracking"]["run_name"] = f"reproduce-{run_id[:8]}"
    for k, v in overrides.items():
        _set(cfg, k, v)
    result = execute(cfg, stream=stream)
    new_id = result["run_id"]
    tr.client.set_tag(new_id, "pgmflow.reproduces", run_id)
    new_run = tr.client.get_run(new_id)
    same, diffs, timing = compare_metrics(dict(run.data.metrics), dict(new_run.data.metrics))
    env = compare_environment(dict(run.data.tags), dict(new_run.data.tags))
    report = {
        "run_id": run_id,
        "reproduction": new_id,
        "matching": same,
        "differences": diffs,
        "timing": timing,
        "environment": env,
    }
    tr.client.log_text(
        new_id,
        "\n".join(
            [
                f"reproduction of {run_id}",
                f"{len(same)} metrics match exactly",
                *(f"DIFFERS {d}" for d in diffs),
                *(f"ENVIRONMENT {e}" for e in env),
                f"timings not compared: {', '.join(timing)}",
            ]
        ),
        "reproduction.txt",
    )
    if diffs:
        print(
            f"pgmflow: reproduce: {len(diffs)} of {len(diffs) + len(same)} metrics differ between run {run_id} "
            f"and its reproduction {new_id}:",
            file=stream,
        )
        for d in diffs:
            print(f"  {d}", file=stream)
        if env:
            print(
                "pgmflow: reproduce: the environment differs (bits are guaranteed only within one environment, "
                "docs/reproducibility.md):",
                file=stream,
            )
            for e in env:
                print(f"  {e}", file=stream)
        else:
            print(
                "pgmflow: reproduce: same library versions, BLAS, CPU model and commit: a difference here is a "
                "bug in pgmflow; please report it with both run ids",
                file=stream,
            )
        stream.flush()
        return 1, report
    if env:
        print(
            f"pgmflow: reproduce: note: the environment differs, yet every metric matched: {'; '.join(env)}",
            file=stream,
        )
    print(
        f"pgmflow: reproduce: all {len(same)} metrics of run {run_id} match exactly in run {new_id} "
        f"({len(timing)} timings not compared)",
        file=stream,
        flush=True,
    )
    return 0, report


def main(argv) -> int:
    verbose = "verbose=true" in argv
    if not argv or argv[0].startswith("-") or "=" in argv[0]:
        print(f"pgmflow: error: reproduce needs a run id; fix: {USAGE}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        code, _ = reproduce(argv[0], _parse_overrides(argv[1:]))
        return code
    except ConfigError as exc:
        if verbose:
            raise
        print(f"pgmflow: error: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:
        if verbose:
            raise
        print(
            f"pgmflow: error: {type(exc).__name__}: {' '.join(str(exc).split())} "
            "(run with verbose=true for the traceback)",
            file=sys.stderr,
        )
        return 1


__all__ = ["main", "reproduce", "compare_metrics", "compare_environment"]
