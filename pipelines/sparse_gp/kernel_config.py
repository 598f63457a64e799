"""``sparse_gp.kernel`` and ``sparse_gp.kernel_params``: the kernel of a sparse-GP run, read once by
validation into a :class:`KernelSetup` (the kernel object of :mod:`pgmflow.tasks.gp.kernel_algebra`, its
starting hyperparameters and the optimiser's bounds on them), and what the run reports about it.

``sparse_gp.kernel`` is a string in the grammar of :func:`pgmflow.tasks.gp.kernel_algebra.parse`
(``long:rbf + seasonal:periodic * decay:rbf + medium:rq + short:rbf + white``). A bare ``rbf``,
``matern32`` or ``matern52`` without ``kernel_params`` is the named ARD kernel of earlier versions, with
``sparse_gp.lengthscale``, ``variance`` and ``noise``, bit for bit as before (no object is built). Anything
else builds an object; each base kernel has its own ``variance`` (the global scale ``GPParams.log_variance``
is held at 1), and ``sparse_gp.kernel_params.<name>`` sets its hyperparameters' starting values
(``variance``, ``lengthscale`` -- a number or one per active column --, ``period``, ``alpha``) and bounds
(``<hyperparameter>_bounds: [lo, hi]``), in standardised units like every other starting value."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pgmflow.core.errors import ConfigError
from pgmflow.tasks.gp import kernel_algebra as ka
from pgmflow.tasks.gp import kernels as kern

NAMED = ("rbf", "matern32", "matern52")  # the named kernels of earlier versions (string path, old bits)
DEFAULT_BOX = (1e-5, 1e5)  # natural units, as pgmflow.sparse_gp.fit.LOG_BOX
DEFAULTS = {"variance": 1.0, "period": 1.0, "alpha": 1.0}


@dataclass(frozen=True)
class KernelSetup:
    """A kernel object with its starting point and bounds: ``theta0`` [P] and ``bounds`` ``[(lo, hi)] * P``,
    logarithms, in the order of ``kernel.param_names()``."""

    kernel: ka.Kernel
    theta0: tuple
    bounds: tuple

    def params0(self, noise: float) -> kern.GPParams:
        """The starting :class:`~pgmflow.tasks.gp.kernels.GPParams`: ``theta0``, unit global scale, ``noise``."""
        return kern.GPParams(np.array(self.theta0, dtype=np.float64), 0.0, float(math.log(noise)))

    def box(self, noise_box: tuple, d: int, m: int, opt: bool) -> list:
        """L-BFGS-B's bounds on ``pack(params, Z)``: the hyperparameters', the global scale held at 1, the
        noise's ``noise_box`` (logs), none on the ``m x d`` inducing inputs when ``opt``."""
        return list(self.bounds) + [(0.0, 0.0), tuple(noise_box)] + ([(None, None)] * (m * d) if opt else [])


def is_named(kernel, kernel_params) -> bool:
    """Whether the config asks for a named kernel of earlier versions (the string path)."""
    return isinstance(kernel, str) and kernel.strip() in NAMED and not kernel_params


def _positive_pair(field, v):
    ok = isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(b, (int, float)) for b in v)
    if not ok:
        raise ConfigError(field, v, "must be a pair [lo, hi]", f"set e.g. {field}=[1e-3,1e3]")
    lo, hi = float(v[0]), float(v[1])
    if not (lo > 0 and hi > 0):
        raise ConfigError(field, v, "a bound at or below zero (hyperparameters are positive)", "use bounds > 0")
    if not lo <= hi:
        raise ConfigError(field, v, "the lower bound is above the upper one", "give [lo, hi] with lo <= hi")
    return lo, hi


def _values(field, v, size):
    vals = list(v) if isinstance(v, (list, tuple)) else [v]
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in vals):
        raise ConfigError(field, v, "must be a number (or one per active column)", f"set {field}=1.0")
    if len(vals) == 1:
        vals = vals * size
    if len(vals) != size:
        raise ConfigError(field, v, f"has {len(vals)} entries, the kernel takes {size}", "give one, or one per column")
    if any(not x > 0 for x in vals):
        raise ConfigError(field, v, "must be > 0", f"set {field} to a positive number")
    return [float(x) for x in vals]


