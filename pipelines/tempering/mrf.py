"""``model=mrf`` in tempering: a pairwise binary MRF on any graph, read from a file once and made a target.

The file is the bounds workload's ``.npz`` (``J`` [n, n] symmetric with a zero diagonal, optional ``h`` [n];
read by :func:`pgmflow.bounds.models.load_mrf`) or, for large sparse graphs, an edge list: ``edges`` [E, 2]
(node pairs, 0-based), ``J`` [E] (one coupling per edge; an edge listed twice, in either orientation, has
its couplings summed), optional ``h`` [n] and ``n`` (the node count when ``h`` is absent). ``model.beta``
multiplies J and h. With ``tempering.reference=variational`` the reference is the product of independent
spins at the mean-field fixed point (``pgmflow.tasks.tempering.mrf_target.mean_field_reference``). With
``tempering.reference=stabilized`` the target keeps the uniform reference (the fixed leg) and the second leg's
product reference travels on the chain's path (``pgmflow.tempering.reference``): the mean-field product at
first, then fitted to the previous round's target-end draws from ``tempering.variational_from_round``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from pgmflow.core.errors import ConfigError
from pgmflow.tasks.bounds import mrf as _mrf

REFERENCES = {"fixed": "uniform", "variational": "mean_field", "stabilized": "uniform"}


def _arrays(path) -> dict:
    if not path:
        raise ConfigError(
            "model.path",
            path,
            "model=mrf needs a file with the couplings",
            "pass model.path=FILE.npz holding J [n, n] (and optionally h [n]), or edges [E, 2] with J [E]",
        )
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise ConfigError("model.path", str(path), "no such file", "check the path")
    try:
        with np.load(p, allow_pickle=False) as z:
            return {k: np.asarray(z[k]) for k in z.files}
    except Exception as exc:
        raise ConfigError(
            "model.path",
            str(path),
            f"cannot read it as .npz ({type(exc).__name__})",
            "save the model with numpy.savez(path, J=..., h=...) or numpy.savez(path, edges=..., J=..., h=...)",
        ) from None


def _edge_list(path: str, arrays: dict, beta: float) -> _mrf.PairwiseMRF:
    """The sparse form: ``edges`` [E, 2], ``J`` [E], optional ``h`` [n] and ``n``."""
    edges, J = arrays["edges"], np.asarray(arrays["J"])
    if edges.ndim != 2 or edges.shape[1:] != (2,) or edges.dtype.kind not in "iu":
        raise ConfigError(
            "model.path", path, f"edges has shape {edges.shape} ({edges.dtype})", "save edges as integers [E, 2]"
        )
    if J.shape != (edges.shape[0],):
        raise ConfigError(
            "model.path", path, f"J has shape {J.shape} for {edges.shape[0]} edges", "save one coupling per edge"
        )
    if "h" in arrays:
        h = np.asarray(arrays["h"], dtype=np.float64)
    elif "n" in arrays:
        h = np.zeros(int(arrays["n"]))
    else:
        h = np.zeros(int(edges.max()) + 1 if edges.size else 0)
    try:
        return _mrf.make_mrf(beta * h, edges, beta * np.asarray(J, dtype=np.float64))
    except _mrf.MRFError as exc:
        raise ConfigError("model.path", path, f"{exc.what} {exc.problem}", exc.fix) from None


def load(model: Mapping) -> _mrf.PairwiseMRF:
    """The MRF of a ``model=mrf`` section (inverse temperature folded in); ConfigError on any problem."""
    from pgmflow.bounds.models import load_mrf

    path = model.get("path")
    arrays = _arrays(path)
    beta = float(model.get("beta", 1.0))
    if "edges" in arrays and "J" in arrays and np.asarray(arrays["J"]).ndim == 1:
        mrf = _edge_list(str(path), arrays, beta)
    else:
        mrf = load_mrf(dict(model))[0]
    if mrf.n == 0:
        raise ConfigError("model.path", str(path), "the graph has no nodes", "pass a model with at least one node")
    return mrf  # a graph without couplings is a model too (independent spins: log Z in closed form, reported)


def build_task(model: Mapping, mrf: _mrf.PairwiseMRF | None = None):
    """The task-side target (:class:`pgmflow.tasks.tempering.mrf_target.MRFTarget`) of a validated section;
    ``model["reference"]`` is ``uniform`` (default) or ``mean_field``; ``mrf``: the model if already read."""
    from pgmflow.tasks.tempering import mrf_target

    mrf = load(model) if mrf is None else mrf
    if model.get("reference", "uniform") == "mean_field":
        a, _ = mrf_target.mean_field_reference(mrf)
        return mrf_target.make_mrf_target(mrf, a, "mean_field")
    return mrf_target.make_mrf_target(mrf)


def check_reference(t: Mapping):
    """tempering.reference on an MRF target: fixed (uniform spins), variational (mean field) or stabilized
    (both legs)."""
    ref = t.get("reference", "fixed")
    if ref not in REFERENCES:
        raise ConfigError(
            "tempering.reference",
            ref,
            "on model=mrf is fixed (uniform spins), variational (the mean-field product of independent spins) "
            "or stabilized (both legs)",
            "use tempering.reference=fixed, variational or stabilized",
        )
