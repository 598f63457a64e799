"""Parallel tempering: the graph of each round, the ordered reduce, adaptation, checkpoints, logging.

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

import json
import time
from dataclasses import dataclass

import dask
import numpy as np

from pgmflow.pipelines.core import artifacts, datasets
from pgmflow.pipelines.core.progress import Progress
from pgmflow.pipelines.tempering import analysis
from pgmflow.pipelines.tempering import reference as ref_mod
from pgmflow.pipelines.tempering.targets import build_target, resolve_explorer
from pgmflow.tasks import backend as backend_mod
from pgmflow.tasks import rng as _rng
from pgmflow.tasks.tempering import diagnostics, engine, schedule
from pgmflow.tasks.tempering.exact import reference_log_z

TARGET_ACCEPT = {"rwm": 0.3, "hmc": 0.65}
LOG_Z_KEYS = {"log_z_ss", "log_z_ss_se", "log_z_ti", "log_z_ti_se", "log_z_ss_error"}


@dataclass
class Plan:
    """What stays fixed for the whole run. Targets farmed at once: one per entry of
    ``chain_overrides`` (or just the model), each run by ``n_chains`` chains; chain c runs target
    group ``group_of[c] = c // n_chains``."""

    tcfg: dict
    seed: int
    overrides: list
    group_targets: list
    method: str
    ladder: list | None
    K: int  # levels of each ladder
    C: int  # chains
    group_of: list
    n_rounds: int
    layout: str
    per_task: int
    n_blocks: int
    blocks: list  # replica ids of each block
    params: list  # engine.ExploreParams per chain
    group_exact: list  # (exact log Z or None, how) per target
    target_h: list  # handle of each chain's target on the cluster
    legs: np.ndarray | None = None  # leg of each level at the start (None: reference=fixed)
    split: str = "adaptive"  # stabilized: levels shared between the legs by their barriers | half
    family: str = "diagonal"  # variational family
    fit_from: int = 0  # first round run with a fitted reference

    @property
    def G(self) -> int:
        return len(self.group_targets)

    @property
    def chain_target(self) -> list:
        return [self.group_targets[g] for g in self.group_of]


@dataclass
class Chains:
    """What each round carries to the next, per chain: ladders, replica levels, step sizes, round-trip
    counters, the replicas' state handles, and the history of round summaries."""

    betas: list
    levels: list
    steps: list
    rts: list
    states: list
    history: list
    start_round: int
    qs: list  # per chain: the fitted variational reference (None: not fitted yet)
    leg_rts: list  # per chain: per-leg round-trip counters (None unless stabilized)
    legs: list  # per chain: the leg of each level this round (None: reference=fixed)


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


