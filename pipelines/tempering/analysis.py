"""Estimates, diagnostics and tables of the tempering workload, from the gathered round traces.

Pure functions of the traces (``pgmflow.tasks.tempering.engine.RoundTrace``), the ladders and the targets:
the per-round summary of each chain, the per-temperature table, the final log Z estimates with their
standard errors, and the combination of several targets farmed in one run.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pgmflow.tasks.tempering import diagnostics, engine, estimators, schedule, variational

#: Keys of counts (summed over chains, not averaged): round trips and tempered restarts, whole chain and per leg.
COUNTS = ("round_trips", "restarts")


class ChainRound(NamedTuple):
    """One chain at the end of a round.

    betas: its ladder [K]; trace: the round's ``RoundTrace``; rts: its round-trip counters;
    legs: the leg of each level (None: reference=fixed); leg_rts: per-leg round-trip counters (None
    unless two legs)."""

    betas: np.ndarray
    trace: engine.RoundTrace
    rts: diagnostics.RoundTripState
    legs: np.ndarray | None = None
    leg_rts: list | None = None


def _stepping_stone(betas, loglik):
    """Stepping stone, the mean of the forward and reverse estimators (their first-order biases,
    -var/2 and +var/2 in log Z, cancel), with the joint SE that keeps correlations between levels."""
    return tuple(estimators.stepping_stone_joint(betas, loglik))


def _thermodynamic_integration(betas, loglik):
    return tuple(estimators.thermodynamic_integration_joint(betas, loglik))


def rejection(trace: engine.RoundTrace) -> np.ndarray:
    return 1.0 - trace.accept_prob.mean(axis=0)


def chain_estimates(betas, trace, legs=None, leg_rts=None, offset: float = 0.0) -> dict:
    """log Z (stepping stone, TI; with SEs) and the barrier of one chain's round; with two legs
    (``legs``, reference=stabilized) per-leg entries ``<key>_fixed`` / ``<key>_variational`` too:
    the leg's estimates and barrier, its number of levels, its own round trips and restarts (its
    reference -> target -> its reference, a replica in the other leg counted as at the target).
    ``offset`` (the target's ``log_z_reference``) is added to the per-leg log Z entries, as the callers add
    it to the chain's own."""
    rej = rejection(trace)
    ll = trace.loglik.T  # [K, T]
    if legs is None or int(np.max(legs)) == 0:
        lam, _ = schedule.communication_barrier(betas, rej)
        ss, ss_se = _stepping_stone(betas, ll)
        ti, ti_se = _thermodynamic_integration(betas, ll)
        return {
            "barrier": float(lam),
            "log_z_ss": float(ss),
            "log_z_ss_se": float(ss_se),
            "log_z_ti": float(ti),
            "log_z_ti_se": float(ti_se),
        }
    est = variational.leg_estimates(betas, legs, ll, rej)
    out = {k: est[k] for k in ("barrier", "log_z_ss", "log_z_ss_se", "log_z_ti", "log_z_ti_se")}
    for name, leg, w in zip(variational.LEG_NAMES, est["legs"], est["weights"]):
        out.update({f"{k}_{name}": v + offset if k in ("log_z_ss", "log_z_ti") else v for k, v in leg.items()})
        out[f"log_z_weight_{name}"] = w
        out[f"n_levels_{name}"] = int(np.sum(np.asarray(legs) == variational.LEG_NAMES.index(name)))
        if leg_rts is not None:
            st = leg_rts[variational.LEG_NAMES.index(name)]
            out[f"round_trips_{name}"], out[f"restarts_{name}"] = int(st.trips.sum()), int(st.restarts.sum())
    return out


def round_summary(c: int, target, chain: ChainRound) -> dict:
    """Chain c's metrics of a round: estimates (offset by the reference's log Z), acceptance, round
    trips, and the error against the target's exact log Z where known."""
    betas, trace, rts = chain.betas, chain.trace, chain.rts
    rej = rejection(trace)
    est = chain_estimates(betas, trace, chain.legs, chain.leg_rts, target.log_z_reference)
    lam, ss, ss_se, ti, ti_se = (est.pop(k) for k in ("barrier", "log_z_ss", "log_z_ss_se", "log_z_ti", "log_z_ti_se"))
    out = {
        "chain": c,
        "barrier": float(lam),
        "swap_accept_mean": float(1 - rej.mean()),
        "swap_accepted_frac": float(trace.accepted[trace.proposed].mean()) if trace.proposed.any() else float("nan"),
        "local_accept_mean": float(trace.local_accept.mean()),
        "round_trips": int(rts.trips.sum()),
        "restarts": int(rts.restarts.sum()),
        "log_z_ss": target.log_z_reference + float(ss),
        "log_z_ss_se": float(ss_se),
        "log_z_ti": target.log_z_reference + float(ti),
        "log_z_ti_se": float(ti_se),
        **est,
    }
    if target.exact_log_z is not None:
        out["log_z_ss_error"] = out["log_z_ss"] - target.exact_log_z
    return out


def per_level_table(betas, trace, target):
    """Per-temperature estimates and diagnostics from one round's trace (and the target's own columns,
    e.g. a spin system's temperature, energy and specific heat)."""
    K = len(betas)
    rows = []
    extra = target.level_columns(betas, trace)
    ess_ll = diagnostics.effective_sample_size(trace.loglik.T)
    ess_m = diagnostics.effective_sample_size(trace.abs_m.T)
    acc_pair = trace.accept_prob.mean(axis=0)
    for k in range(K):
        b = float(betas[k])
        row = {
            "level": k,
            "b": b,
            "local_accept": float(trace.local_accept[:, k].mean()),
            "swap_accept_to_next": float(acc_pair[k]) if k < K - 1 else float("nan"),
            "mean_loglik": float(trace.loglik[:, k].mean()),
            "ess_loglik": float(ess_ll[k]),
            "mean_abs_m": float(trace.abs_m[:, k].mean()),
            "ess_abs_m": float(ess_m[k]),
        }
        row.update(extra[k])
        rows.append(row)
    return rows


def final_results(target, chains: list[ChainRound], history: list) -> dict:
    """The run's results from the last round of each chain of one target (``chains``, in order)."""
    C = len(chains)
    betas, traces, rts = [ch.betas for ch in chains], [ch.trace for ch in chains], [ch.rts for ch in chains]
    exact_log_z, exact_how = target.exact_log_z, target.exact_source
    rows, per_level = [], []
    ss_all, ti_all, ests = [], [], []
    for c in range(C):
        est = chain_estimates(betas[c], traces[c], chains[c].legs, chains[c].leg_rts, target.log_z_reference)
        ests.append(est)
        ss, ss_se, ti, ti_se = est["log_z_ss"], est["log_z_ss_se"], est["log_z_ti"], est["log_z_ti_se"]
        ss_all.append((target.log_z_reference + ss, ss_se))
        ti_all.append((target.log_z_reference + ti, ti_se))
        rows.append({"chain": c, "method": "stepping_stone", "log_z": ss_all[-1][0], "se": ss_se})
        rows.append({"chain": c, "method": "thermodynamic_integration", "log_z": ti_all[-1][0], "se": ti_se})
        per_level.append(per_level_table(betas[c], traces[c], target))
    ss = float(np.mean([v for v, _ in ss_all]))
    ss_se = float(np.sqrt(sum(s**2 for _, s in ss_all)) / C)
    ti = float(np.mean([v for v, _ in ti_all]))
    ti_se = float(np.sqrt(sum(s**2 for _, s in ti_all)) / C)
    total_scans = sum(h["scans"] for h in history) if history else 0
    rej = [rejection(t) for t in traces]
    lam = float(np.mean([e["barrier"] for e in ests]))
    trips = int(sum(int(s.trips.sum()) for s in rts))
    res = {
        "log_z_ss": ss,
        "log_z_ss_se": ss_se,
        "log_z_ti": ti,
        "log_z_ti_se": ti_se,
        "barrier": lam,
        "round_trips": trips,
        "restarts": int(sum(int(s.restarts.sum()) for s in rts)),
        "swap_accept_mean": float(np.mean([1 - r.mean() for r in rej])),
        "local_accept_mean": float(np.mean([t.local_accept.mean() for t in traces])),
        "local_accept_per_replica": [t.replica_accept.mean(axis=0).tolist() for t in traces],
        "swap_accept_per_pair": [t.accept_prob.mean(axis=0).tolist() for t in traces],
        "n_levels": len(betas[0]),
        "n_chains": C,
        "scans_total": total_scans,
        "exact_log_z_source": exact_how,
        "per_level": per_level,
        "log_z_table": rows,
    }
    for key in sorted(set(ests[0]) - {"barrier", "log_z_ss", "log_z_ss_se", "log_z_ti", "log_z_ti_se"}):
        vals = np.array([e[key] for e in ests])
        res[key] = (
            int(vals.sum())
            if key.startswith(COUNTS)
            else float(np.sqrt(np.sum(vals**2)) / C)
            if "_se_" in key
            else float(vals.mean())
        )
    res.update(target.per_site_results(ss))
    if C >= 2:
        series = np.stack([target.observable(t).T for t in traces], axis=1)  # [K, C, T]
        rhat = diagnostics.split_rhat(series)
        res["rhat_max"] = float(np.nanmax(rhat))
        res["rhat_per_level"] = [float(v) for v in rhat]
    if exact_log_z is not None:
        res["log_z_exact"] = exact_log_z
        res["log_z_ss_error"] = ss - exact_log_z
        res["log_z_ss_error_sigmas"] = (ss - exact_log_z) / ss_se if ss_se > 0 else float("inf")
        res["log_z_ti_error"] = ti - exact_log_z
        res["log_z_ti_error_sigmas"] = (ti - exact_log_z) / ti_se if ti_se > 0 else float("inf")
        res["objective"] = abs(ss - exact_log_z)
        rows.append({"chain": -1, "method": f"exact ({exact_how})", "log_z": exact_log_z, "se": 0.0})
    else:
        res["objective"] = ss_se
    rows.append({"chain": -1, "method": "stepping_stone (all chains)", "log_z": ss, "se": ss_se})
    rows.append({"chain": -1, "method": "thermodynamic_integration (all chains)", "log_z": ti, "se": ti_se})
    return res


def combine_targets(per_group: list[dict]) -> dict:
    """Results of several targets farmed at once: per-target entries plus flat per-target metrics."""
    out = {
        "targets": per_group,
        "n_targets": len(per_group),
        "objective": float(np.mean([r["objective"] for r in per_group])),
        "barrier": float(np.mean([r["barrier"] for r in per_group])),
        "round_trips": int(sum(r["round_trips"] for r in per_group)),
        "swap_accept_mean": float(np.mean([r["swap_accept_mean"] for r in per_group])),
        "scans_total": per_group[0]["scans_total"],
    }
    for g, r in enumerate(per_group):
        for k in ("log_z_ss", "log_z_ss_se", "log_z_ti", "log_z_ti_se", "log_z_exact", "log_z_ss_error_sigmas"):
            if k in r:
                out[f"{k}_target{g}"] = r[k]
    return out


def print_summary(say, res, prefix=""):
    line = (
        f"pgmflow: {prefix}log Z = {res['log_z_ss']:.6f} ± {res['log_z_ss_se']:.6f} (stepping stone), "
        f"{res['log_z_ti']:.6f} ± {res['log_z_ti_se']:.6f} (thermodynamic integration)"
    )
    if "log_z_exact" in res:
        line += (
            f"; exact {res['log_z_exact']:.6f} ({res['exact_log_z_source']}), "
            f"error {res['log_z_ss_error_sigmas']:+.2f} SE"
        )
    line += f"; barrier Λ = {res['barrier']:.3f}, {res['round_trips']} round trips"
    say(line, prefix="", summary=True)
