"""The stage key: what a stage's result is a function of, hashed (docs/stages.md).

``material(cfg, workload, inputs)`` is a JSON-able dict of

* ``kind``: the workload's name;
* ``code``: the normalised digest of every module of its import closure (:mod:`pgmflow.core.fingerprint`),
  the numerical libraries' versions, and the manual ``cache.salt``;
* ``config``: the stage's own resolved config subtree (the sections its :class:`~pgmflow.core.registry.Stage`
  names, less the core's where-and-how-to-run sections and less its input fields: an input enters the key by
  its content, not by the path it was found at);
* ``inputs``: the SHA-256 of each input file;
* ``seed``: only when the stage draws random numbers;
* ``env``: only with ``cache.env=strict``: the backend, the BLAS libraries and the CPU model (the numeric
  environment of docs/reproducibility.md's table).

``key(material)`` is the SHA-256 of its canonical JSON (sorted keys, no spaces). ``explain(old, new)`` says
which part differs: the module whose code changed, the config field, the input, the seed, a library.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from pgmflow.core import fingerprint

# The core's own sections: where and how a run runs, never what it computes.
CORE_SECTIONS = ("resume", "progress", "verbose", "cluster", "tracking", "cache", "stages", "hydra", "debug")
KEY_TAG = "pgmflow.stage_key"
_FILE_DIGESTS: dict = {}


def file_digest(path: str | Path, content: bool = False) -> str:
    """SHA-256 of a file (memoised per (path, size, mtime)): of its bytes, or with ``content=True`` for an
    ``.npz`` of its arrays (names, dtypes, shapes, bytes, in name order; the zip container's timestamps, which
    numpy writes from the clock, do not count). A run's own data files are hashed as bytes (the run opens
    them once, in its validation); a stage's outputs by content, so that a recompute with the same bits keeps
    every downstream key."""
    st = os.stat(path)
    memo = (str(path), st.st_size, st.st_mtime_ns, content)
    if memo not in _FILE_DIGESTS:
        h = hashlib.sha256()
        if content and str(path).endswith(".npz"):
            import numpy as np

            with np.load(path, allow_pickle=False) as z:
                for name in sorted(z.files):
                    a = np.ascontiguousarray(z[name])
                    h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
                    h.update(a.tobytes())
        else:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        _FILE_DIGESTS[memo] = h.hexdigest()
    return _FILE_DIGESTS[memo]


def get_field(cfg: dict, dotted: str):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _without(d: dict, dotted: str) -> dict:
    head, _, rest = dotted.partition(".")
    if head not in d:
        return d
    if not rest:
        return {k: v for k, v in d.items() if k != head}
    if not isinstance(d[head], dict):
        return d
    return {**d, head: _without(d[head], rest)}


def config_subtree(cfg: dict, stage) -> dict:
    keys = stage.sections if stage.sections is not None else [k for k in cfg if k not in CORE_SECTIONS]
    sub = {k: cfg[k] for k in keys if k in cfg and k not in CORE_SECTIONS and k != "seed"}
    for port in stage.inputs:
        if port.field:
            sub = _without(sub, port.field)
    return sub


def input_digests(cfg: dict, stage, known: dict | None = None) -> dict:
    """{input: digest}: ``known`` (a study's upstream outputs, by content) or the file's bytes."""
    out = {}
    for port in stage.inputs:
        value = get_field(cfg, port.field) if port.field else None
        if known and port.name in known:
            out[port.name] = known[port.name]
        elif isinstance(value, str) and value and Path(value).expanduser().is_file():
            out[port.name] = file_digest(Path(value).expanduser())
        elif value is not None:
            out[port.name] = f"value:{value}"
    return out


def environment(cfg: dict) -> dict:
    from pgmflow.core import tracking
    from pgmflow.tasks import backend as backend_mod

    v = tracking.versions()
    return {
        "backend": backend_mod.resolve_backend(cfg.get("backend", "auto")),
        "blas": v.get("env.blas"),
        "cpu": v.get("env.cpu"),
        "machine": v.get("env.machine"),
    }


def material(cfg: dict, workload, known_inputs: dict | None = None) -> dict:
    stage = workload.stage
    cache = cfg.get("cache") or {}
    out = {
        "kind": workload.name,
        "code": {
            "modules": fingerprint.workload_code(workload),
            "libraries": fingerprint.library_versions(),
            "salt": str(cache.get("salt") or ""),
        },
        "config": config_subtree(cfg, stage),
        "inputs": input_digests(cfg, stage, known_inputs),
    }
    if stage.random:
        out["seed"] = cfg.get("seed")
    if cache.get("env") == "strict":
        out["env"] = environment(cfg)
    return out


def for_run(cfg: dict) -> tuple[str, dict]:
    """(key, material) of the run a resolved config describes (its workload from ``pipeline.name``)."""
    from pgmflow.core import registry

    mat = material(cfg, registry.get(cfg["pipeline"]["name"]))
    return key(mat), mat


def job_key(cfg: dict) -> str:
    """A sweep job's key: its run's stage key, or for a study (``stages:``) the key of the study's config
    with the code of every workload it names."""
    if not cfg.get("stages"):
        return for_run(cfg)[0]
    from pgmflow.core import registry

    names = sorted({str(s.get("workload")) for s in cfg["stages"].values() if isinstance(s, dict)})
    mat = {
        "study": {k: v for k, v in cfg.items() if k not in CORE_SECTIONS or k == "stages"},
        "code": {n: fingerprint.workload_code(registry.get(n)) for n in names if n in registry.names()},
        "libraries": fingerprint.library_versions(),
        "salt": str((cfg.get("cache") or {}).get("salt") or ""),
    }
    return key(mat)


def canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def key(mat: dict) -> str:
    return hashlib.sha256(canonical(mat).encode()).hexdigest()


def _flat(d, prefix=""):
    if not isinstance(d, dict):
        return {prefix[:-1]: d}
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out


def explain(old: dict, new: dict) -> list[str]:
    """What differs between two materials, one phrase per difference (most telling first)."""
    out = []
    om, nm = old.get("code", {}).get("modules", {}), new.get("code", {}).get("modules", {})
    for m in sorted(set(om) | set(nm)):
        if om.get(m) != nm.get(m):
            what = "added" if m not in om else "removed" if m not in nm else "changed"
            out.append(f"code of {m} {what}")
    for part in ("libraries",):
        o, n = old.get("code", {}).get(part, {}), new.get("code", {}).get(part, {})
        out += [f"{lib} {o.get(lib)} -> {n.get(lib)}" for lib in sorted(set(o) | set(n)) if o.get(lib) != n.get(lib)]
    if old.get("code", {}).get("salt") != new.get("code", {}).get("salt"):
        out.append(f"cache.salt {old.get('code', {}).get('salt')!r} -> {new.get('code', {}).get('salt')!r}")
    oc, nc = _flat(old.get("config", {})), _flat(new.get("config", {}))
    out += [f"config {k}: {oc.get(k)!r} -> {nc.get(k)!r}" for k in sorted(set(oc) | set(nc)) if oc.get(k) != nc.get(k)]
    oi, ni = old.get("inputs", {}), new.get("inputs", {})
    out += [
        f"input {k}: {str(oi.get(k))[:12]} -> {str(ni.get(k))[:12]}"
        for k in sorted(set(oi) | set(ni))
        if oi.get(k) != ni.get(k)
    ]
    if old.get("seed") != new.get("seed"):
        out.append(f"seed {old.get('seed')} -> {new.get('seed')}")
    if old.get("env") != new.get("env"):
        out.append(f"environment {old.get('env')} -> {new.get('env')}")
    if old.get("kind") != new.get("kind"):
        out.append(f"workload {old.get('kind')} -> {new.get('kind')}")
    return out
