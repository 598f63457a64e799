"""The data of a TESLA run: binary (+-1) samples over time, from a generator or a file.

``network.kind`` selects the source (``conf/network/*.yaml``):

* ``synthetic`` -- a time-varying Ising network with known edges (``pgmflow.tasks.tesla.synthetic``);
* ``npz`` -- an array ``X`` [T, n, p], or arrays ``x_0 .. x_{T-1}`` of shape [n_t, p];
* ``csv`` -- long format with columns ``time, sample, node, value``;
* ``rollcall`` -- roll-call votes (legislators are the nodes, roll calls the samples): the ``s109`` object
  of Debian's ``r-cran-pscl``, or Voteview's CSV triple (``pgmflow.tasks.tesla.rollcall``).

Every problem with the data is a :class:`ConfigError` naming the file, the value and the fix,
raised by the preflight checks before any task runs. The validation reads the ``network`` section
into a :class:`SyntheticNetwork` or a :class:`NetworkFile` and calls :func:`resolve` once; the run's
plan carries the result, so the data is loaded once per run and nothing is cached between runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from pgmflow.core.errors import ConfigError

KINDS = ("synthetic", "npz", "csv", "rollcall")
ROLLCALL_KEYS = ("source", "path", "prefix", "object", "time_axis", "window_days", "missing", "partial")
SYNTHETIC_KEYS = (
    "p",
    "T",
    "samples_per_time",
    "n_edges",
    "rewire_every",
    "n_rewire",
    "max_degree",
    "weight_low",
    "weight_high",
    "ramp",
    "field",
    "burn_in",
)


@dataclass(frozen=True)
class SyntheticNetwork:
    """A time-varying Ising network with known edges (``pgmflow.tasks.tesla.synthetic.time_varying_ising``,
    after the simulation protocol of Ahmed & Xing 2009 and Kolar et al. 2010).

    p: nodes. T: time points. samples_per_time: independent samples at each time point. n_edges: edges of
    the initial graph (None: p). rewire_every: time points between rewirings. n_rewire: edges removed and
    added at each rewiring. max_degree: the largest degree of any node. weight_low, weight_high: the range
    of |edge weight|. ramp: time points over which a weight ramps in or out. field: the node field h.
    burn_in: Gibbs sweeps before a sample is taken.
    """

    p: int
    T: int
    samples_per_time: int
    n_edges: int | None
    rewire_every: int
    n_rewire: int
    max_degree: int
    weight_low: float
    weight_high: float
    ramp: int
    field: float
    burn_in: int

    kind = "synthetic"

    def parameters(self) -> dict:
        """The generator's settings as recorded with the run's dataset (``network.*``)."""
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True)
class NetworkFile:
    """Samples from a file. kind: ``npz`` or ``csv`` (module docstring). path: the file, as given (relative
    paths start from the directory pgmflow runs in). truth: an optional ``.npz`` with the true edges, or None.
    """

    kind: str
    path: str
    truth: str | None

    def parameters(self) -> dict:
        """The source's settings (``network.*``)."""
        return asdict(self)


@dataclass(frozen=True)
class RollCallSource:
    """Roll-call votes (``pgmflow.tasks.tesla.rollcall``). source: ``pscl`` (the installed package's lazy-load
    database, or the ``.rdb`` at path) or ``voteview`` (the folder path with ``<prefix>_votes.csv``,
    ``_rollcalls.csv``, ``_members.csv``). object: pscl's object (``s109``). time_axis: one time point per
    ``rollcall``, per voting ``day``, or per ``window`` of window_days days. missing: ``skip`` (left out of
    the likelihood) or ``nay``. partial: legislators who served part of the term, ``merge`` (one seat held in
    turn is one node) or ``drop``."""

    source: str
    path: str | None
    prefix: str
    object: str
    time_axis: str
    window_days: int
    missing: str
    partial: str

    kind = "rollcall"

    def parameters(self) -> dict:
        return {"kind": self.kind, **asdict(self)}


class NetworkData(NamedTuple):
    """Samples over time and, for synthetic data, the true edges."""

    series: object  # pgmflow.tasks.tesla.data.BinaryTimeSeries
    truth: np.ndarray | None  # bool [T, p, p] true edges per time point, or None
    source: str  # what the data is (a path, or "synthetic p=.. T=..")
    isolated: np.ndarray  # int64 node indices whose value never changes (not fitted, no edges)
    notes: tuple  # lines worth telling the user (recoding, isolated nodes)
    groups: tuple | None = None  # a label per node (a legislator's party), or None