def setup(kernel_text, kernel_params, d: int, lengthscale) -> KernelSetup:
    """The :class:`KernelSetup` of ``sparse_gp.kernel`` and ``sparse_gp.kernel_params`` for data with ``d``
    inputs (``lengthscale``: ``sparse_gp.lengthscale``, the default lengthscale). ConfigError, one line, on a
    malformed kernel, an unknown term or hyperparameter, a value or bound out of range."""
    if not isinstance(kernel_text, str):
        raise ConfigError(
            "sparse_gp.kernel", kernel_text, "must be a string", "e.g. sparse_gp.kernel='rbf + periodic * rbf'"
        )
    try:
        kernel = ka.parse(kernel_text, d)
    except ValueError as exc:
        raise ConfigError(
            "sparse_gp.kernel",
            kernel_text,
            str(exc),
            f"write sums and products of {', '.join(ka.BASE_KINDS)} (label:kind[columns]), "
            "e.g. 'rbf + periodic * rbf + white'",
        ) from None
    kp = dict(kernel_params or {})
    bases = {b.name: b for b in kernel.bases()}
    for name in kp:
        if name not in bases:
            raise ConfigError(
                f"sparse_gp.kernel_params.{name}",
                kp[name],
                f"names no kernel of sparse_gp.kernel (its kernels: {', '.join(bases)})",
                "use one of those names, or label a kernel (label:kind)",
            )
    theta, bounds = [], []
    for b in kernel.bases():
        given = dict(kp.get(b.name) or {})
        hps = [p for p, _ in ka.BASE_KINDS[b.kind]]
        known = set(hps) | {f"{p}_bounds" for p in hps}
        for key in given:
            if key not in known:
                raise ConfigError(
                    f"sparse_gp.kernel_params.{b.name}.{key}",
                    given[key],
                    f"is not a hyperparameter of {b.kind}",
                    f"use {', '.join(sorted(known))}",
                )
        for p, per_dim in ka.BASE_KINDS[b.kind]:
            field = f"sparse_gp.kernel_params.{b.name}.{p}"
            size = len(b.dims) if per_dim else 1
            default = lengthscale if p == "lengthscale" else DEFAULTS[p]
            if p == "lengthscale" and isinstance(default, (list, tuple)):
                default = [default[j] for j in b.dims] if len(default) == d else default
                default = default if per_dim else default[0]
            vals = _values(field, given.get(p, default), size)
            lo, hi = _positive_pair(f"{field}_bounds", given[f"{p}_bounds"]) if f"{p}_bounds" in given else DEFAULT_BOX
            for v in vals:
                if not lo <= v <= hi:
                    raise ConfigError(
                        field, v, f"lies outside its bounds [{lo:g}, {hi:g}]", f"start inside, or set {field}_bounds"
                    )
                theta.append(math.log(v))
                bounds.append((math.log(lo), math.log(hi)))
    return KernelSetup(kernel, tuple(theta), tuple(bounds))


def hyperparameters(kernel, params, std) -> dict:
    """``{name.hyperparameter: value}`` of a kernel object's fitted hyperparameters in original units
    (lengthscales and periods times the input's standard deviation, variances times the target's; the periodic
    kernel's lengthscale, which scales ``sin``, has no unit)."""
    out, i = {}, 0
    th = np.exp(np.asarray(params.log_lengthscale, dtype=np.float64))
    for b in kernel.bases():
        for p, per_dim in ka.BASE_KINDS[b.kind]:
            for k in range(len(b.dims) if per_dim else 1):
                v = float(th[i])
                if p == "variance":
                    v *= float(std.y_std) ** 2
                elif (p == "lengthscale" and per_dim) or p == "period":  # periodic's lengthscale has no unit
                    v *= float(np.asarray(std.x_std)[b.dims[k] if per_dim else b.dims[0]])
                out[f"{b.name}.{p}" + (f"[{b.dims[k]}]" if per_dim else "")] = v
                i += 1
    return out


def shortest_lengthscales(kernel, params, d: int) -> np.ndarray:
    """Per input, the shortest per-column lengthscale any base kernel of ``kernel`` gives it (standardised
    units; NaN where none does): what the lengthscale figure and the slice's default input use."""
    out = np.full(d, np.nan)
    th = np.exp(np.asarray(params.log_lengthscale, dtype=np.float64))
    i = 0
    for b in kernel.bases():
        for p, per_dim in ka.BASE_KINDS[b.kind]:
            n = len(b.dims) if per_dim else 1
            if p == "lengthscale" and per_dim:  # (periodic's lengthscale has no unit: not one of the inputs')
                for k in range(n):
                    out[b.dims[k]] = np.fmin(out[b.dims[k]], th[i + k])
            i += n
    return out
