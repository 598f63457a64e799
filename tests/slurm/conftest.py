"""A real SLURM for the tests in tests/slurm (``make test-slurm``): see :mod:`tests.slurm.testslurm`.

The ``slurm`` session fixture starts ``munged``, ``slurmctld`` and ``slurmd`` on this host (installing
Debian's ``slurm-wlm`` and ``munge`` first when they are missing and this is root), points this
process and its children at it (``SLURM_CONF``), and stops every daemon at the end, removing its
folder. Where it cannot (not root, no package, no apt), every test that uses it skips with that reason.

Tests here are marked ``slurm`` and deselected unless the marker expression names ``slurm``
(``make test-slurm`` runs ``pytest -m slurm tests/slurm``): ``make test`` never starts a SLURM.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from tests.slurm.testslurm import TestSlurm, why_not


def pytest_collection_modifyitems(config, items):
    if "slurm" in (config.getoption("markexpr", "") or ""):
        return
    keep = [item for item in items if "slurm" not in item.keywords]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if "slurm" in item.keywords])
        items[:] = keep


@pytest.fixture(scope="session")
def slurm():
    """A running single-node SLURM (TestSlurm), stopped at the end of the session."""
    reason = why_not()
    if reason:
        pytest.skip(f"no SLURM: {reason}")
    root = Path(tempfile.mkdtemp(prefix="pgmflow-slurm-"))
    s = TestSlurm(root)
    try:
        s.start()
    except Exception as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"could not start the test SLURM: {exc}")
    s.activate()

    def interrupted(signum, frame):  # `timeout`, a CI's cancel: stop the daemons on the way out too
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, interrupted)
    try:
        yield s
    finally:
        s.stop()
        shutil.rmtree(root, ignore_errors=True)
        signal.signal(signal.SIGTERM, old)


@pytest.fixture
def slurm_idle(slurm):
    """The SLURM with an empty queue before and after the test (a test's jobs never reach the next)."""
    assert slurm.wait_drained(60), slurm.live_jobs()
    yield slurm
    assert slurm.wait_drained(60), f"jobs left in the queue: {slurm.live_jobs()}"