def resolve(network: SyntheticNetwork | NetworkFile | RollCallSource, seed: int) -> NetworkData:
    """The run's data (validated), generated with ``seed`` or read from the file; ConfigError on any
    problem with it. Called once per run, by the validation."""
    from pgmflow.tasks.tesla import data as tdata

    truth = None
    notes = []
    groups = None
    if isinstance(network, RollCallSource):
        series, groups, source, notes = _rollcalls(network)
    elif isinstance(network, SyntheticNetwork):
        series, truth, source = _generate(network, seed)
    else:
        path = network.path
        p = Path(path).expanduser()
        if not p.is_file():
            raise ConfigError(
                "network.path",
                path,
                "no such file" if not p.exists() else "not a regular file",
                "check the path (relative paths start from the directory pgmflow runs in)",
            )
        p = p.resolve()
        loader = tdata.load_npz if network.kind == "npz" else tdata.load_csv
        try:
            series = loader(str(p))
        except tdata.TeslaDataError as exc:
            raise ConfigError("network.path", path, f"{exc.problem}", exc.fix) from None
        source = str(p)
        if network.truth:
            truth = _load_truth(network.truth, series)
    if getattr(series, "recoded_from_01", False):
        notes.append("values were 0/1: read 0 as -1 and 1 as +1")
    isolated = np.asarray(tdata.constant_nodes(series), dtype=np.int64)
    if isolated.size:
        names = [series.node_names[i] for i in isolated[:10]]
        more = f" and {isolated.size - 10} more" if isolated.size > 10 else ""
        notes.append(
            f"warning: {isolated.size} node(s) never change value and are reported as isolated "
            f"(no edges): {', '.join(names)}{more}"
        )
    return NetworkData(series, truth, source, isolated, tuple(notes), groups)


def _rollcalls(net: RollCallSource):
    """(series, parties per node, source line, notes) of roll-call data; ConfigError naming the fix."""
    from pgmflow.tasks.tesla import rollcall

    try:
        if net.source == "pscl":
            rc = rollcall.read_pscl(net.path, net.object)
        else:
            rc = rollcall.read_voteview(str(net.path), net.prefix)
        series, parties, notes = rollcall.to_series(rc, net.time_axis, net.window_days, net.missing, net.partial)
    except rollcall.RollCallError as exc:
        if exc.problem.startswith("time axis"):
            raise ConfigError("network.window_days", net.window_days, exc.problem, exc.fix) from None
        if net.path is None:  # the installed package
            raise ConfigError("network.source", net.source, f"{exc.path}: {exc.problem}", exc.fix) from None
        raise ConfigError("network.path", exc.path, exc.problem, exc.fix) from None
    what = f"{net.object} (pscl)" if net.source == "pscl" else f"{net.prefix} (Voteview)"
    source = f"roll calls {what} from {rc.source}, one time point per {net.time_axis}"
    return series, tuple(parties), source, list(notes)


def _generate(net: SyntheticNetwork, seed: int):
    """(series, true edges bool [T, p, p], source line) of the synthetic network."""
    from pgmflow.tasks.tesla import data as tdata
    from pgmflow.tasks.tesla import synthetic

    kw = {
        "n_edges": net.n_edges,
        "rewire_every": net.rewire_every,
        "n_rewire": net.n_rewire,
        "max_degree": net.max_degree,
        "weight_low": net.weight_low,
        "weight_high": net.weight_high,
        "ramp": net.ramp,
        "field": net.field,
        "burn_in": net.burn_in,
    }
    kw = {k: v for k, v in kw.items() if v is not None}  # n_edges=None: the generator's default
    p, T, n = net.p, net.T, net.samples_per_time
    try:
        sample = synthetic.time_varying_ising(seed, p=p, T=T, samples_per_time=n, **kw)
    except ValueError as exc:
        raise ConfigError(
            "network",
            f"synthetic p={p} T={T}",
            str(exc),
            "change the network.* settings (see conf/network/synthetic.yaml)",
        ) from None
    source = f"synthetic time-varying Ising network p={p} T={T} samples_per_time={n} seed={seed}"
    return tdata.from_array(sample.X), np.asarray(sample.edges, bool), source


def _load_truth(path, series) -> np.ndarray:
    """Optional true edges for file data: an .npz with ``edges`` bool [T, p, p] (or [p, p] for all t)."""
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise ConfigError("network.truth", str(path), "no such file", "pass an .npz with an 'edges' array or drop it")
    try:
        with np.load(p, allow_pickle=False) as z:
            e = np.asarray(z["edges"]).astype(bool)
    except Exception as exc:
        raise ConfigError(
            "network.truth",
            str(path),
            f"cannot read an 'edges' array ({type(exc).__name__})",
            "save the truth with numpy.savez(path, edges=bool array [T, p, p])",
        ) from None
    T, pn = len(series.n_per_time), len(series.node_names)
    if e.shape == (pn, pn):
        e = np.broadcast_to(e, (T, pn, pn)).copy()
    if e.shape != (T, pn, pn):
        raise ConfigError(
            "network.truth",
            str(path),
            f"edges has shape {e.shape}, the data needs ({T}, {pn}, {pn})",
            "save edges for every time point and node",
        )
    if not np.array_equal(e, np.transpose(e, (0, 2, 1))):
        raise ConfigError("network.truth", str(path), "edges is not symmetric", "save an undirected adjacency")
    return e
