"""Parallel tempering pipeline: the graph builder, the ordered reduce, checkpoints and logging.

Graph of one round ``r`` (``2^r`` scans) of chain ``c``, with the replicas split into blocks::

    state[b] --explore(scan s)--> state[b] --explore(scan s+1)--> ...      one task per block and scan
                  \\ stats[b]                 \\
    record(s-1) --> communicate(scan s) --> record(s) --> ...            one small task per scan

Block states never leave their worker; only the per-replica statistics (a few floats) reach the
swap task, and only the records (per-level floats) reach the driver, gathered once per round.
Keys are deterministic (``pt-explore-<run>-c<chain>-s<scan>-b<block>``); every random number is
keyed by (seed, chain, replica, scan/sweep), so the result does not depend on the number of
blocks, workers, or on the scheduler.
"""

from __future__ import annotations

import io
import json
import tempfile
import time
from pathlib import Path

import dask
import numpy as np

from pipelines import preflight
from pipelines.progress import Progress
from tasks import backend as backend_mod
from tasks import rng as _rng
from tasks.tempering import diagnostics, engine, estimators, schedule

CHECKPOINT_DIR = "checkpoints"
TARGET_ACCEPT = {"rwm": 0.3, "hmc": 0.65}


# --- references -------------------------------------------------------------------------------

def reference_log_z(target) -> tuple[float | None, str]:
    """The exact log Z of the target where one is known, and how it was obtained."""
    if target.kind == "ising":
        from tasks.tempering import exact

        uniform_bonds = bool(np.all(target.bonds_h == target.bonds_h.flat[0]) and
                             np.all(target.bonds_v == target.bonds_h.flat[0]))
        if uniform_bonds and target.h == 0.0:
            # An antiferromagnet on an even periodic lattice maps onto the ferromagnet (flip one sublattice).
            return float(exact.kaufman_log_z(target.L, target.L, target.J_abs, target.beta_model)), "kaufman"
        if target.L <= 10:
            res = exact.ising_log_z_transfer_matrix(target.bonds_h, target.bonds_v, target.J_abs, target.h,
                                                    target.beta_model)
            return float(res["log_z"] if isinstance(res, dict) else res), "transfer_matrix"
        return None, "none"
    val = getattr(target, "exact_log_z", None)
    return (float(val), "analytic") if val is not None else (None, "none")


# --- checkpoints ------------------------------------------------------------------------------

def _save_checkpoint(path: Path, rnd: int, betas, levels, steps, xs, rts, history):
    np.savez(path, round=np.int64(rnd), betas=np.stack(betas), levels=np.stack(levels), steps=np.stack(steps),
             x=np.stack(xs), rt_phase=np.stack([s.phase for s in rts]), rt_trips=np.stack([s.trips for s in rts]),
             history=np.array(json.dumps(history)))


