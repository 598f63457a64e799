"""The catalogue of bad input. Every case runs the real ``pgmflow`` command (``helpers.pgmflow``: the
real ``pgmflow.core.cli.main`` in this process, or a subprocess with PGMFLOW_BAD_INPUT_SUBPROCESS=1) and
checks, through ``helpers.assert_refused``: exit code 2; one stderr line ``pgmflow: error: <field or
file>=<value>: <problem>; fix: <fix>`` that holds the case's field, value and problem; no traceback;
no run started; no MLflow run left RUNNING or FINISHED (a run that was started ends FAILED with the
same line); no results.json or final_state.npz written.

| family | file | cases |
| --- | --- | --- |
| overrides and tempering configs | test_cli_bad_input.py | 17 |
| SVI configs, posterior regularization, corpora | test_svi_bad_input.py | 16 |
| TESLA configs and binary time-series data | test_tesla_bad_input.py | 16 (+1 good input) |
| variational bounds: configs, coupling files | test_bounds_bad_input.py | 10 |
| dask_cluster.yaml and cluster.* (a) | test_cluster_bad_input.py | 34 |
| top-level keys and types, GPU (b) | test_config_bad_input.py | 17 (+1 verbose=true) |
| data files (c) | test_data_bad_input.py | 32 (1 strict xfail) |
| sparse GP configs and regression data (d) | test_sparse_gp_bad_input.py | 17 |
| total | | 159 |

(a) the file (6: malformed YAML, empty, no mapping, not found, unknown type, no type), the
profile's keys and types (9: unknown profile, n_workers, threads_per_worker, memory_limit,
processes, timeout, unknown keys), cluster.* overrides (5, with an unreachable scheduler: a closed port on 127.0.0.1),
a missing optional extra (2: slurm, kubernetes), TLS certificates (12: missing, a directory, not
PEM, a key of another certificate, signed by another CA, unknown keys, a tls:// address without
certificates, a tls block with a tcp:// address or on a type without TLS).
(b) unknown keys (5: ``+foo=1``, a typo, an allow-list key, a tracking key, a missing key),
wrong types (8), malformed command lines (2), a GPU asked for without one (2: backend=cupy, the
local_cuda profile without dask-cuda).
(c) TESLA samples (12), MRF files (9), SVI corpora (11): empty and truncated files, NaN and
infinities, shape mismatches, files of the wrong kind. The xfail records a known defect: an
empty UCI docword file gives a line with two "fix:" parts.
(d) m > n, NaN and infinite values, a target column that does not exist, non-positive
lengthscale / noise, an unknown kernel or method, missing, empty and corrupt data files, X/y
shape mismatches.

Cases that depend on the machine skip where the input is valid there: ``backend=cupy`` with a GPU,
the slurm/kubernetes/local_cuda profiles with their extra installed. ``test_harness.py`` checks that
the in-process command answers exactly as a new process does.
"""
