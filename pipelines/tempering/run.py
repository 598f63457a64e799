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

from pgmflow.core import artifacts, datasets
from pgmflow.core.progress import Progress
from pgmflow.tasks import backend as backend_mod
from pgmflow.tasks import rng as _rng
from pgmflow.tasks.tempering import diagnostics, engine, schedule
from pgmflow.tempering import analysis
from pgmflow.tempering import reference as ref_mod
from pgmflow.tempering.plan import TemperingPlan, TemperingSettings
from pgmflow.tempering.targets import Target

TARGET_ACCEPT = {"rwm": 0.3, "hmc": 0.65}
LOG_Z_KEYS = {"log_z_ss", "log_z_ss_se", "log_z_ti", "log_z_ti_se", "log_z_ss_error"}


@dataclass(frozen=True)
class Setup:
    """The plan placed on the cluster: how the graph is cut and where the targets are. Targets farmed
    at once: one per entry of ``chain_overrides`` (or just the model), each run by ``n_chains``
    chains; chain c runs target group ``group_of[c] = c // n_chains``."""

    plan: TemperingPlan
    K: int  # levels of each ladder
    C: int  # chains
    group_of: tuple
    layout: str  # chain | blocks
    per_task: int  # scans per task of the chain layout
    n_blocks: int
    blocks: tuple  # replica ids of each block
    params: tuple  # engine.ExploreParams per chain
    target_h: tuple  # handle of each chain's task-side target on the cluster
    legs: np.ndarray | None = None  # leg of each level at the start (None: reference=fixed)

    @property
    def settings(self) -> TemperingSettings:
        return self.plan.tempering

    @property
    def targets(self) -> tuple[Target, ...]:
        return self.plan.targets

    @property
    def G(self) -> int:
        return len(self.plan.targets)

    @property
    def chain_target(self) -> list[Target]:
        return [self.plan.targets[g] for g in self.group_of]


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


def _layout(ts: TemperingSettings, target: Target, K: int, C: int, n_workers: int, backend: str) -> tuple[str, int]:
    """How the graph is cut: ``chain`` (one task runs several scans of a whole chain) or ``blocks``
    (one task per block of replicas per scan), and the scans per task of the chain layout.

    Both give bit-identical results. ``auto`` picks blocks only when one scan of a chain is heavy
    enough (~50 ms) to pay for a scheduler round trip per scan and the workers outnumber the chains.
    """
    inner = ts.n_leapfrog if ts.explorer_requested == "hmc" else 1
    per_scan_s = target.scan_cost_s(K, ts.sweeps_per_scan, inner)
    layout = ts.layout
    if layout == "auto":
        layout = "blocks" if (per_scan_s > 0.05 and n_workers >= 2 * C and backend == "numpy") else "chain"
    per_task = ts.scans_per_task
    if per_task is None:
        per_task = int(min(max(1, 0.5 / max(per_scan_s, 1e-9)), 4096))
    return layout, int(per_task)


