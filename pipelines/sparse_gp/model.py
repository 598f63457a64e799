"""The fitted GP as a plain Python object and as an MLflow pyfunc model.

:class:`GPPredictor` is rebuilt from ``model.npz`` (what every sparse_gp run logs: hyperparameters,
inducing inputs, the summed statistics or ``q(u)``, the exact GP's training rows, and the
standardisation) and predicts with the functions the run itself used
(``pgmflow.tasks.gp.chunks.predict_f`` for SGPR, DTC, FITC and SVGP, ``pgmflow.tasks.gp.exact.predict``
for the exact GP), in original units: inputs are standardised with the run's training means and
standard deviations, and the mean and variance are mapped back.

The run logs the same predictor as an MLflow pyfunc model, the run's logged model :data:`ARTIFACT_PATH`
(``model``; ``pgmflow.core.models.log_pyfunc``): ``mlflow.pyfunc.load_model("runs:/<run id>/model").predict(df)``
(or ``models:/<model id>``) returns a DataFrame
with the columns ``mean`` and ``variance`` (of a new observation ``y``, noise included); the
signature names the input columns, so MLflow takes a DataFrame (or a dict of columns), while
:meth:`GPPredictor.predict` also takes arrays. The model folder holds ``artifacts/model.npz`` and a
models-from-code file that imports :class:`GPPyfunc` from pgmflow (``pgmflow.core.models``):
nothing is pickled.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from pgmflow.core import models
from pgmflow.core.models import NPZ_KEY
from pgmflow.tasks.gp import kernels as kern
from pgmflow.tasks.gp import likelihoods as glik
from pgmflow.tasks.gp import stats as gstats
from pgmflow.tasks.gp.data import Standardizer

ARTIFACT_PATH = "model"  # the name of the run's logged pyfunc model (runs:/<run id>/model)
OUTPUTS = ("mean", "variance")


class GPPredictor:
    """A fitted GP regression (any of sgpr, dtc, fitc, svgp, exact) that predicts in original units.

    method: str. kernel: a name (rbf, matern32, matern52) or a kernel object.
    params: ``pgmflow.tasks.gp.kernels.GPParams`` (standardised units).
    standardizer: ``pgmflow.tasks.gp.data.Standardizer`` of the training rows.
    input_names: tuple of d str; target_name: str.
    Z: float64 [m, d] inducing inputs (standardised; None for exact); stats: the summed statistics
    (sgpr/dtc/fitc) or None; state: ``SVGPState`` (svgp) or None; X_train [n, d], y_train [n]:
    standardised training rows (exact) or None; jitter: the absolute jitter the run's Cholesky of
    ``Kuu`` used.
    """

    def __init__(
        self,
        method,
        kernel,
        params,
        standardizer,
        input_names,
        target_name,
        Z=None,
        stats=None,
        state=None,
        X_train=None,
        y_train=None,
        jitter: float = 0.0,
        likelihood=None,
    ):
        self.method, self.params = str(method), params
        self.kernel = kernel if kern.is_object(kernel) else str(kernel)  # a name, or a kernel object
        self.standardizer = standardizer
        self.input_names, self.target_name = tuple(input_names), str(target_name)
        self.Z, self.stats, self.state = Z, stats, state
        self.X_train, self.y_train = X_train, y_train
        self.jitter = float(jitter)
        self.likelihood = likelihood  # svgp: a pgmflow.tasks.gp.likelihoods.Likelihood; None: Gaussian

    @property
    def d(self) -> int:
        return len(self.input_names)

    @classmethod
    def from_npz(cls, path) -> GPPredictor:
        """The predictor of a ``model.npz`` written by a sparse_gp run."""
        from pgmflow.tasks.gp.svgp import SVGPState

        with np.load(path, allow_pickle=False) as z:
            a = {k: z[k] for k in z.files}
        method, kernel = str(a["method"]), str(a["kernel"])
        if kernel not in kern.KERNELS:  # a kernel object, saved in its grammar (pgmflow.tasks.gp.kernel_algebra)
            from pgmflow.tasks.gp.kernel_algebra import parse

            kernel = parse(kernel, int(np.size(a["x_mean"])))
        params = kern.GPParams(
            np.asarray(a["log_lengthscale"], dtype=np.float64), float(a["log_variance"]), float(a["log_noise"])
        )
        std = Standardizer(
            np.asarray(a["x_mean"], dtype=np.float64),
            np.asarray(a["x_std"], dtype=np.float64),
            float(a["y_mean"]),
            float(a["y_std"]),
        )
        stats = state = None
        if method in gstats.METHODS:
            kind = gstats.FITCStats if method == "fitc" else gstats.Stats
            if "stats_AAT" not in a and "stats_psi2" in a:  # written before issue 37: Kuf Kfu and Kuf y
                a = _whitened_stats(a, kernel, params, Z=np.asarray(a["Z"]))
            stats = kind(*(a[f"stats_{f}"] for f in kind._fields))
            stats = stats._replace(n=int(stats.n), yy=float(stats.yy))
        elif method == "svgp":
            state = SVGPState(a["svgp_theta1"], a["svgp_theta2"])
        return cls(
            method,
            kernel,
            params,
            std,
            [str(v) for v in a["input_names"]],
            str(a["target_name"]),
            Z=a.get("Z"),
            stats=stats,
            state=state,
            X_train=a.get("X_train"),
            y_train=a.get("y_train"),
            jitter=float(a["jitter"]),
            likelihood=_likelihood(a),
        )

    @classmethod
    def from_artifacts(cls, directory) -> GPPredictor:
        """The predictor of a run's downloaded artifacts: ``directory`` holds ``model.npz`` (the run's
        artifact root), or is the pyfunc model folder (``model/``, with ``artifacts/model.npz``)."""
        d = Path(directory)
        for p in (d / "model.npz", d / "artifacts" / "model.npz", d / ARTIFACT_PATH / "artifacts" / "model.npz"):
            if p.is_file():
                return cls.from_npz(p)
        raise FileNotFoundError(f"no model.npz in {d} (a sparse_gp run's artifacts, or its '{ARTIFACT_PATH}' folder)")

    def _inputs(self, X) -> np.ndarray:
        """float64 [n, d] in original units from a DataFrame (columns by name when they are the
        inputs' names, else by position), an array [n, d] or one row [d]."""
        if hasattr(X, "columns"):
            cols = [str(c) for c in X.columns]
            X = X[list(self.input_names)] if set(self.input_names) <= set(cols) else X
            X = X.to_numpy(dtype=np.float64)
        X = np.asarray(X, dtype=np.float64)
        if X.ndim == 1 and X.shape[0] == self.d:
            X = X[None, :]
        if X.ndim != 2 or X.shape[1] != self.d:
            raise ValueError(f"expected inputs of shape [n, {self.d}] ({', '.join(self.input_names)}); got {X.shape}")
        return X

    def predict_latent(self, X) -> tuple[np.ndarray, np.ndarray]:
        """Mean [n] and variance [n] of the latent ``f`` at standardised inputs ``X`` [n, d]."""
        from pgmflow.tasks.gp import exact as gexact
        from pgmflow.tasks.gp.chunks import Predictor, predict_f

        if self.method == "exact":
            return gexact.predict(self.kernel, self.params, self.X_train, self.y_train, X)
        # inducing_cholesky tries jitter * s first: the absolute jitter of the run's own factorisation
        rel = self.jitter / self.params.variance
        return predict_f(Predictor(self.method, self.kernel, self.params, self.Z, self.stats, self.state, rel, 6), X)

    def predict(self, X, include_noise: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Predictive mean [n] and variance [n] at inputs ``X`` in original units (a DataFrame, an array
        [n, d] or one row), in the target's units; ``include_noise``: the variance of a new ``y``
        (latent variance plus the noise variance), else of the latent ``f``. With a non-Gaussian likelihood
        (``self.likelihood``) and ``include_noise``: the mean and variance of a new ``y`` under it
        (``pgmflow.tasks.gp.likelihoods.predict_y``: Bernoulli the class-1 probability ``p`` and ``p (1 - p)``,
        Poisson the rate and the count variance, Student-t the mean and ``var + s2 nu / (nu - 2)``)."""
        std = self.standardizer
        mean_f, var_f = self.predict_latent(std.apply_X(self._inputs(X)))
        lik = self.likelihood
        if lik is not None and not lik.conjugate:
            if include_noise:
                mean_f, var_f = glik.predict_y(lik, mean_f, np.asarray(var_f), self.params.log_noise)
            return std.invert_mean(mean_f), std.invert_var(np.asarray(var_f))
        var = np.asarray(var_f) + (self.params.noise if include_noise else 0.0)
        return std.invert_mean(mean_f), std.invert_var(var)

    def predict_proba(self, X) -> np.ndarray:
        """Bernoulli: float64 [n, 2], the probabilities of class 0 and class 1 at inputs ``X``."""
        lik = self.likelihood
        if lik is None or lik.name != "bernoulli":
            raise ValueError("predict_proba needs a model fitted with sparse_gp.likelihood=bernoulli")
        p, _ = self.predict(X)
        return np.column_stack([1.0 - p, p])

    def predict_quantiles(self, X, probs=(0.05, 0.5, 0.95)) -> np.ndarray:
        """float64 [n, len(probs)]: quantiles of a new ``y`` at inputs ``X`` in the target's units (Gaussian
        and Student-t likelihoods; ``pgmflow.tasks.gp.likelihoods.predictive_quantiles``)."""
        lik = self.likelihood or glik.GAUSSIAN
        std = self.standardizer
        mean_f, var_f = self.predict_latent(std.apply_X(self._inputs(X)))
        q = glik.predictive_quantiles(lik, mean_f, np.asarray(var_f), probs, self.params.log_noise)
        return std.y_mean + std.y_std * q


def _whitened_stats(a: dict, kernel, params, Z) -> dict:
    """A ``model.npz`` of a version before issue 37 held ``psi2 = Kuf Kfu`` and ``psi1y = Kuf y`` (FITC: weighted by
    ``Lambda^-1``); the statistics are now ``AAT = L^-1 psi2 L^-T`` and ``Ay = L^-1 psi1y`` with the factor ``L``
    :meth:`GPPredictor.predict_latent` makes (the same jitter): converted here, as accurate as the old statistics
    were."""
    import scipy.linalg

    L, _ = kern.inducing_cholesky(kernel, params, Z, float(a["jitter"]) / params.variance, 6)
    solve = scipy.linalg.solve_triangular
    A = solve(L, np.asarray(a["stats_psi2"], dtype=np.float64), lower=True)  # L^-1 psi2
    AAT = solve(L, A.T, lower=True)  # L^-1 psi2 L^-T
    return {
        **a,
        "stats_AAT": 0.5 * (AAT + AAT.T),
        "stats_Ay": solve(L, np.asarray(a["stats_psi1y"], dtype=np.float64), lower=True),
    }


def _likelihood(a: dict):
    """The likelihood a ``model.npz`` records (none recorded: Gaussian, as every model before it existed)."""
    if "likelihood" not in a:
        return None
    return glik.Likelihood(str(a["likelihood"]), str(a["link"]), float(a["student_t_dof"]), int(a["quadrature_points"]))


def load_predictor(artifact_dir) -> GPPredictor:
    """The :class:`GPPredictor` of a sparse_gp run's downloaded artifacts (what ``pgmflow.load`` returns)."""
    return GPPredictor.from_artifacts(artifact_dir)


_PythonModel = models.python_model_base()
with warnings.catch_warnings(record=True):  # MLflow asks for type hints; the model's signature is explicit instead

    class GPPyfunc(_PythonModel):
        """The MLflow pyfunc wrapper of :class:`GPPredictor`: a DataFrame of inputs (columns named as
        the signature's) in, a DataFrame of ``mean`` and ``variance`` (original units, noise included) out."""

        def load_context(self, context):
            self.predictor = GPPredictor.from_npz(context.artifacts[NPZ_KEY])

        def predict(self, context, model_input, params=None):
            import pandas as pd

            mean, var = self.predictor.predict(model_input)
            return pd.DataFrame({"mean": mean, "variance": var})


def signature(input_names):
    """Inputs: one double column per input, by name; outputs: the columns ``mean`` and ``variance``."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("double", str(n)) for n in input_names]),
        outputs=Schema([ColSpec("double", n) for n in OUTPUTS]),
    )


def log_model(ctx, arrays: dict, example_X) -> None:
    """Log the run's GP as the pyfunc model ``model`` (see the module docstring); ``arrays`` are
    ``model.npz``'s, ``example_X`` [k, d] a few input rows in original units (the input example)."""
    import pandas as pd

    names = [str(v) for v in arrays["input_names"]]
    example = pd.DataFrame(np.asarray(example_X, dtype=np.float64), columns=names)
    models.log_pyfunc(ctx, arrays, ARTIFACT_PATH, GPPyfunc, signature(names), example, "model.npz")


def _rows(data, fraction: float, seed: int, test: bool):
    """``(name, array)`` pairs of the training (or held-out) rows of ``data``, in row order; an ``.npy``
    file is streamed block by block (bounded memory) from the memory map the validation opened."""
    from pgmflow.sparse_gp import data as gp_data

    key = gp_data.split_key(seed)
    if not data.memmap:
        held = gp_data.heldout_rows(key, 0, data.n, fraction)
        sel = held if test else ~held
        yield "X", data.X[sel]
        yield "y", data.y[sel]
        return
    A = data.rows if data.rows is not None else gp_data.open_npy(data.path)
    block = max(1024, (64 << 20) // (8 * A.shape[1]))
    for a in range(0, data.n, block):
        b = min(data.n, a + block)
        held = gp_data.heldout_rows(key, a, b, fraction)
        yield "rows", np.asarray(A[a:b], dtype=np.float64)[held if test else ~held]


def log_inputs(ctx, plan) -> None:
    """Record the run's GP data (``plan.data``, ``plan.test_rows``) with
    ``pgmflow.core.datasets.log_input``: the training rows (context ``training``), the held-out
    rows and ``gp_data.test_path`` (context ``test``)."""
    from pgmflow.core import datasets

    data, seed, fraction = plan.data, plan.seed, plan.test_fraction
    origin = data.origin
    if origin.path is None:
        where = {"generator": origin.generator, "parameters": origin.parameters}
    else:
        where = {"path": origin.path}
    name = origin.name
    columns = [*data.input_names, data.target_name]
    split = {"split": {"test_fraction": fraction, "seed": seed}}
    datasets.log_input(
        ctx.tracker,
        name,
        _rows(data, fraction, seed, False),
        context="training",
        columns=columns,
        profile=split,
        **where,
    )
    if data.n_test:
        datasets.log_input(
            ctx.tracker,
            name,
            _rows(data, fraction, seed, True),
            context="test",
            columns=columns,
            profile=split,
            **where,
        )
    test = plan.test_rows
    if test is not None:
        datasets.log_input(
            ctx.tracker, test.path.name, {"X": test.X, "y": test.y}, path=test.path, context="test", columns=columns
        )
