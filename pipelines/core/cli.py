"""The ``pgmflow`` command: a Hydra app over ``conf/``.

    pgmflow                                   # the default experiment (64 x 64 Ising at T_c)
    pgmflow pipeline=tempering model.L=32 seed=3
    pgmflow experiment=gaussian_mixture
    pgmflow debug=default                     # everything shrunk: seconds
    pgmflow --cfg job                         # show the composed config
    pgmflow resume=<mlflow run id>            # continue an interrupted run
    pgmflow -m model.L=16,32 seed=0,1         # a sweep: every job on the Dask cluster, one MLflow parent run
    pgmflow reproduce <mlflow run id>         # re-run a logged run from its config; compare the metrics
    pgmflow cluster start|status|stop         # a local cluster kept between runs (cluster.profile=address)
    pgmflow warm start|status|stop            # a server that has imported everything: single runs start at once

With a warm server running (``pgmflow warm start``), a single run is run by a child forked from it (its
imports and numba kernels already loaded); sweeps and the subcommands run here. A server whose fingerprint
(Python, pgmflow's files, the environment read at import time) differs is not used: one line says why
(pgmflow.core.warm, docs/clusters.md).

Bad input exits with code 2 and one line naming the field, the value and the fix. A sweep exits
with the number of jobs that failed (0: all finished).
"""

from __future__ import annotations

import os
import sys

from pgmflow.core.config import check_install, conf_dir, conf_groups, resolved


