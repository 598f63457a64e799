"""``bounds=true``: MF, Bethe and TRW at every temperature of chain 0's ladder of each target (one
task per temperature, by ``pgmflow.bounds.ladder``), beside the tempering estimate there; a
table, a figure and the gaps at the target. Tempering -> bounds is the one workload-to-workload
import (bounds is the add-on)."""

from __future__ import annotations

from pgmflow.bounds import figures as bounds_figures
from pgmflow.bounds.ladder import tempering_bounds
from pgmflow.bounds.settings import VariationalSettings
from pgmflow.core import artifacts


def log_bounds(
    ctx,
    settings: VariationalSettings,
    targets: tuple,
    per_group: list,
    final_betas: list,
    last_traces: list,
    legs: list | None = None,
    qs: list | None = None,
):
    """The bounds along chain 0's ladder of each target (``targets``: the plan's Ising lattices or MRFs), added to
    each target's results (``per_group``), with a table and, if ``variational.figures``, a figure. ``legs``,
    ``qs``: each chain's legs and second-leg reference (reference=stabilized on an MRF; None otherwise): each
    level is bounded on its own leg, and the results at the target are the fixed leg's."""
    tracker, G = ctx.tracker, len(targets)
    for g, res_g in enumerate(per_group):
        cs = res_g["chains"]
        suffix = f"_target{g}" if G > 1 else ""
        c0 = cs[0]
        out = tempering_bounds(
            ctx,
            settings,
            targets[g].task,
            [final_betas[c] for c in cs],
            [last_traces[c] for c in cs],
            g,
            None if legs is None else legs[c0],
            None if qs is None else qs[c0],
        )
        rows = out["rows"]
        artifacts.log_table(tracker, rows, f"tables/bounds{suffix}.csv")
        last = rows[out["target_row"]]
        res_g.update(
            {
                "bounds_mf_per_site": last["mf_per_site"],
                "bounds_bethe_per_site": last["bethe_per_site"],
                "bounds_trw_per_site": last["trw_per_site"],
                "bounds_gap_tempering_minus_mf_per_site": last["gap_tempering_minus_mf"],
                "bounds_gap_trw_minus_tempering_per_site": last["gap_trw_minus_tempering"],
                "bounds_order_holds": all(r["order_holds_2se"] for r in rows),
                "bounds_all_converged": all(r["converged"] for r in rows),
            }
        )
        if settings.figures:  # the fixed leg's levels (one increasing ladder) with two legs
            _log_figure(tracker, targets[g], [r for r in rows if r.get("leg", 0) == 0], suffix)
        where = f"T = {1.0 / targets[g].beta_model:.6g}" if targets[g].name == "ising" else "the target (b = 1)"
        ctx.say(
            f"{'target ' + str(g) + ': ' if G > 1 else ''}bounds at {where}: MF {last['mf_per_site']:.6f} <= tempering "
            f"{last['tempering_per_site']:.6f} ± {last['tempering_se_per_site']:.6f} <= TRW "
            f"{last['trw_per_site']:.6f} per spin (Bethe {last['bethe_per_site']:.6f}); order holds (2 SE) at "
            f"{sum(r['order_holds_2se'] for r in rows)}/{len(rows)} ladder temperatures"
        )


def _log_figure(tracker, target, rows, suffix):
    if target.name == "ising":
        title = f"log Z per spin: {target.L}x{target.L} Ising, ladder up to T = {target.beta_model**-1:.4g} (chain 0)"
    else:
        title = f"log Z per spin: MRF of {target.n_sites} nodes along the ladder (chain 0)"
    fig = bounds_figures.bounds_figure(
        [r["beta"] for r in rows],
        {k: [r[f"{k}_per_site"] for r in rows] for k in ("mf", "bethe", "trw")},
        None,
        [r["tempering_per_site"] for r in rows],
        [r["tempering_se_per_site"] for r in rows],
        title,
    )
    artifacts.log_figures(tracker, {"log_z_bounds": fig}, suffix)