def _load_checkpoint(tracker, max_round: int):
    """The newest readable checkpoint of the run up to round ``max_round``, or None.

    The final round's checkpoint is skipped on purpose: the final analysis needs that round's
    traces, so a run killed after its last checkpoint re-runs the last round (identically).
    """
    try:
        names = sorted(tracker.list_artifacts(CHECKPOINT_DIR))
    except Exception:
        return None
    names = [n for n in names if int(Path(n).stem.split("_")[-1]) <= max_round]
    for name in reversed(names):
        try:
            with np.load(tracker.download(name), allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        except Exception:
            continue  # a checkpoint cut short by the interruption: fall back to the previous one
    return None


# --- the run ----------------------------------------------------------------------------------

def _gather_states(ex, handles_per_chain):
    """Host arrays [C, R, ...] of the replicas' states, in replica order."""
    out = []
    for handles in handles_per_chain:
        blocks = ex.gather(list(handles))
        ids = np.concatenate([b.replica_ids for b in blocks])
        x = np.concatenate([backend_mod.to_numpy(b.x) for b in blocks])
        out.append(x[np.argsort(ids, kind="stable")])
    return out


def _stepping_stone(betas, loglik):
    """Stepping stone, the mean of the forward and reverse estimators (their first-order biases,
    -var/2 and +var/2 in log Z, cancel), with the joint SE that keeps correlations between levels."""
    return tuple(estimators.stepping_stone_joint(betas, loglik))


def _thermodynamic_integration(betas, loglik):
    return tuple(estimators.thermodynamic_integration_joint(betas, loglik))


def _rejection(trace: engine.RoundTrace) -> np.ndarray:
    return 1.0 - trace.accept_prob.mean(axis=0)


def _round_summary(c, betas, trace, rts, target, exact_log_z):
    rej = _rejection(trace)
    lam, _ = schedule.communication_barrier(betas, rej)
    ll = trace.loglik.T  # [K, T]
    ss, ss_se = _stepping_stone(betas, ll)
    ti, ti_se = _thermodynamic_integration(betas, ll)
    out = {"chain": c, "barrier": float(lam), "swap_accept_mean": float(1 - rej.mean()),
           "swap_accepted_frac": float(trace.accepted[trace.proposed].mean()) if trace.proposed.any() else float("nan"),
           "local_accept_mean": float(trace.local_accept.mean()), "round_trips": int(rts.trips.sum()),
           "log_z_ss": target.log_z_reference + float(ss), "log_z_ss_se": float(ss_se),
           "log_z_ti": target.log_z_reference + float(ti), "log_z_ti_se": float(ti_se)}
    if exact_log_z is not None:
        out["log_z_ss_error"] = out["log_z_ss"] - exact_log_z
    return out


def _per_level_table(betas, trace, target):
    """Per-temperature estimates and diagnostics from one round's trace."""
    K = len(betas)
    rows = []
    ess_e = diagnostics.effective_sample_size(trace.energy.T) if target.kind == "ising" else None
    ess_ll = diagnostics.effective_sample_size(trace.loglik.T)
    ess_m = diagnostics.effective_sample_size(trace.abs_m.T)
    acc_pair = trace.accept_prob.mean(axis=0)
    for k in range(K):
        b = float(betas[k])
        row = {"level": k, "b": b, "local_accept": float(trace.local_accept[:, k].mean()),
               "swap_accept_to_next": float(acc_pair[k]) if k < K - 1 else float("nan"),
               "mean_loglik": float(trace.loglik[:, k].mean()), "ess_loglik": float(ess_ll[k]),
               "mean_abs_m": float(trace.abs_m[:, k].mean()), "ess_abs_m": float(ess_m[k])}
        if target.kind == "ising":
            n = target.n_sites
            beta = b * target.beta_model
            e = trace.energy[:, k]
            row.update({"temperature": (1.0 / beta) if beta > 0 else float("inf"), "energy_per_site": float(e.mean() / n),
                        "specific_heat_per_site": float(beta**2 * e.var() / n), "ess_energy": float(ess_e[k])})
        rows.append(row)
    return rows


def _csv(rows: list[dict]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])
    buf = io.StringIO()
    buf.write(",".join(keys) + "\n")
    for r in rows:
        buf.write(",".join(f"{r[k]:.10g}" if isinstance(r[k], float) else str(r[k]) for k in keys) + "\n")
    return buf.getvalue()


def _layout(tcfg, target, K, C, n_workers, backend) -> tuple[str, int]:
    """How the graph is cut: ``chain`` (one task runs several scans of a whole chain) or ``blocks``
    (one task per block of replicas per scan), and the scans per task of the chain layout.

    Both give bit-identical results. ``auto`` picks blocks only when one scan of a chain is heavy
    enough (~50 ms) to pay for a scheduler round trip per scan and the workers outnumber the chains.
    """
    if target.kind == "ising":
        per_scan_s = K * target.n_sites * int(tcfg["sweeps_per_scan"]) * 1.5e-9
    else:
        inner = int(tcfg["n_leapfrog"]) if tcfg["explorer"] == "hmc" else 1
        per_scan_s = K * int(tcfg["sweeps_per_scan"]) * inner * 30e-6
    layout = tcfg.get("layout", "auto")
    if layout == "auto":
        layout = "blocks" if (per_scan_s > 0.05 and n_workers >= 2 * C and backend == "numpy") else "chain"
    per_task = tcfg.get("scans_per_task", "auto")
    if per_task == "auto":
        per_task = int(min(max(1, 0.5 / max(per_scan_s, 1e-9)), 4096))
    return layout, int(per_task)