def _setup(ctx, plan: TemperingPlan) -> Setup:
    """Place the plan on the cluster: cut the graph, scatter each target once, record the inputs."""
    ts, seed, targets = plan.tempering, plan.seed, plan.targets
    K = ts.n_levels
    C = len(targets) * ts.n_chains
    group_of = tuple(c // ts.n_chains for c in range(C))
    n_blocks = ctx.cluster.n_workers if ts.n_blocks is None else ts.n_blocks
    n_blocks = max(1, min(n_blocks, K))
    heaviest = max(targets, key=lambda t: t.scan_cost_s(K, ts.sweeps_per_scan, 1))
    layout, per_task = _layout(ts, heaviest, K, C, ctx.cluster.n_workers, ctx.backend)
    if layout == "chain":
        n_blocks = 1
    params = tuple(
        engine.ExploreParams(
            method=ts.explorer,
            n_steps=ts.sweeps_per_scan,
            n_leapfrog=ts.n_leapfrog,
            seed=seed,
            chain=c,
            philox_key=_rng.philox_key(seed, _rng.STAGE_ISING_KEY, c),
            backend=ctx.backend,
        )
        for c in range(C)
    )
    ctx.tracker.set_tags(
        {
            "pgmflow.tempering.explorer": ts.explorer,
            "pgmflow.tempering.exact_log_z": targets[0].exact_source,
            "pgmflow.tempering.targets": len(targets),
        }
    )
    for g, t in enumerate(targets):  # MLflow dataset tracking: each target, with a digest
        datasets.log_input(
            ctx.tracker,
            f"{t.name} target" + (f" {g}" if len(targets) > 1 else ""),
            datasets.arrays_of(t.task),
            context="training",
            parameters=t.spec,
            generator="pgmflow.tempering.targets.build_target",
            path=t.data_path,
        )
    group_h = [ctx.executor.scatter(t.task) for t in targets]
    return Setup(
        plan=plan,
        K=K,
        C=C,
        group_of=group_of,
        layout=layout,
        per_task=per_task,
        n_blocks=n_blocks,
        blocks=tuple(np.asarray(b, dtype=np.int64) for b in np.array_split(np.arange(K), n_blocks)),
        params=params,
        target_h=tuple(group_h[g] for g in group_of),
        # variational on an MRF: the mean-field product built into the target (one leg, no path)
        legs=ref_mod.legs_of(ts.reference if targets[0].continuous or ts.reference == "stabilized" else "fixed", K),
    )


def _from_checkpoint(ctx, su: Setup, ckpt: dict) -> Chains:
    to_device = backend_mod.cupy().asarray if ctx.backend == "cupy" else (lambda a: a)
    x = ckpt["x"]
    states = [
        [engine.BlockState(replica_ids=ids, x=to_device(np.ascontiguousarray(x[c][ids]))) for ids in su.blocks]
        for c in range(su.C)
    ]
    start_round = int(ckpt["round"]) + 1
    ctx.say(f"resuming from the checkpoint after round {start_round - 1}")
    qs, leg_rts, legs = ref_mod.from_arrays(ckpt, su.C, su.legs)
    return Chains(
        qs=qs,
        leg_rts=leg_rts,
        legs=legs,
        betas=[np.array(b) for b in ckpt["betas"]],
        levels=[np.array(lv) for lv in ckpt["levels"]],
        steps=[np.array(s) for s in ckpt["steps"]],
        rts=[
            diagnostics.RoundTripState(phase=np.array(p), trips=np.array(t), restarts=np.array(r))
            for p, t, r in zip(ckpt["rt_phase"], ckpt["rt_trips"], ckpt["rt_restarts"])
        ],
        states=states,
        history=json.loads(str(ckpt["history"])),
        start_round=start_round,
    )


def _initial(ctx, su: Setup) -> Chains:
    """The chains at the start: from the newest checkpoint when resuming, else fresh.

    The final round's checkpoint is passed over on purpose: the final analysis needs that round's
    traces, so a run killed after its last checkpoint re-runs the last round (identically).
    """
    ckpt = artifacts.newest_checkpoint(ctx.tracker, su.settings.n_rounds - 1) if ctx.resumed else None
    if ckpt is not None:
        return _from_checkpoint(ctx, su, ckpt)
    ts, K, C = su.settings, su.K, su.C
    if ts.ladder:
        b0 = np.asarray(ts.ladder, dtype=np.float64)
    elif ts.initial_schedule == "power":
        b0 = ref_mod.initial_betas(
            su.legs, K, lambda n: schedule.initial_schedule(n, kind="power", power=ts.schedule_power)
        )
    else:
        b0 = ref_mod.initial_betas(su.legs, K, lambda n: schedule.initial_schedule(n, kind="linear"))
    q0 = [ref_mod.initial_reference(t.task, su.legs) for t in su.targets]  # per target: before the first fit
    states = [
        [
            dask.delayed(engine.init_block, pure=True)(
                su.target_h[c], ids, su.params[c], dask_key_name=f"pt-init-{ctx.token}-c{c}-b{b}"
            )
            for b, ids in enumerate(su.blocks)
        ]
        for c in range(C)
    ]
    return Chains(
        betas=[b0.copy() for _ in range(C)],
        levels=[np.arange(K, dtype=np.int64) for _ in range(C)],
        steps=[np.full(K, ts.step_size) for _ in range(C)],
        rts=[diagnostics.round_trip_init(K) for _ in range(C)],
        states=states,
        history=[],
        start_round=1,
        qs=[q0[g] for g in su.group_of],
        leg_rts=[ref_mod.leg_round_trips_init(su.legs) for _ in range(C)],
        legs=[None if su.legs is None else su.legs.copy() for _ in range(C)],
    )


def _chain_graph(ctx, su: Setup, chains: Chains, c: int, scan0: int, n_scans: int, outputs: list) -> tuple:
    """Append chain c's tasks of one round to ``outputs``; returns (record slots, their scans, states)."""
    K, swap = su.K, su.settings.swap
    slots, scans = [], []
    path = ref_mod.path(su.chain_target[c].task, chains.legs[c], chains.qs[c])
    if su.layout == "chain":
        prev = [engine.initial_record(K)._replace(levels=chains.levels[c])]
        st = chains.states[c][0]
        for s in range(scan0, scan0 + n_scans, su.per_task):
            m = min(su.per_task, scan0 + n_scans - s)
            out = dask.delayed(engine.run_scans, nout=2, pure=True)(
                st,
                prev,
                chains.betas[c],
                chains.steps[c],
                su.target_h[c],
                su.params[c],
                swap,
                s,
                m,
                path,
                dask_key_name=f"pt-scans-{ctx.token}-c{c}-s{s}",
            )
            st, prev = out[0], out[1]
            slots.append(len(outputs))
            scans.append(m)
            outputs.append(prev)
        return slots, scans, [st]
    rec = engine.initial_record(K)._replace(levels=chains.levels[c])
    st = list(chains.states[c])
    for s in range(scan0, scan0 + n_scans):
        outs = [
            dask.delayed(engine.explore_block, nout=2, pure=True)(
                st[b],
                rec,
                chains.betas[c],
                chains.steps[c],
                su.target_h[c],
                su.params[c],
                s,
                path,
                dask_key_name=f"pt-explore-{ctx.token}-c{c}-s{s}-b{b}",
            )
            for b in range(su.n_blocks)
        ]
        st = [o[0] for o in outs]
        rec = dask.delayed(engine.communicate, pure=True)(
            rec,
            chains.betas[c],
            swap,
            su.plan.seed,
            c,
            s,
            *[o[1] for o in outs],
            legs=None if path is None else path.legs,
            dask_key_name=f"pt-swap-{ctx.token}-c{c}-s{s}",
        )
        slots.append(len(outputs))
        scans.append(1)
        outputs.append(rec)
    return slots, scans, st


def _run_round(ctx, su: Setup, chains: Chains, rnd: int, bar) -> tuple[list, float]:
    """Compute round ``rnd`` of every chain; returns the records (chains in order, scans in order) and
    the round's wall time. The replicas' new states stay on the workers (``chains.states``)."""
    ex = ctx.executor
    n_scans = 2**rnd
    scan0 = 2**rnd - 2  # rounds 1, 2, ... run 2, 4, ... scans
    outputs, watch, watch_scans, state_slots, rec_slots = [], [], [], [], []
    for c in range(su.C):
        slots, scans, st = _chain_graph(ctx, su, chains, c, scan0, n_scans, outputs)
        rec_slots.append(slots)
        watch.extend(slots)
        watch_scans.extend(scans)
        state_slots.append(list(range(len(outputs), len(outputs) + len(st))))
        outputs.extend(st)
    t_round = time.monotonic()
    scans_of = dict(zip(watch, watch_scans))
    round_label = f"{rnd}/{su.settings.n_rounds}"
    handles = ex.compute(outputs, watch=watch, on_done=lambda i: bar.update(scans_of[i], round=round_label))
    gathered = ex.gather([handles[i] for c in range(su.C) for i in rec_slots[c]])
    records = []
    for item in gathered:
        records.extend(item if isinstance(item, list) else [item])
    old_states = [h for c in range(su.C) for h in chains.states[c]]
    chains.states = [[handles[i] for i in state_slots[c]] for c in range(su.C)]
    ex.release(old_states)
    return records, time.monotonic() - t_round


def _reduce_round(ctx, su: Setup, chains: Chains, rnd: int, records: list, dt: float) -> list:
    """The ordered reduce of one round (chains in order, scans in order): traces, round trips, the
    round's metrics and history entry. Returns the traces of the round."""
    n_scans, C, G = 2**rnd, su.C, su.G
    traces, summaries = [], []
    for c in range(C):
        trace = engine.stack_records(records[c * n_scans : (c + 1) * n_scans])
        traces.append(trace)
        chains.levels[c] = trace.levels[-1].copy()
        chains.rts[c] = diagnostics.round_trip_update(
            chains.rts[c], trace.levels, su.K, ref_mod.round_trip_ends(chains.legs[c])
        )
        chains.leg_rts[c] = ref_mod.leg_round_trips_update(chains.leg_rts[c], chains.legs[c], trace.levels)
        summaries.append(analysis.round_summary(c, su.chain_target[c], _chain_round(chains, c, trace)))
    agg = {
        k: float(np.mean([s[k] for s in summaries]))
        for k in summaries[0]
        if k != "chain" and (G == 1 or k not in LOG_Z_KEYS)
    }
    if G == 1:
        agg["log_z_ss_se"] = float(np.sqrt(np.sum([s["log_z_ss_se"] ** 2 for s in summaries])) / C)
        agg["log_z_ti_se"] = float(np.sqrt(np.sum([s["log_z_ti_se"] ** 2 for s in summaries])) / C)
    for key in [k for k in summaries[0] if k.startswith(analysis.COUNTS)]:
        agg[key] = float(np.sum([s[key] for s in summaries]))
    site_updates = [t.site_updates(su.K * n_scans * su.settings.sweeps_per_scan) for t in su.chain_target]
    if site_updates[0] is not None:  # a spin system: throughput in spin updates
        agg["site_updates_per_ns"] = sum(site_updates) / (dt * 1e9)
    agg["scans_per_s"] = C * n_scans / dt
    agg["round_seconds"] = dt
    metrics = dict(agg)
    if C > 1:
        for s in summaries:
            metrics.update(
                {f"{k}_c{s['chain']}": v for k, v in s.items() if k in ("log_z_ss", "log_z_ss_se", "barrier")}
            )
    ctx.tracker.log_metrics(metrics, step=rnd)
    chains.history.append(
        {
            "round": rnd,
            "scans": n_scans,
            "betas": [b.tolist() for b in chains.betas],
            "groups": _group_summaries(su, summaries),
            **agg,
        }
    )
    return traces


def _group_summaries(su: Setup, summaries: list) -> list:
    groups = []
    for g in range(su.G):
        ss_g = [s for c, s in enumerate(summaries) if su.group_of[c] == g]
        groups.append(
            {
                "log_z_ss": float(np.mean([s["log_z_ss"] for s in ss_g])),
                "log_z_ss_se": float(np.sqrt(np.sum([s["log_z_ss_se"] ** 2 for s in ss_g])) / len(ss_g)),
                "log_z_ti": float(np.mean([s["log_z_ti"] for s in ss_g])),
                "round_trips": int(np.sum([s["round_trips"] for s in ss_g])),
            }
        )
    return groups


def _adapt(ctx, su: Setup, chains: Chains, traces: list, rnd: int):
    """Re-space each ladder (equalised swap rejection), adapt the continuous step sizes, and fit the
    variational reference of the next round to this round's target-end draws."""
    ts = su.settings
    for c in range(su.C):
        if ts.adapt_schedule and not ts.ladder:
            chains.betas[c], chains.legs[c] = ref_mod.adapt(
                chains.betas[c], chains.legs[c], analysis.rejection(traces[c]), ts.stabilized_split
            )
        if su.legs is not None and rnd + 1 >= ts.variational_from_round:
            chains.qs[c], info = ref_mod.fit(traces[c], ts.variational_family)
            ctx.tracker.log_metrics({f"reference_min_var_c{c}": info.min_var}, step=rnd)
        if su.chain_target[c].adapts_step_size:
            acc = traces[c].local_accept.mean(axis=0)
            chains.steps[c] = np.clip(chains.steps[c] * np.exp(2.0 * (acc - TARGET_ACCEPT[ts.explorer])), 1e-4, 1e3)


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
    artifacts.save_checkpoint(
        ctx.tracker,
        f"round_{rnd:03d}",
        dict(
            round=np.int64(rnd),
            betas=np.stack(chains.betas),
            levels=np.stack(chains.levels),
            steps=np.stack(chains.steps),
            x=np.stack(xs),
            rt_phase=np.stack([s.phase for s in chains.rts]),
            rt_trips=np.stack([s.trips for s in chains.rts]),
            rt_restarts=np.stack([s.restarts for s in chains.rts]),
            history=np.array(json.dumps(chains.history)),
            **ref_mod.to_arrays(chains.qs, chains.leg_rts, chains.legs, xs[0].shape[-1] if xs[0].ndim == 2 else 1),
        ),
    )


def _chain_round(chains: Chains, c: int, trace, betas=None) -> analysis.ChainRound:
    """Chain c's round for the analysis (``betas``: its ladder, if not the current one)."""
    return analysis.ChainRound(
        betas=chains.betas[c] if betas is None else betas,
        trace=trace,
        rts=chains.rts[c],
        legs=chains.legs[c],
        leg_rts=chains.leg_rts[c],
    )


def run(ctx, plan: TemperingPlan) -> dict:
    su = _setup(ctx, plan)
    n_rounds = plan.tempering.n_rounds
    chains = _initial(ctx, su)
    total_scans = su.C * sum(2**r for r in range(chains.start_round, n_rounds + 1))
    bar = Progress(total_scans, "tempering", "scans", enabled=ctx.progress)
    last_traces: list[engine.RoundTrace] = []
    t_start = time.monotonic()
    ctx.tracker.set_tags(
        {
            "pgmflow.tempering.layout": su.layout,
            "pgmflow.tempering.blocks": su.n_blocks,
            "pgmflow.tempering.scans_per_task": su.per_task,
        }
    )
    every = plan.tempering.checkpoint_every
    for rnd in range(chains.start_round, n_rounds + 1):
        records, dt = _run_round(ctx, su, chains, rnd, bar)
        last_traces = _reduce_round(ctx, su, chains, rnd, records, dt)
        h = chains.history[-1]
        bar.set(swap=h["swap_accept_mean"], barrier=h["barrier"], trips=int(h["round_trips"]))
        if rnd < n_rounds:
            _adapt(ctx, su, chains, last_traces, rnd)
        if every and (rnd % every == 0 or rnd == n_rounds):
            _checkpoint(ctx, chains, rnd)
        ctx.tracker.flush()
    bar.close()
    return _finish(ctx, su, chains, last_traces, t_start)


def _finish(ctx, su: Setup, chains: Chains, last_traces: list, t_start: float) -> dict:
    """The final analysis on the last round (fixed ladder): results, tables, state, figures."""
    history, G = chains.history, su.G
    final_betas = [np.asarray(h) for h in history[-1]["betas"]]
    per_group = []
    for g in range(G):
        cs = [c for c in range(su.C) if su.group_of[c] == g]
        res_g = analysis.final_results(
            su.targets[g], [_chain_round(chains, c, last_traces[c], final_betas[c]) for c in cs], history
        )
        res_g["chains"] = cs
        res_g["model_overrides"] = su.plan.overrides[g]
        per_group.append(res_g)
    if su.plan.bounds is not None:
        from pgmflow.tempering.with_bounds import log_bounds

        log_bounds(ctx, su.plan.bounds, su.targets, per_group, final_betas, last_traces, chains.legs, chains.qs)
    if G == 1:
        results = per_group[0]
    else:
        results = analysis.combine_targets(per_group)
        for g, res_g in enumerate(per_group):
            results.update({f"{k}_target{g}": v for k, v in res_g.items() if k.startswith("bounds_")})
    results["wall_seconds"] = time.monotonic() - t_start
    per_round = set(history[-1]) if history else set()  # already logged at this step
    per_round.discard("groups")
    artifacts.log_final_metrics(ctx.tracker, results, step=su.settings.n_rounds, prefix="", skip=per_round)
    artifacts.log_results(ctx.tracker, results, exclude=("per_level",))
    _log_tables_and_state(ctx, su, chains, per_group, final_betas)
    if su.settings.figures:
        _log_figures(ctx, su, chains, per_group, final_betas, last_traces)
    for g, res_g in enumerate(per_group):
        analysis.print_summary(ctx.say, res_g, f"target {g} {res_g['model_overrides']}: " if G > 1 else "")
        res_g.pop("per_level", None)
    results.pop("per_level", None)
    return results


def _log_tables_and_state(ctx, su: Setup, chains: Chains, per_group: list, final_betas: list):
    tracker = ctx.tracker
    for res_g in per_group:
        for c, rows in zip(res_g["chains"], res_g["per_level"]):
            artifacts.log_table(tracker, rows, f"tables/per_temperature_chain{c}.csv")
    artifacts.log_table(
        tracker,
        [dict(target=g, **row) for g, res_g in enumerate(per_group) for row in res_g["log_z_table"]],
        "tables/log_z.csv",
    )
    xs = _gather_states(ctx.executor, chains.states)
    artifacts.log_npz(
        tracker, "final_state.npz", dict(betas=np.stack(final_betas), levels=np.stack(chains.levels), x=np.stack(xs))
    )


def _log_figures(ctx, su: Setup, chains: Chains, per_group: list, final_betas: list, last_traces: list):
    from pgmflow.tempering import figures

    for g, res_g in enumerate(per_group):
        cs = res_g["chains"]
        hist_g = [{**h, **h["groups"][g]} for h in chains.history]
        figs = figures.tempering_figures(
            su.targets[g],
            [final_betas[c] for c in cs],
            [last_traces[c] for c in cs],
            hist_g,
            res_g,
            [chains.legs[c] for c in cs],
        )
        artifacts.log_figures(ctx.tracker, figs, f"_target{g}" if su.G > 1 else "")