def _report(message: str, code: int):
    print(f"pgmflow: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def run_from_hydra(cfg):
    """The Hydra task function: resolve, execute, map errors to exit codes; returns the objective."""
    from omegaconf import OmegaConf

    from pgmflow.core.errors import EXIT_BAD_INPUT, EXIT_FAILED, ConfigError

    verbose = (
        OmegaConf.select(cfg, "verbose", default=False) is True
    )  # a mistyped verbose=2 is refused by preflight, not obeyed
    try:
        cfg_dict = resolved(cfg)
        from pgmflow.core.runner import execute

        result = execute(cfg_dict)  # one run, or a study when the config has stages (docs/stages.md)
        return result.get("objective")
    except ConfigError as exc:
        if verbose or os.environ.get("PGMFLOW_SWEEP_JOB"):
            raise
        _report(exc.message, EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        _report("interrupted", 130)
    except Exception as exc:
        from pgmflow.core.tracking import Superseded

        if isinstance(exc, Superseded) and not os.environ.get("PGMFLOW_SWEEP_JOB"):
            print(f"pgmflow: superseded: {exc}", file=sys.stderr, flush=True)  # not an error of the run
            sys.exit(EXIT_FAILED)
        if verbose or os.environ.get("PGMFLOW_SWEEP_JOB"):
            raise  # in a sweep job the launcher records the error in the job's child run
        msg = " ".join(str(exc).split())
        _report(
            f"{type(exc).__name__}: {msg} {where_raised(exc)}(run with verbose=true for the traceback)", EXIT_FAILED
        )


def where_raised(exc: BaseException) -> str:
    """``"at pgmflow/svi/run.py:231 in run "``: the innermost frame of ``exc`` (a task's own frame when Dask
    re-raised it from a worker), so a one-line report of an unexpected error says where it came from."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    parts = f.filename.replace(os.sep, "/").split("/")
    return f"at {'/'.join(parts[-3:])}:{f.lineno} in {f.name} "


def override_error(argv, exc):
    """A Hydra composition error as a :class:`ConfigError`: the override, what is wrong, the fix (one line;
    the CLI prints it and exits 2, the Python API raises it)."""
    import difflib

    from hydra.errors import MissingConfigException

    from pgmflow.core.errors import ConfigError

    text = str(exc)
    first = " ".join(text.strip().splitlines()[0].split()) if text.strip() else type(exc).__name__
    if isinstance(exc, MissingConfigException) and exc.options and exc.missing_cfg_file:
        grp, _, opt = str(exc.missing_cfg_file).rpartition("/")  # "pipeline/nosuch": the group and the option
        options = [str(o) for o in exc.options]
        near = difflib.get_close_matches(opt, options, n=1)
        hint = f"did you mean {grp}={near[0]}? " if near else ""
        return ConfigError(
            grp, opt, f"unknown option of config group '{grp}'", f"{hint}use one of {', '.join(options)}"
        )
    if "Could not override" in text or "not in struct" in text:
        key = text.split("Could not override '")[1].split("'")[0] if "Could not override '" in text else "?"
        section, _, leaf = key.rpartition(".")
        try:
            from hydra import compose, initialize_config_dir

            with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
                groups = conf_groups()
                base = compose("config", overrides=[a for a in argv if "=" in a and a.split("=")[0] in groups])
            node = base
            for part in section.split(".") if section else []:
                node = node[part]
            known = list(node.keys())
        except Exception:
            known = []
        near = difflib.get_close_matches(leaf, known, n=1)
        hint = (
            f"did you mean {section + '.' if section else ''}{near[0]}?"
            if near
            else "check the spelling (pgmflow --cfg job lists every key), or add a new key with +" + key + "=..."
        )
        return ConfigError(key, None, "unknown key", hint, line=f"{key}: unknown key; fix: {hint}")
    fix = "check the override syntax (key=value, group=option)"
    return ConfigError(
        "overrides", " ".join(argv), first, fix, line=f"overrides {' '.join(argv)!r}: {first}; fix: {fix}"
    )


def _precheck(argv) -> None:
    """Compose the config once before Hydra runs, so a bad override is one line and exit code 2."""
    if any(a.startswith("-") for a in argv):
        return  # --help, --cfg, -m/--multirun, --info...: Hydra's own handling
    from hydra import compose, initialize_config_dir

    from pgmflow.core.errors import EXIT_BAD_INPUT

    try:
        with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            compose("config", overrides=list(argv))
    except Exception as exc:
        _report(override_error(argv, exc).message, EXIT_BAD_INPUT)


def _is_multirun(argv) -> bool:
    return any(a in ("-m", "--multirun") for a in argv) or "hydra.mode=MULTIRUN" in argv


def _multirun(app) -> None:
    """Run a sweep; exit with the number of failed jobs (Hydra's own errors: its exit code)."""
    from pgmflow.core import sweep

    code = 0
    try:
        app()
    except SystemExit as exc:  # Hydra reports a re-raised job error itself, then exits 1
        code = exc.code if isinstance(exc.code, int) else 1
    except (ValueError, TypeError) as exc:  # Hydra's own usage errors, e.g. -m with --cfg
        sweep.abandon_session(f"{type(exc).__name__}: {exc}")
        _report(f"{' '.join(str(exc).split())}; fix: check the command line (pgmflow --help)", 2)
    except KeyboardInterrupt:
        sweep.abandon_session("interrupted; run the same command again to run the jobs that did not finish")
        _report("sweep interrupted; run the same command again to run only the jobs that did not finish", 130)
    failed = sweep.finish_session()
    if failed is not None:
        code = min(failed, 100)
    sys.exit(code)


def main():
    from pgmflow.core import warm

    warm.run_warm(sys.argv[1:])  # exits with the run's status when a warm server ran it (docs/clusters.md)
    from pgmflow.core import interrupts

    interrupts.install()  # Ctrl-C: never lost in a finalizer, never half-way through a store write
    os.environ.setdefault("PGMFLOW_ORIG_CWD", os.getcwd())
    argv = sys.argv[1:]
    if argv and argv[0] == "warm":
        sys.exit(warm.main(argv))
    if argv and argv[0] == "reproduce":
        from pgmflow.core.reproduce import main as reproduce_main

        sys.exit(reproduce_main(argv[1:]))
    if argv and argv[0] in ("cache", "lineage"):  # the stage cache (docs/stages.md)
        from pgmflow.core.cache_cli import main as cache_main

        sys.exit(cache_main(argv))
    if argv and argv[0] == "cluster" and not any("=" in a for a in argv):  # docs/clusters.md
        from pgmflow.core.cluster_cli import main as cluster_main

        sys.exit(cluster_main(argv))
    _precheck(argv)
    try:
        check_install()
    except RuntimeError as exc:
        _report(str(exc), 2)
    import hydra

    app = hydra.main(config_path=conf_dir(), config_name="config", version_base="1.3")(run_from_hydra)
    if _is_multirun(argv):
        _multirun(app)
    else:
        app()


if __name__ == "__main__":
    main()
