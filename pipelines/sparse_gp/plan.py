"""The typed plan of a sparse-GP run: what :func:`pgmflow.sparse_gp.validate.check_sparse_gp`
returns and ``run(ctx, plan)`` works from. The config is read there only; below it, code takes the
plan or one of its pieces."""

from __future__ import annotations

from dataclasses import dataclass

from pgmflow.sparse_gp.data import GPData, TestRows
from pgmflow.tasks.gp.likelihoods import GAUSSIAN, Likelihood


@dataclass(frozen=True)
class Start:
    """The initial hyperparameters, in standardised units: ``lengthscale`` one number or one per input
    (ARD), the kernel's scale ``variance`` (``s``) and the Gaussian ``noise`` variance."""

    lengthscale: float | tuple[float, ...]
    variance: float
    noise: float


@dataclass(frozen=True)
class FitSettings:
    """L-BFGS-B on a collapsed objective (SGPR: Titsias 2009; DTC; FITC: Snelson and Ghahramani 2006),
    and what SVGP and the exact GP share with it.

    max_iter: L-BFGS-B iterations at most. jitter: ``Kuu``'s diagonal jitter relative to ``s``;
    max_tries: Cholesky tries, the jitter growing tenfold each time. optimize_inducing: ``Z`` is
    optimised too. checkpoint_every: iterations between L-BFGS-B checkpoints (0: none);
    checkpoint_every_seconds: at least this long between two of them (the last iteration's is always written;
    0: every ``checkpoint_every`` iterations). restarts: more fits from seeded starting points. evaluate:
    ``sparse_gp.evaluate`` as recorded (``direct`` or ``graph``: both are one graph per evaluation now)."""

    max_iter: int
    jitter: float
    max_tries: int
    optimize_inducing: bool
    checkpoint_every: int
    restarts: int
    evaluate: str = "direct"
    checkpoint_every_seconds: float = 5.0


@dataclass(frozen=True)
class SVGPSettings:
    """Stochastic variational GP (Hensman, Fusi and Lawrence 2013): ``steps`` minibatches of
    ``batch_size`` rows, the natural-gradient step ``rho`` of ``q(u)``, Adam's learning rate ``lr`` for
    the hyperparameters and ``Z``, and the full-data ELBO every ``eval_every`` steps."""

    steps: int
    batch_size: int
    rho: float
    lr: float
    eval_every: int


@dataclass(frozen=True, eq=False)
class Plan:
    """A validated sparse-GP run.

    seed: the master seed. method: sgpr | fitc | dtc | svgp | exact; kernel: rbf | matern32 | matern52 (the
    named kernels of earlier versions) or a kernel object (``pgmflow.tasks.gp.kernel_algebra``), with its
    starting point and bounds in ``kernel_setup`` (``pipelines/sparse_gp/kernel_config.py``; None for a name);
    m: inducing inputs. chunk_size: rows per chunk task. test_fraction: the held-out share.
    kmeans_iter, kmeans_points: Lloyd iterations after k-means++ and its subsample size (Arthur and
    Vassilvitskii 2007). in_process: ``"auto"``, True or False (``sparse_gp.in_process``). figures: log the
    figures. slice_dim: the input of the slice figure (an index), or None (the shortest lengthscale).
    start, fit, svgp: see :class:`Start`, :class:`FitSettings`, :class:`SVGPSettings`. data: the data,
    read once (:class:`~pgmflow.sparse_gp.data.GPData`); test_rows: ``gp_data.test_path``'s
    rows, read once, or None.
    """

    seed: int
    method: str
    kernel: object  # str | pgmflow.tasks.gp.kernel_algebra.Kernel
    m: int
    chunk_size: int
    test_fraction: float
    kmeans_iter: int
    kmeans_points: int
    in_process: str | bool
    figures: bool
    slice_dim: int | None
    start: Start
    fit: FitSettings
    svgp: SVGPSettings
    data: GPData
    test_rows: TestRows | None = None
    kernel_setup: object = None  # pgmflow.sparse_gp.kernel_config.KernelSetup for a kernel object
    likelihood: Likelihood = GAUSSIAN  # SVGP's likelihood (pgmflow.tasks.gp.likelihoods); the others: Gaussian