def _plan(ctx) -> Plan:
    cfg = ctx.cfg
    tcfg, mcfg = cfg["tempering"], cfg["model"]
    seed = int(cfg["seed"])
    overrides = tcfg.get("chain_overrides") or [{}]
    group_targets = [build_target({**mcfg, **ov}) for ov in overrides]
    method = resolve_explorer(tcfg["explorer"], mcfg["name"])
    ladder = tcfg.get("ladder")
    K = len(ladder) if ladder else int(tcfg["n_replicas"])
    per_target = int(tcfg["n_chains"])
    C = len(group_targets) * per_target
    group_of = [c // per_target for c in range(C)]
    n_blocks = ctx.cluster.n_workers if tcfg["n_blocks"] == "auto" else int(tcfg["n_blocks"])
    n_blocks = max(1, min(n_blocks, K))
    layout, per_task = _layout(tcfg, max(group_targets, key=lambda t: getattr(t, "n_sites", 0)), K, C,
                               ctx.cluster.n_workers, ctx.backend)
    if layout == "chain":
        n_blocks = 1
    params = [engine.ExploreParams(method=method, n_steps=int(tcfg["sweeps_per_scan"]),
                                   n_leapfrog=int(tcfg["n_leapfrog"]), seed=seed, chain=c,
                                   philox_key=_rng.philox_key(seed, _rng.STAGE_ISING_KEY, c), backend=ctx.backend)
              for c in range(C)]
    group_exact = [reference_log_z(t) for t in group_targets]
    ctx.tracker.set_tags({"pgmflow.tempering.explorer": method, "pgmflow.tempering.exact_log_z": group_exact[0][1],
                          "pgmflow.tempering.targets": len(group_targets)})
    for g, (t, ov) in enumerate(zip(group_targets, overrides)):  # MLflow dataset tracking: each target, with a digest
        spec = {**mcfg, **ov}
        datasets.log_input(ctx.tracker, f"{spec['name']} target" + (f" {g}" if len(overrides) > 1 else ""),
                           datasets.arrays_of(t), context="training", parameters=spec,
                           generator="pgmflow.pipelines.tempering.targets.build_target",
                           path=spec["data"]["path"] if spec["name"] == "bayes" else None)
    group_h = [ctx.executor.scatter(t) for t in group_targets]
    return Plan(tcfg=tcfg, seed=seed, overrides=overrides, group_targets=group_targets, method=method, ladder=ladder,
                K=K, C=C, group_of=group_of, n_rounds=int(tcfg["n_rounds"]), layout=layout, per_task=per_task,
                n_blocks=n_blocks, blocks=[np.asarray(b, dtype=np.int64) for b in np.array_split(np.arange(K), n_blocks)],
                params=params, group_exact=group_exact, target_h=[group_h[g] for g in group_of],
                legs=ref_mod.legs_of(tcfg, K), family=tcfg.get("variational_family", "diagonal"),
                fit_from=int(tcfg.get("variational_from_round", 0)), split=tcfg.get("stabilized_split", "adaptive"))


def _from_checkpoint(ctx, plan: Plan, ckpt: dict) -> Chains:
    to_device = backend_mod.cupy().asarray if ctx.backend == "cupy" else (lambda a: a)
    x = ckpt["x"]
    states = [[engine.BlockState(replica_ids=ids, x=to_device(np.ascontiguousarray(x[c][ids]))) for ids in plan.blocks]
              for c in range(plan.C)]
    start_round = int(ckpt["round"]) + 1
    ctx.say(f"resuming from the checkpoint after round {start_round - 1}")
    qs, leg_rts, legs = ref_mod.from_arrays(ckpt, plan.C, plan.legs)
    return Chains(qs=qs, leg_rts=leg_rts, legs=legs, betas=[np.array(b) for b in ckpt["betas"]],
                  levels=[np.array(lv) for lv in ckpt["levels"]],
                  steps=[np.array(s) for s in ckpt["steps"]],
                  rts=[diagnostics.RoundTripState(phase=np.array(p), trips=np.array(t), restarts=np.array(r))
                       for p, t, r in zip(ckpt["rt_phase"], ckpt["rt_trips"], ckpt["rt_restarts"])],
                  states=states, history=json.loads(str(ckpt["history"])), start_round=start_round)


def _initial(ctx, plan: Plan) -> Chains:
    """The chains at the start: from the newest checkpoint when resuming, else fresh.

    The final round's checkpoint is passed over on purpose: the final analysis needs that round's
    traces, so a run killed after its last checkpoint re-runs the last round (identically).
    """
    ckpt = artifacts.newest_checkpoint(ctx.tracker, plan.n_rounds - 1) if ctx.resumed else None
    if ckpt is not None:
        return _from_checkpoint(ctx, plan, ckpt)
    tcfg, K, C = plan.tcfg, plan.K, plan.C
    if plan.ladder:
        b0 = np.asarray(plan.ladder, dtype=np.float64)
    elif tcfg["initial_schedule"] == "power":
        b0 = ref_mod.initial_betas(plan.legs, K, lambda n: schedule.initial_schedule(
            n, kind="power", power=float(tcfg["schedule_power"])))
    else:
        b0 = ref_mod.initial_betas(plan.legs, K, lambda n: schedule.initial_schedule(n, kind="linear"))
    states = [[dask.delayed(engine.init_block, pure=True)(plan.target_h[c], ids, plan.params[c],
                                                           dask_key_name=f"pt-init-{ctx.token}-c{c}-b{b}")
               for b, ids in enumerate(plan.blocks)] for c in range(C)]
    return Chains(betas=[b0.copy() for _ in range(C)], levels=[np.arange(K, dtype=np.int64) for _ in range(C)],
                  steps=[np.full(K, float(tcfg["step_size"])) for _ in range(C)],
                  rts=[diagnostics.round_trip_init(K) for _ in range(C)], states=states, history=[], start_round=1,
                  qs=[None] * C, leg_rts=[ref_mod.leg_round_trips_init(plan.legs) for _ in range(C)],
                  legs=[None if plan.legs is None else plan.legs.copy() for _ in range(C)])


def _chain_graph(ctx, plan: Plan, chains: Chains, c: int, scan0: int, n_scans: int, outputs: list) -> tuple:
    """Append chain c's tasks of one round to ``outputs``; returns (record slots, their scans, states)."""
    tcfg, K = plan.tcfg, plan.K
    slots, scans = [], []
    path = ref_mod.path(plan.chain_target[c], chains.legs[c], chains.qs[c])
    if plan.layout == "chain":
        prev = [engine.initial_record(K)._replace(levels=chains.levels[c])]
        st = chains.states[c][0]
        for s in range(scan0, scan0 + n_scans, plan.per_task):
            m = min(plan.per_task, scan0 + n_scans - s)
            out = dask.delayed(engine.run_scans, nout=2, pure=True)(
                st, prev, chains.betas[c], chains.steps[c], plan.target_h[c], plan.params[c], tcfg["swap"], s, m, path,
                dask_key_name=f"pt-scans-{ctx.token}-c{c}-s{s}")
            st, prev = out[0], out[1]
            slots.append(len(outputs))
            scans.append(m)
            outputs.append(prev)
        return slots, scans, [st]
    rec = engine.initial_record(K)._replace(levels=chains.levels[c])
    st = list(chains.states[c])
    for s in range(scan0, scan0 + n_scans):
        outs = [dask.delayed(engine.explore_block, nout=2, pure=True)(
            st[b], rec, chains.betas[c], chains.steps[c], plan.target_h[c], plan.params[c], s, path,
            dask_key_name=f"pt-explore-{ctx.token}-c{c}-s{s}-b{b}") for b in range(plan.n_blocks)]
        st = [o[0] for o in outs]
        rec = dask.delayed(engine.communicate, pure=True)(
            rec, chains.betas[c], tcfg["swap"], plan.seed, c, s, *[o[1] for o in outs],
            legs=None if path is None else path.legs, dask_key_name=f"pt-swap-{ctx.token}-c{c}-s{s}")
        slots.append(len(outputs))
        scans.append(1)
        outputs.append(rec)
    return slots, scans, st


def _run_round(ctx, plan: Plan, chains: Chains, rnd: int, bar) -> tuple[list, float]:
    """Compute round ``rnd`` of every chain; returns the records (chains in order, scans in order) and
    the round's wall time. The replicas' new states stay on the workers (``chains.states``)."""
    ex = ctx.executor
    n_scans = 2**rnd
    scan0 = 2**rnd - 2  # rounds 1, 2, ... run 2, 4, ... scans
    outputs, watch, watch_scans, state_slots, rec_slots = [], [], [], [], []
    for c in range(plan.C):
        slots, scans, st = _chain_graph(ctx, plan, chains, c, scan0, n_scans, outputs)
        rec_slots.append(slots)
        watch.extend(slots)
        watch_scans.extend(scans)
        state_slots.append(list(range(len(outputs), len(outputs) + len(st))))
        outputs.extend(st)
    t_round = time.monotonic()
    scans_of = dict(zip(watch, watch_scans))
    round_label = f"{rnd}/{plan.n_rounds}"
    handles = ex.compute(outputs, watch=watch, on_done=lambda i: bar.update(scans_of[i], round=round_label))
    gathered = ex.gather([handles[i] for c in range(plan.C) for i in rec_slots[c]])
    records = []
    for item in gathered:
        records.extend(item if isinstance(item, list) else [item])
    old_states = [h for c in range(plan.C) for h in chains.states[c]]
    chains.states = [[handles[i] for i in state_slots[c]] for c in range(plan.C)]
    ex.release(old_states)
    return records, time.monotonic() - t_round


def _reduce_round(ctx, plan: Plan, chains: Chains, rnd: int, records: list, dt: float) -> list:
    """The ordered reduce of one round (chains in order, scans in order): traces, round trips, the
    round's metrics and history entry. Returns the traces of the round."""
    n_scans, C, G = 2**rnd, plan.C, plan.G
    traces, summaries = [], []
    for c in range(C):
        trace = engine.stack_records(records[c * n_scans:(c + 1) * n_scans])
        traces.append(trace)
        chains.levels[c] = trace.levels[-1].copy()
        chains.rts[c] = diagnostics.round_trip_update(chains.rts[c], trace.levels, plan.K,
                                                      ref_mod.round_trip_ends(chains.legs[c]))
        chains.leg_rts[c] = ref_mod.leg_round_trips_update(chains.leg_rts[c], chains.legs[c], trace.levels)
        summaries.append(analysis.round_summary(c, chains.betas[c], trace, chains.rts[c], plan.chain_target[c],
                                                plan.group_exact[plan.group_of[c]][0], chains.legs[c], chains.leg_rts[c]))
    agg = {k: float(np.mean([s[k] for s in summaries])) for k in summaries[0]
           if k != "chain" and (G == 1 or k not in LOG_Z_KEYS)}
    if G == 1:
        agg["log_z_ss_se"] = float(np.sqrt(np.sum([s["log_z_ss_se"] ** 2 for s in summaries])) / C)
        agg["log_z_ti_se"] = float(np.sqrt(np.sum([s["log_z_ti_se"] ** 2 for s in summaries])) / C)
    for key in [k for k in summaries[0] if k.startswith(analysis.COUNTS)]:
        agg[key] = float(np.sum([s[key] for s in summaries]))
    if plan.group_targets[0].kind == "ising":
        site_updates = sum(plan.K * n_scans * int(plan.tcfg["sweeps_per_scan"]) * t.n_sites for t in plan.chain_target)
        agg["site_updates_per_ns"] = site_updates / (dt * 1e9)
    agg["scans_per_s"] = C * n_scans / dt
    agg["round_seconds"] = dt
    metrics = dict(agg)
    if C > 1:
        for s in summaries:
            metrics.update({f"{k}_c{s['chain']}": v for k, v in s.items() if k in ("log_z_ss", "log_z_ss_se", "barrier")})
    ctx.tracker.log_metrics(metrics, step=rnd)
    chains.history.append({"round": rnd, "scans": n_scans, "betas": [b.tolist() for b in chains.betas],
                           "groups": _group_summaries(plan, summaries), **agg})
    return traces


def _group_summaries(plan: Plan, summaries: list) -> list:
    groups = []
    for g in range(plan.G):
        ss_g = [s for c, s in enumerate(summaries) if plan.group_of[c] == g]
        groups.append({"log_z_ss": float(np.mean([s["log_z_ss"] for s in ss_g])),
                       "log_z_ss_se": float(np.sqrt(np.sum([s["log_z_ss_se"] ** 2 for s in ss_g])) / len(ss_g)),
                       "log_z_ti": float(np.mean([s["log_z_ti"] for s in ss_g])),
                       "round_trips": int(np.sum([s["round_trips"] for s in ss_g]))})
    return groups


def _adapt(ctx, plan: Plan, chains: Chains, traces: list, rnd: int):
    """Re-space each ladder (equalised swap rejection), adapt the continuous step sizes, and fit the
    variational reference of the next round to this round's target-end draws."""
    for c in range(plan.C):
        if plan.tcfg["adapt_schedule"] and not plan.ladder:
            chains.betas[c], chains.legs[c] = ref_mod.adapt(chains.betas[c], chains.legs[c], analysis.rejection(traces[c]),
                                                            plan.split)
        if plan.legs is not None and rnd + 1 >= plan.fit_from:
            chains.qs[c], info = ref_mod.fit(traces[c], plan.family)
            ctx.tracker.log_metrics({f"reference_min_var_c{c}": info.min_var}, step=rnd)
        if plan.chain_target[c].kind != "ising":
            acc = traces[c].local_accept.mean(axis=0)
            chains.steps[c] = np.clip(chains.steps[c] * np.exp(2.0 * (acc - TARGET_ACCEPT[plan.method])), 1e-4, 1e3)


def _gather_states(ex, handles_per_chain):
    """Host arrays [C, R, ...] of the replicas' states, in replica order."""
    out = []
    for handles in handles_per_chain:
        blocks = ex.gather(list(handles))
        ids = np.concatenate([b.replica_ids for b in blocks])
        x = np.concatenate([backend_mod.to_numpy(b.x) for b in blocks])
        out.append(x[np.argsort(ids, kind="stable")])
    return out


def _checkpoint(ctx, chains: Chains, rnd: int):
    xs = _gather_states(ctx.executor, chains.states)
    artifacts.save_checkpoint(ctx.tracker, f"round_{rnd:03d}", dict(
        round=np.int64(rnd), betas=np.stack(chains.betas), levels=np.stack(chains.levels),
        steps=np.stack(chains.steps), x=np.stack(xs), rt_phase=np.stack([s.phase for s in chains.rts]),
        rt_trips=np.stack([s.trips for s in chains.rts]), rt_restarts=np.stack([s.restarts for s in chains.rts]),
        history=np.array(json.dumps(chains.history)),
        **ref_mod.to_arrays(chains.qs, chains.leg_rts, chains.legs, xs[0].shape[-1] if xs[0].ndim == 2 else 1)))


def run(ctx, plan) -> dict:
    plan = _plan(ctx)
    chains = _initial(ctx, plan)
    total_scans = plan.C * sum(2**r for r in range(chains.start_round, plan.n_rounds + 1))
    bar = Progress(total_scans, "tempering", "scans", enabled=ctx.progress)
    last_traces: list[engine.RoundTrace] = []
    t_start = time.monotonic()
    ctx.tracker.set_tags({"pgmflow.tempering.layout": plan.layout, "pgmflow.tempering.blocks": plan.n_blocks,
                          "pgmflow.tempering.scans_per_task": plan.per_task})
    every = int(plan.tcfg["checkpoint_every"])
    for rnd in range(chains.start_round, plan.n_rounds + 1):
        records, dt = _run_round(ctx, plan, chains, rnd, bar)
        last_traces = _reduce_round(ctx, plan, chains, rnd, records, dt)
        h = chains.history[-1]
        bar.set(swap=h["swap_accept_mean"], barrier=h["barrier"], trips=int(h["round_trips"]))
        if rnd < plan.n_rounds:
            _adapt(ctx, plan, chains, last_traces, rnd)
        if every and (rnd % every == 0 or rnd == plan.n_rounds):
            _checkpoint(ctx, chains, rnd)
        ctx.tracker.flush()
    bar.close()
    return _finish(ctx, plan, chains, last_traces, t_start)


def _finish(ctx, plan: Plan, chains: Chains, last_traces: list, t_start: float) -> dict:
    """The final analysis on the last round (fixed ladder): results, tables, state, figures."""
    history, G = chains.history, plan.G
    final_betas = [np.asarray(h) for h in history[-1]["betas"]]
    per_group = []
    for g in range(G):
        cs = [c for c in range(plan.C) if plan.group_of[c] == g]
        res_g = analysis.final_results(ctx.cfg, plan.group_targets[g], [final_betas[c] for c in cs],
                                       [last_traces[c] for c in cs], [chains.rts[c] for c in cs],
                                       *plan.group_exact[g], history, [chains.legs[c] for c in cs],
                                       [chains.leg_rts[c] for c in cs])
        res_g["chains"] = cs
        res_g["model_overrides"] = plan.overrides[g]
        per_group.append(res_g)
    if ctx.cfg.get("bounds"):
        from pgmflow.pipelines.tempering.with_bounds import log_bounds

        log_bounds(ctx, plan.group_targets, per_group, final_betas, last_traces, G)
    if G == 1:
        results = per_group[0]
    else:
        results = analysis.combine_targets(per_group)
        for g, res_g in enumerate(per_group):
            results.update({f"{k}_target{g}": v for k, v in res_g.items() if k.startswith("bounds_")})
    results["wall_seconds"] = time.monotonic() - t_start
    per_round = set(history[-1]) if history else set()  # already logged at this step
    per_round.discard("groups")
    artifacts.log_final_metrics(ctx.tracker, results, step=plan.n_rounds, prefix="", skip=per_round)
    artifacts.log_results(ctx.tracker, results, exclude=("per_level",))
    _log_tables_and_state(ctx, plan, chains, per_group, final_betas)
    if plan.tcfg["figures"]:
        _log_figures(ctx, plan, chains, per_group, final_betas, last_traces, history)
    for g, res_g in enumerate(per_group):
        analysis.print_summary(ctx.say, res_g, f"target {g} {res_g['model_overrides']}: " if G > 1 else "")
        res_g.pop("per_level", None)
    results.pop("per_level", None)
    return results


def _log_tables_and_state(ctx, plan, chains, per_group, final_betas):
    tracker = ctx.tracker
    for res_g in per_group:
        for c, rows in zip(res_g["chains"], res_g["per_level"]):
            artifacts.log_table(tracker, rows, f"tables/per_temperature_chain{c}.csv")
    artifacts.log_table(tracker, [dict(target=g, **row) for g, res_g in enumerate(per_group)
                                  for row in res_g["log_z_table"]], "tables/log_z.csv")
    xs = _gather_states(ctx.executor, chains.states)
    artifacts.log_npz(tracker, "final_state.npz", dict(betas=np.stack(final_betas), levels=np.stack(chains.levels),
                                                       x=np.stack(xs)))


def _log_figures(ctx, plan, chains, per_group, final_betas, last_traces, history):
    from pgmflow.pipelines.tempering import figures

    for g, res_g in enumerate(per_group):
        cs = res_g["chains"]
        hist_g = [{**h, **h["groups"][g]} for h in history]
        figs = figures.tempering_figures(plan.group_targets[g], [final_betas[c] for c in cs],
                                         [last_traces[c] for c in cs], hist_g, res_g, [chains.legs[c] for c in cs])
        artifacts.log_figures(ctx.tracker, figs, f"_target{g}" if plan.G > 1 else "")