def run(ctx) -> dict:
    cfg = ctx.cfg
    tcfg, mcfg = cfg["tempering"], cfg["model"]
    seed = int(cfg["seed"])
    tracker, ex = ctx.tracker, ctx.executor
    # Targets farmed at once: one per entry of chain_overrides (or just the model), each run by
    # n_chains independent chains; chain c runs target group c // n_chains.
    overrides = tcfg.get("chain_overrides") or [{}]
    G = len(overrides)
    group_targets = [preflight.build_target({**mcfg, **ov}) for ov in overrides]
    method = preflight.resolve_explorer(tcfg["explorer"], mcfg["name"])
    ladder = tcfg.get("ladder")
    K = len(ladder) if ladder else int(tcfg["n_replicas"])
    per_target = int(tcfg["n_chains"])
    C = G * per_target
    group_of = [c // per_target for c in range(C)]
    chain_target = [group_targets[g] for g in group_of]
    target = group_targets[0]
    n_rounds = int(tcfg["n_rounds"])
    n_blocks = ctx.cluster.n_workers if tcfg["n_blocks"] == "auto" else int(tcfg["n_blocks"])
    n_blocks = max(1, min(n_blocks, K))
    layout, per_task = _layout(tcfg, max(group_targets, key=lambda t: getattr(t, "n_sites", 0)), K, C,
                               ctx.cluster.n_workers, ctx.backend)
    if layout == "chain":
        n_blocks = 1
    blocks = [np.asarray(b, dtype=np.int64) for b in np.array_split(np.arange(K), n_blocks)]
    params = [engine.ExploreParams(method=method, n_steps=int(tcfg["sweeps_per_scan"]),
                                   n_leapfrog=int(tcfg["n_leapfrog"]), seed=seed, chain=c,
                                   philox_key=_rng.philox_key(seed, _rng.STAGE_ISING_KEY, c), backend=ctx.backend)
              for c in range(C)]
    group_exact = [reference_log_z(t) for t in group_targets]
    tracker.set_tags({"pgmflow.tempering.explorer": method, "pgmflow.tempering.exact_log_z": group_exact[0][1],
                      "pgmflow.tempering.targets": G})
    group_h = [ex.scatter(t) for t in group_targets]
    target_h = [group_h[g] for g in group_of]
    tok = tracker.run_id[:12]

    # ---- initial state or checkpoint --------------------------------------------------------
    ckpt = _load_checkpoint(tracker, n_rounds - 1) if ctx.resumed else None
    if ckpt is not None:
        start_round = int(ckpt["round"]) + 1
        betas = [np.array(b) for b in ckpt["betas"]]
        levels = [np.array(lv) for lv in ckpt["levels"]]
        steps = [np.array(s) for s in ckpt["steps"]]
        rts = [diagnostics.RoundTripState(phase=np.array(p), trips=np.array(t))
               for p, t in zip(ckpt["rt_phase"], ckpt["rt_trips"])]
        history = json.loads(str(ckpt["history"]))
        x = ckpt["x"]
        states = []
        to_device = backend_mod.cupy().asarray if ctx.backend == "cupy" else (lambda a: a)
        for c in range(C):
            states.append([engine.BlockState(replica_ids=ids, x=to_device(np.ascontiguousarray(x[c][ids])))
                           for ids in blocks])
        print(f"pgmflow: resuming from the checkpoint after round {start_round - 1}", flush=True)
    else:
        start_round = 1
        if ladder:
            b0 = np.asarray(ladder, dtype=np.float64)
        elif tcfg["initial_schedule"] == "power":
            b0 = schedule.initial_schedule(K, kind="power", power=float(tcfg["schedule_power"]))
        else:
            b0 = schedule.initial_schedule(K, kind="linear")
        betas = [b0.copy() for _ in range(C)]
        levels = [np.arange(K, dtype=np.int64) for _ in range(C)]
        steps = [np.full(K, float(tcfg["step_size"])) for _ in range(C)]
        rts = [diagnostics.round_trip_init(K) for _ in range(C)]
        history = []
        states = [[dask.delayed(engine.init_block, pure=True)(target_h[c], ids, params[c],
                                                               dask_key_name=f"pt-init-{tok}-c{c}-b{b}")
                   for b, ids in enumerate(blocks)] for c in range(C)]

    total_scans = C * sum(2**r for r in range(start_round, n_rounds + 1))
    bar = Progress(total_scans, "tempering", "scans", enabled=ctx.progress)
    last_traces: list[engine.RoundTrace] = []
    t_start = time.monotonic()
    tracker.set_tags({"pgmflow.tempering.layout": layout, "pgmflow.tempering.blocks": n_blocks,
                      "pgmflow.tempering.scans_per_task": per_task})
    for rnd in range(start_round, n_rounds + 1):
        n_scans = 2**rnd
        scan0 = 2**rnd - 2  # rounds 1, 2, ... run 2, 4, ... scans
        outputs, watch, watch_scans, state_slots, rec_slots = [], [], [], [], []
        for c in range(C):
            rec_slots.append([])
            if layout == "chain":
                prev = [engine.initial_record(K)._replace(levels=levels[c])]
                st = states[c][0]
                for s in range(scan0, scan0 + n_scans, per_task):
                    m = min(per_task, scan0 + n_scans - s)
                    out = dask.delayed(engine.run_scans, nout=2, pure=True)(
                        st, prev, betas[c], steps[c], target_h[c], params[c], tcfg["swap"], s, m,
                        dask_key_name=f"pt-scans-{tok}-c{c}-s{s}")
                    st, prev = out[0], out[1]
                    rec_slots[c].append(len(outputs))
                    watch.append(len(outputs))
                    watch_scans.append(m)
                    outputs.append(prev)
                st = [st]
            else:
                rec = engine.initial_record(K)._replace(levels=levels[c])
                st = list(states[c])
                for s in range(scan0, scan0 + n_scans):
                    outs = [dask.delayed(engine.explore_block, nout=2, pure=True)(
                        st[b], rec, betas[c], steps[c], target_h[c], params[c], s,
                        dask_key_name=f"pt-explore-{tok}-c{c}-s{s}-b{b}") for b in range(n_blocks)]
                    st = [o[0] for o in outs]
                    rec = dask.delayed(engine.communicate, pure=True)(
                        rec, betas[c], tcfg["swap"], seed, c, s, *[o[1] for o in outs],
                        dask_key_name=f"pt-swap-{tok}-c{c}-s{s}")
                    rec_slots[c].append(len(outputs))
                    watch.append(len(outputs))
                    watch_scans.append(1)
                    outputs.append(rec)
            state_slots.append(list(range(len(outputs), len(outputs) + len(st))))
            outputs.extend(st)

        t_round = time.monotonic()

        scans_of = dict(zip(watch, watch_scans))
        round_label = f"{rnd}/{n_rounds}"
        handles = ex.compute(outputs, watch=watch,
                             on_done=lambda i: bar.update(scans_of[i], round=round_label))
        gathered = ex.gather([handles[i] for c in range(C) for i in rec_slots[c]])
        records, pos = [], 0
        for c in range(C):
            for _ in rec_slots[c]:
                item = gathered[pos]
                pos += 1
                records.extend(item if isinstance(item, list) else [item])
        old_states = [h for c in range(C) for h in states[c]]
        states = [[handles[i] for i in state_slots[c]] for c in range(C)]
        ex.release(old_states)
        dt = time.monotonic() - t_round

        # ---- ordered reduce: chains in order, scans in order --------------------------------
        last_traces = []
        summaries = []
        for c in range(C):
            recs_c = records[c * n_scans:(c + 1) * n_scans]
            trace = engine.stack_records(recs_c)
            last_traces.append(trace)
            levels[c] = trace.levels[-1].copy()
            rts[c] = diagnostics.round_trip_update(rts[c], trace.levels, K)
            summaries.append(_round_summary(c, betas[c], trace, rts[c], chain_target[c],
                                            group_exact[group_of[c]][0]))
        log_z_keys = {"log_z_ss", "log_z_ss_se", "log_z_ti", "log_z_ti_se", "log_z_ss_error"}
        agg = {k: float(np.mean([s[k] for s in summaries])) for k in summaries[0]
               if k != "chain" and (G == 1 or k not in log_z_keys)}
        if G == 1:
            agg["log_z_ss_se"] = float(np.sqrt(np.sum([s["log_z_ss_se"] ** 2 for s in summaries])) / C)
            agg["log_z_ti_se"] = float(np.sqrt(np.sum([s["log_z_ti_se"] ** 2 for s in summaries])) / C)
        agg["round_trips"] = float(np.sum([s["round_trips"] for s in summaries]))
        if target.kind == "ising":
            site_updates = sum(K * n_scans * int(tcfg["sweeps_per_scan"]) * t.n_sites for t in chain_target)
            agg["site_updates_per_ns"] = site_updates / (dt * 1e9)
        agg["scans_per_s"] = C * n_scans / dt
        agg["round_seconds"] = dt
        metrics = dict(agg)
        if C > 1:
            for s in summaries:
                metrics.update({f"{k}_c{s['chain']}": v for k, v in s.items()
                                if k in ("log_z_ss", "log_z_ss_se", "barrier")})
        tracker.log_metrics(metrics, step=rnd)
        groups = []
        for g in range(G):
            ss_g = [s for c, s in enumerate(summaries) if group_of[c] == g]
            n_g = len(ss_g)
            groups.append({"log_z_ss": float(np.mean([s["log_z_ss"] for s in ss_g])),
                           "log_z_ss_se": float(np.sqrt(np.sum([s["log_z_ss_se"] ** 2 for s in ss_g])) / n_g),
                           "log_z_ti": float(np.mean([s["log_z_ti"] for s in ss_g])),
                           "round_trips": int(np.sum([s["round_trips"] for s in ss_g]))})
        history.append({"round": rnd, "scans": n_scans, "betas": [b.tolist() for b in betas], "groups": groups,
                        **agg})
        bar.set(swap=agg["swap_accept_mean"], barrier=agg["barrier"], trips=int(agg["round_trips"]))

        # ---- adapt the ladder and the step sizes for the next round -------------------------
        if rnd < n_rounds:
            for c in range(C):
                if tcfg["adapt_schedule"] and not ladder:
                    betas[c] = schedule.adapt_schedule(betas[c], _rejection(last_traces[c]))
                if chain_target[c].kind != "ising":
                    acc = last_traces[c].local_accept.mean(axis=0)
                    steps[c] = np.clip(steps[c] * np.exp(2.0 * (acc - TARGET_ACCEPT[method])), 1e-4, 1e3)

        # ---- checkpoint ----------------------------------------------------------------------
        every = int(tcfg["checkpoint_every"])
        if every and (rnd % every == 0 or rnd == n_rounds):
            xs = _gather_states(ex, states)
            with tempfile.TemporaryDirectory() as d:
                p = Path(d) / f"round_{rnd:03d}.npz"
                _save_checkpoint(p, rnd, betas, levels, steps, xs, rts, history)
                tracker.log_artifact(p, CHECKPOINT_DIR)
        tracker.flush()
    bar.close()

    # ---- final analysis on the last round (fixed ladder) --------------------------------------
    final_betas = [np.asarray(h) for h in history[-1]["betas"]]
    xs = _gather_states(ex, states)
    per_group = []
    for g in range(G):
        cs = [c for c in range(C) if group_of[c] == g]
        res_g = _final_results(cfg, group_targets[g], [final_betas[c] for c in cs], [last_traces[c] for c in cs],
                               [rts[c] for c in cs], *group_exact[g], history)
        res_g["chains"] = cs
        res_g["model_overrides"] = overrides[g]
        per_group.append(res_g)
    if cfg.get("bounds"):
        _log_bounds(ctx, group_targets, per_group, final_betas, last_traces, G)
    if G == 1:
        results = per_group[0]
    else:
        results = _combine_targets(per_group)
        for g, res_g in enumerate(per_group):
            results.update({f"{k}_target{g}": v for k, v in res_g.items() if k.startswith("bounds_")})
    results["wall_seconds"] = time.monotonic() - t_start
    per_round = set(history[-1]) if history else set()  # already logged at this step
    per_round.discard("groups")
    tracker.log_metrics({k: v for k, v in results.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                         and k not in per_round}, step=n_rounds, flush=True)
    tracker.log_dict({k: v for k, v in results.items() if k != "per_level"}, "results.json")
    for res_g in per_group:
        for c, rows in zip(res_g["chains"], res_g["per_level"]):
            tracker.log_text(_csv(rows), f"tables/per_temperature_chain{c}.csv")
    tracker.log_text(_csv([dict(target=g, **row) for g, res_g in enumerate(per_group) for row in res_g["log_z_table"]]),
                     "tables/log_z.csv")
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "final_state.npz"
        np.savez(p, betas=np.stack(final_betas), levels=np.stack(levels), x=np.stack(xs))
        tracker.log_artifact(p)
    if tcfg["figures"]:
        from pipelines import figures

        for g, res_g in enumerate(per_group):
            cs = res_g["chains"]
            suffix = f"_target{g}" if G > 1 else ""
            hist_g = [{**h, **h["groups"][g]} for h in history]
            for name, fig in figures.tempering_figures(group_targets[g], [final_betas[c] for c in cs],
                                                       [last_traces[c] for c in cs], hist_g, res_g).items():
                tracker.log_figure(fig, f"figures/{name}{suffix}.png")
                figures.close(fig)
    for g, res_g in enumerate(per_group):
        _print_summary(res_g, f"target {g} {res_g['model_overrides']}: " if G > 1 else "")
        res_g.pop("per_level", None)
    results.pop("per_level", None)
    return results


def _log_bounds(ctx, group_targets, per_group, final_betas, last_traces, G):
    """bounds=true: MF, Bethe and TRW at every temperature of chain 0's ladder of each target (one task
    per temperature), beside the tempering estimate there; a table, a figure and the gaps at the target."""
    from pipelines import bounds as bounds_mod
    from pipelines import figures

    tracker = ctx.tracker
    for g, res_g in enumerate(per_group):
        cs = res_g["chains"]
        suffix = f"_target{g}" if G > 1 else ""
        out = bounds_mod.tempering_bounds(ctx, group_targets[g], [final_betas[c] for c in cs],
                                          [last_traces[c] for c in cs], g)
        rows = out["rows"]
        tracker.log_text(_csv(rows), f"tables/bounds{suffix}.csv")
        last = rows[-1]
        res_g.update({"bounds_mf_per_site": last["mf_per_site"], "bounds_bethe_per_site": last["bethe_per_site"],
                      "bounds_trw_per_site": last["trw_per_site"],
                      "bounds_gap_tempering_minus_mf_per_site": last["gap_tempering_minus_mf"],
                      "bounds_gap_trw_minus_tempering_per_site": last["gap_trw_minus_tempering"],
                      "bounds_order_holds": all(r["order_holds_2se"] for r in rows),
                      "bounds_all_converged": all(r["converged"] for r in rows)})
        if ctx.cfg["variational"].get("figures", True):
            T = group_targets[g].beta_model
            fig = figures.bounds_figure([r["beta"] for r in rows], {k: [r[f"{k}_per_site"] for r in rows]
                                                                     for k in ("mf", "bethe", "trw")}, None,
                                        [r["tempering_per_site"] for r in rows],
                                        [r["tempering_se_per_site"] for r in rows],
                                        f"log Z per spin: {group_targets[g].L}x{group_targets[g].L} Ising, "
                                        f"ladder up to T = {1.0 / T:.4g} (chain 0)")
            tracker.log_figure(fig, f"figures/log_z_bounds{suffix}.png")
            figures.close(fig)
        print(f"pgmflow: {'target ' + str(g) + ': ' if G > 1 else ''}bounds at T = "
              f"{1.0 / group_targets[g].beta_model:.6g}: MF {last['mf_per_site']:.6f} <= tempering "
              f"{last['tempering_per_site']:.6f} ± {last['tempering_se_per_site']:.6f} <= TRW "
              f"{last['trw_per_site']:.6f} per spin (Bethe {last['bethe_per_site']:.6f}); order holds (2 SE) at "
              f"{sum(r['order_holds_2se'] for r in rows)}/{len(rows)} ladder temperatures", flush=True)


def _combine_targets(per_group: list[dict]) -> dict:
    """Results of several targets farmed at once: per-target entries plus flat per-target metrics."""
    out = {"targets": per_group, "n_targets": len(per_group),
           "objective": float(np.mean([r["objective"] for r in per_group])),
           "barrier": float(np.mean([r["barrier"] for r in per_group])),
           "round_trips": int(sum(r["round_trips"] for r in per_group)),
           "swap_accept_mean": float(np.mean([r["swap_accept_mean"] for r in per_group])),
           "scans_total": per_group[0]["scans_total"]}
    for g, r in enumerate(per_group):
        for k in ("log_z_ss", "log_z_ss_se", "log_z_ti", "log_z_ti_se", "log_z_exact", "log_z_ss_error_sigmas"):
            if k in r:
                out[f"{k}_target{g}"] = r[k]
    return out


def _final_results(cfg, target, betas, traces, rts, exact_log_z, exact_how, history):
    C = len(traces)
    rows, per_level = [], []
    ss_all, ti_all = [], []
    for c in range(C):
        ll = traces[c].loglik.T
        ss, ss_se = _stepping_stone(betas[c], ll)
        ti, ti_se = _thermodynamic_integration(betas[c], ll)
        ss_all.append((target.log_z_reference + ss, ss_se))
        ti_all.append((target.log_z_reference + ti, ti_se))
        rows.append({"chain": c, "method": "stepping_stone", "log_z": ss_all[-1][0], "se": ss_se})
        rows.append({"chain": c, "method": "thermodynamic_integration", "log_z": ti_all[-1][0], "se": ti_se})
        per_level.append(_per_level_table(betas[c], traces[c], target))
    ss = float(np.mean([v for v, _ in ss_all]))
    ss_se = float(np.sqrt(sum(s**2 for _, s in ss_all)) / C)
    ti = float(np.mean([v for v, _ in ti_all]))
    ti_se = float(np.sqrt(sum(s**2 for _, s in ti_all)) / C)
    total_scans = sum(h["scans"] for h in history) if history else 0
    rej = [_rejection(t) for t in traces]
    lam = float(np.mean([schedule.communication_barrier(b, r)[0] for b, r in zip(betas, rej)]))
    trips = int(sum(int(s.trips.sum()) for s in rts))
    res = {"log_z_ss": ss, "log_z_ss_se": ss_se, "log_z_ti": ti, "log_z_ti_se": ti_se,
           "barrier": lam, "round_trips": trips,
           "swap_accept_mean": float(np.mean([1 - r.mean() for r in rej])),
           "local_accept_mean": float(np.mean([t.local_accept.mean() for t in traces])),
           "local_accept_per_replica": [t.replica_accept.mean(axis=0).tolist() for t in traces],
           "swap_accept_per_pair": [t.accept_prob.mean(axis=0).tolist() for t in traces],
           "n_levels": len(betas[0]), "n_chains": C, "scans_total": total_scans,
           "exact_log_z_source": exact_how, "per_level": per_level, "log_z_table": rows}
    if target.kind == "ising":
        res["log_z_ss_per_site"] = ss / target.n_sites
    if C >= 2:
        series = np.stack([t.energy.T if target.kind == "ising" else t.loglik.T for t in traces], axis=1)  # [K, C, T]
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


def _print_summary(res, prefix=""):
    line = (f"pgmflow: {prefix}log Z = {res['log_z_ss']:.6f} ± {res['log_z_ss_se']:.6f} (stepping stone), "
            f"{res['log_z_ti']:.6f} ± {res['log_z_ti_se']:.6f} (thermodynamic integration)")
    if "log_z_exact" in res:
        line += f"; exact {res['log_z_exact']:.6f} ({res['exact_log_z_source']}), error {res['log_z_ss_error_sigmas']:+.2f} SE"
    line += f"; barrier Λ = {res['barrier']:.3f}, {res['round_trips']} round trips"
    print(line, flush=True)
