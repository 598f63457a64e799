"""The data of a TESLA run: binary (+-1) samples over time, from a generator or a file.

``network.kind`` selects the source (``conf/network/*.yaml``):

* ``synthetic`` -- a time-varying Ising network with known edges (``pgmflow.tasks.tesla.synthetic``);
* ``npz`` -- an array ``X`` [T, n, p], or arrays ``x_0 .. x_{T-1}`` of shape [n_t, p];
* ``csv`` -- long format with columns ``time, sample, node, value``.

Every problem with the data is a :class:`ConfigError` naming the file, the value and the fix,
raised by the preflight checks before any task runs. The resolved data is cached in-process, so
the preflight's load is the run's load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np

from pgmflow.pipelines.core.errors import ConfigError

KINDS = ("synthetic", "npz", "csv")
SYNTHETIC_KEYS = ("p", "T", "samples_per_time", "n_edges", "rewire_every", "n_rewire", "max_degree", "weight_low",
                  "weight_high", "ramp", "field", "burn_in")


class NetworkData(NamedTuple):
    """Samples over time and, for synthetic data, the true edges."""

    series: object  # pgmflow.tasks.tesla.data.BinaryTimeSeries
    truth: np.ndarray | None  # bool [T, p, p] true edges per time point, or None
    source: str  # what the data is (a path, or "synthetic p=.. T=..")
    isolated: np.ndarray  # int64 node indices whose value never changes (not fitted, no edges)
    notes: tuple  # lines worth telling the user (recoding, isolated nodes)


_CACHE: dict[str, NetworkData] = {}


def resolve(cfg: dict) -> NetworkData:
    """The run's data (validated); ConfigError on any problem with it."""
    ncfg = cfg.get("network")
    key = json.dumps({"network": ncfg, "seed": cfg.get("seed")}, sort_keys=True, default=str)
    if key in _CACHE:
        return _CACHE[key]
    from pgmflow.tasks.tesla import data as tdata

    kind = ncfg["kind"]
    truth = None
    notes = []
    if kind == "synthetic":
        from pgmflow.tasks.tesla import synthetic

        kw = {k: ncfg[k] for k in SYNTHETIC_KEYS if k in ncfg and ncfg[k] is not None}
        p, T, n = int(kw.pop("p")), int(kw.pop("T")), int(kw.pop("samples_per_time"))
        try:
            net = synthetic.time_varying_ising(int(cfg["seed"]), p=p, T=T, samples_per_time=n, **kw)
        except ValueError as exc:
            raise ConfigError("network", f"synthetic p={p} T={T}", str(exc),
                              "change the network.* settings (see conf/network/synthetic.yaml)") from None
        series = tdata.from_array(net.X)
        truth = np.asarray(net.edges, bool)
        source = f"synthetic time-varying Ising network p={p} T={T} samples_per_time={n} seed={cfg['seed']}"
    else:
        path = ncfg.get("path")
        if not path:
            raise ConfigError("network.path", path, f"network={kind} needs a file", f"add network.path=FILE.{kind}")
        p = Path(str(path)).expanduser()
        if not p.is_file():
            raise ConfigError("network.path", str(path), "no such file" if not p.exists() else "not a regular file",
                              "check the path (relative paths start from the directory pgmflow runs in)")
        p = p.resolve()
        loader = tdata.load_npz if kind == "npz" else tdata.load_csv
        try:
            series = loader(str(p))
        except tdata.TeslaDataError as exc:
            raise ConfigError("network.path", str(path), f"{exc.problem}", exc.fix) from None
        source = str(p)
        if ncfg.get("truth"):
            truth = _load_truth(ncfg["truth"], series)
    if getattr(series, "recoded_from_01", False):
        notes.append("values were 0/1: read 0 as -1 and 1 as +1")
    isolated = np.asarray(tdata.constant_nodes(series), dtype=np.int64)
    if isolated.size:
        names = [series.node_names[i] for i in isolated[:10]]
        more = f" and {isolated.size - 10} more" if isolated.size > 10 else ""
        notes.append(f"warning: {isolated.size} node(s) never change value and are reported as isolated "
                     f"(no edges): {', '.join(names)}{more}")
    out = NetworkData(series, truth, source, isolated, tuple(notes))
    _CACHE[key] = out
    return out


def _load_truth(path, series) -> np.ndarray:
    """Optional true edges for file data: an .npz with ``edges`` bool [T, p, p] (or [p, p] for all t)."""
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise ConfigError("network.truth", str(path), "no such file", "pass an .npz with an 'edges' array or drop it")
    try:
        with np.load(p, allow_pickle=False) as z:
            e = np.asarray(z["edges"]).astype(bool)
    except Exception as exc:
        raise ConfigError("network.truth", str(path), f"cannot read an 'edges' array ({type(exc).__name__})",
                          "save the truth with numpy.savez(path, edges=bool array [T, p, p])") from None
    T, pn = len(series.n_per_time), len(series.node_names)
    if e.shape == (pn, pn):
        e = np.broadcast_to(e, (T, pn, pn)).copy()
    if e.shape != (T, pn, pn):
        raise ConfigError("network.truth", str(path), f"edges has shape {e.shape}, the data needs ({T}, {pn}, {pn})",
                          "save edges for every time point and node")
    if not np.array_equal(e, np.transpose(e, (0, 2, 1))):
        raise ConfigError("network.truth", str(path), "edges is not symmetric", "save an undirected adjacency")
    return e
