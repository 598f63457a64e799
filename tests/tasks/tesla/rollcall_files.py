"""A small Voteview CSV triple for the roll-call tests: a President, four senators who served the whole term
and one seat held in turn (state CC), 24 roll calls on 8 voting days, party-line votes with noise, some
missing votes (codes 7-9)."""

from __future__ import annotations

import numpy as np

MEMBERS = [  # icpsr, chamber, state, party code, bioname
    (99910, "President", "USA", 200, "BUSH, George Walker"),
    (101, "Senate", "AA", 100, "ALPHA, Ann"),
    (102, "Senate", "AA", 200, "BRAVO, Bob"),
    (103, "Senate", "BB", 100, "CHARLIE, Cid"),
    (104, "Senate", "BB", 200, "DELTA, Dee"),
    (105, "Senate", "CC", 100, "ECHO, Eve"),
    (106, "Senate", "CC", 100, "FOXTROT, Fay"),
    (107, "Senate", "CC", 200, "GOLF, Gus"),
]
DAYS = ["2005-01-04", "2005-01-05", "2005-01-11", "2005-02-01", "2005-02-02", "2005-03-15", "2005-03-16", "2005-04-20"]


def write(folder, prefix="S109", seed=0, n_rollcalls=24, codes_hook=None):
    """Write ``<prefix>_{members,rollcalls,votes}.csv`` into ``folder``; returns the codes [members, roll calls]
    (0: no row written). ``codes_hook(codes)`` may edit the codes before the votes file is written."""
    rng = np.random.default_rng(seed)
    m = n_rollcalls
    party = np.array([1 if pc == 100 else -1 for _, _, _, pc, _ in MEMBERS])
    direction = rng.choice([-1, 1], size=m)
    yea = (party[:, None] * direction[None, :]) > 0
    flip = rng.random((len(MEMBERS), m)) < 0.15
    yea ^= flip
    codes = np.where(yea, 1, 6)
    codes[rng.random(codes.shape) < 0.08] = 9
    codes[5, m // 2 :] = 0  # ECHO served the first half of the term ...
    codes[6, : m // 2] = 0  # ... FOXTROT the second: one seat held in turn
    if codes_hook is not None:
        codes_hook(codes)
    lines = ["congress,chamber,icpsr,state_icpsr,district_code,state_abbrev,party_code,occupancy,bioname"]
    lines += [f'109,{ch},{ic},0,0,{st},{pc},0,"{nm}"' for ic, ch, st, pc, nm in MEMBERS]
    (folder / f"{prefix}_members.csv").write_text("\n".join(lines) + "\n")
    dates = [DAYS[k * len(DAYS) // m] for k in range(m)]
    lines = ["congress,chamber,rollnumber,date,session,yea_count,nay_count"]
    lines += [f"109,Senate,{k + 1},{dates[k]},1,0,0" for k in range(m)]
    (folder / f"{prefix}_rollcalls.csv").write_text("\n".join(lines) + "\n")
    lines = ["congress,chamber,rollnumber,icpsr,cast_code,prob"]
    for k in range(m):
        for i, (ic, ch, *_rest) in enumerate(MEMBERS):
            if codes[i, k] != 0:
                lines.append(f"109,{ch},{k + 1},{ic},{codes[i, k]},100")
    (folder / f"{prefix}_votes.csv").write_text("\n".join(lines) + "\n")
    return codes
