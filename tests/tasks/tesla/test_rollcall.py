"""Roll-call votes as TESLA data (``pgmflow.tasks.tesla.rollcall``): Voteview's CSV triple (a small one written
here) and pscl's s109 as Debian's r-cran-pscl installs it (installed by the fixture when this is root, as the
SLURM fixture installs slurm-wlm; skipped with the reason otherwise: no GPL data is kept in the repository)."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from pgmflow.tasks.tesla import rollcall
from tests.tasks.tesla import rollcall_files


@pytest.fixture(scope="session")
def pscl():
    """The installed pscl lazy-load database (``apt-get install r-cran-pscl`` when missing and root)."""
    pytest.importorskip("rdata", reason="pip install rdata (in the dev extra) to read pscl's data")
    if rollcall.find_pscl() is None:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.skip("r-cran-pscl is not installed and this is not root with apt-get")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "r-cran-pscl"]):
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
            if r.returncode != 0:
                pytest.skip(f"{' '.join(cmd)} failed: {r.stderr.strip()[-300:]}")
    return rollcall.find_pscl()


def test_voteview_triple(tmp_path):
    codes = rollcall_files.write(tmp_path)
    rc = rollcall.read_voteview(str(tmp_path))
    assert rc.codes.shape == (8, 24) and rc.names[0] == "BUSH (R USA)" and rc.parties[1] == "D"
    s, parties, notes = rollcall.to_series(rc)
    # the President dropped, CC's seat held in turn by ECHO then FOXTROT merged: 6 nodes
    assert s.node_names == [
        "ALPHA (D AA)",
        "BRAVO (R AA)",
        "CHARLIE (D BB)",
        "DELTA (R BB)",
        "ECHO/FOXTROT (D CC)",
        "GOLF (R CC)",
    ]
    assert parties == ["D", "R", "D", "R", "D", "R"]
    assert any("President" in n for n in notes) and any("ECHO (D CC) then FOXTROT (D CC)" in n for n in notes)
    assert s.T == 24 and s.X.shape == (24, 6) and np.all(s.n_per_time == 1)
    seat = np.where(codes[5] != 0, codes[5], codes[6])
    expect = np.where(seat == 1, 1, np.where(seat == 6, -1, 0))
    assert np.array_equal(s.X[:, 4], expect)  # missing votes (9) are 0: left out of the likelihood
    assert np.array_equal(s.X[:, 0], np.where(codes[1] == 1, 1, np.where(codes[1] == 6, -1, 0)))
    nay, _, _ = rollcall.to_series(rc, missing="nay")
    assert set(np.unique(nay.X)) == {-1, 1} and np.array_equal(nay.X[s.X != 0], s.X[s.X != 0])


def test_time_axes_and_partial_terms(tmp_path):
    rollcall_files.write(tmp_path)
    rc = rollcall.read_voteview(str(tmp_path))
    day, _, _ = rollcall.to_series(rc, "day")
    assert list(day.times) == rollcall_files.DAYS and day.n_per_time.sum() == 24 and day.T == 8
    win, _, _ = rollcall.to_series(rc, "window", window_days=40)
    assert win.T == 3 and list(win.n_per_time) == [15, 6, 3]
    with pytest.raises(rollcall.RollCallError, match=r"window 2005-01-18\.\.2005-01-24 has no roll call"):
        rollcall.to_series(rc, "window", window_days=7)
    dropped, parties, notes = rollcall.to_series(rc, partial="drop")
    assert dropped.p == 5 and "ECHO" not in " ".join(dropped.node_names) and parties == ["D", "R", "D", "R", "R"]
    assert any("dropped 2 legislator(s)" in n for n in notes)


@pytest.mark.parametrize(
    "hook,match",
    [
        (lambda c: c.__setitem__((2, 3), 11), "unknown vote code 11"),
        (lambda c: c[1:, 5].__setitem__(slice(None), 9), "roll call 6 .* has every vote missing"),
    ],
)
def test_bad_codes(tmp_path, hook, match):
    rollcall_files.write(tmp_path, codes_hook=hook)
    with pytest.raises(rollcall.RollCallError, match=match):
        rollcall.to_series(rollcall.read_voteview(str(tmp_path)))


def test_votes_and_members_must_match(tmp_path):
    rollcall_files.write(tmp_path)
    members = tmp_path / "S109_members.csv"
    members.write_text("\n".join(ln for ln in members.read_text().splitlines() if ",103," not in ln) + "\n")
    with pytest.raises(rollcall.RollCallError, match=r"legislator\(s\) 103 \(icpsr\) are not in S109_members.csv"):
        rollcall.read_voteview(str(tmp_path))


def test_pscl_s109(pscl):
    """The 109th Senate as the issue describes it: 102 rows x 645 roll calls on 195 days; 100 seats."""
    rc = rollcall.read_pscl()
    assert rc.codes.shape == (102, 645) and np.unique(rc.dates).size == 195
    s, parties, notes = rollcall.to_series(rc)
    assert s.p == 100 and s.T == 645 and "CORZINE/MENENDEZ (D NJ)" in s.node_names
    assert sorted(set(parties)) == ["D", "Indep", "R"] and parties.count("R") == 55
    assert any("1758 missing votes" in n for n in notes)
    assert rollcall.to_series(rc, "day")[0].T == 195
