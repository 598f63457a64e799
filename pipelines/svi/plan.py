"""The plan of an SVI run for LDA: every setting with its type, and the corpus resolved once.

``pgmflow.svi.validate.check_svi`` reads the config and returns a :class:`Plan`; ``run(ctx, plan)``
and everything below it work from the plan and its small typed pieces, never from the config.
Stochastic variational inference for LDA follows Hoffman, Blei, Bach (2010) and Hoffman et al.
(2013); LDA is Blei, Ng, Jordan (2003); the constraints of the E-step are the posterior
regularization of Ganchev et al. (2010).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pgmflow.svi.corpora import Source

if TYPE_CHECKING:
    from pgmflow.tasks.lda.corpus import CorpusInfo
    from pgmflow.tasks.lda.regularization import PRConfig


@dataclass(frozen=True)
class LDAModel:
    """LDA (Blei, Ng, Jordan 2003): ``K`` topics ``beta_k ~ Dir(eta)``, proportions ``theta_d ~ Dir(alpha)``.

    K: number of topics; alpha: the symmetric Dirichlet prior of the proportions; eta: of the topics
    (``model.alpha`` / ``model.eta``; null in the config is 1/K, resolved here)."""

    K: int
    alpha: float
    eta: float

    def alpha_vector(self) -> np.ndarray:
        """alpha as the float64 [K] vector the E-step takes."""
        return np.full(self.K, self.alpha)


@dataclass(frozen=True)
class StepSize:
    """The step size ``rho_t = (tau0 + t)^-kappa`` of the global update (Hoffman, Blei, Bach 2010,
    eq. 6; Hoffman et al. 2013, eq. 26). tau0: delay, >= 0; kappa: forgetting rate in (0.5, 1]."""

    tau0: float
    kappa: float


@dataclass(frozen=True)
class EStep:
    """The local E-step of a document (Hoffman et al. 2013, Fig. 6): at most ``max_iter`` iterations,
    stopping when the mean absolute change of gamma is below ``tol``."""

    max_iter: int
    tol: float


@dataclass(frozen=True)
class HeldOut:
    """The held-out documents of the perplexity evaluation (Hoffman, Blei, Bach 2010, Sec. 4).

    fraction: ``svi.heldout_fraction`` as configured; max_docs: ``svi.max_heldout_docs``, about how
    many held-out documents at most (None or 0: no cap)."""

    fraction: float
    max_docs: int | None

    def fraction_for(self, n_docs: int) -> float:
        """The fraction held out of a corpus of ``n_docs`` documents (the cap lowers it)."""
        f = self.fraction
        if self.max_docs:
            f = min(f, self.max_docs / max(n_docs, 1))
        return f


@dataclass(frozen=True)
class Schedule:
    """Minibatches and steps (Hoffman et al. 2013, Fig. 6), resolved against the corpus.

    batch_size: ``svi.batch_size`` as configured; n_epochs: passes over the training documents;
    max_steps: a cap on the steps (None: none); n_train: training documents of the corpus;
    steps_per_epoch: ``ceil(n_train / min(batch_size, n_train))``; n_steps: steps of the run."""

    batch_size: int
    n_epochs: int
    max_steps: int | None
    n_train: int
    steps_per_epoch: int
    n_steps: int

    @property
    def batch_docs(self) -> int:
        """Documents per minibatch, S (never more than the training documents)."""
        return min(self.batch_size, self.n_train)


@dataclass(frozen=True)
class Outputs:
    """What the run records. eval_every: held-out perplexity every N steps (0: at the end only);
    checkpoint_every: a checkpoint every N steps (0: never); top_words: words per topic in the tables;
    figures: log figures."""

    eval_every: int
    checkpoint_every: int
    top_words: int
    figures: bool


@dataclass(frozen=True)
class PRSettings:
    """Posterior-regularization settings of the E-step (Ganchev et al. 2010), as configured.

    seed_words: topic -> the words (or word ids) whose tokens put at least ``seed_mass`` on that topic
    (None: no seed words); seed_mass: one mass in (0, 1], or a mapping by topic or (topic, word);
    topic_cap: at most this many topics per document, ``sum_k max_n q_n(k) <= topic_cap`` (None: no cap);
    max_iter, tol: the dual solve's iterations and tolerance."""

    seed_words: dict[Any, Any] | None
    seed_mass: float | dict[Any, float]
    topic_cap: float | None
    max_iter: int
    tol: float

    @property
    def active(self) -> bool:
        """Whether any constraint is set."""
        return bool(self.seed_words) or self.topic_cap is not None


@dataclass(frozen=True)
class Plan:
    """An SVI run for LDA, typed; ``run(ctx, plan)`` works from it (the config is read in validation only).

    seed: the master seed (every task's generator is keyed by it and the task's identity);
    model: LDA's K, alpha, eta; step_size: rho_t's tau0 and kappa; estep: the local E-step's settings;
    schedule: minibatches and steps; heldout: the held-out settings, and heldout_fraction the fraction
    they give for this corpus; outputs: evaluations, checkpoints, tables, figures; restarts: more fits
    from seeded initial topics (the lowest held-out perplexity is kept); keep_in_memory: workers keep
    their shards in memory (False: re-read from disk each step); pr: the posterior-regularization
    settings, and constraints the ``PRConfig`` they give with words mapped to ids (None: no
    constraints); source: where the corpus comes from; corpus: the corpus itself, opened and checked
    once (``pgmflow.tasks.lda.corpus.CorpusInfo``)."""

    seed: int
    model: LDAModel
    step_size: StepSize
    estep: EStep
    schedule: Schedule
    heldout: HeldOut
    heldout_fraction: float
    outputs: Outputs
    restarts: int
    keep_in_memory: bool
    pr: PRSettings
    constraints: PRConfig | None
    source: Source
    corpus: CorpusInfo

    @property
    def n_words(self) -> int:
        """V, the size of the corpus's vocabulary."""
        return int(self.corpus.n_words)


def work_seconds(plan: Plan) -> float:
    """Rough single-core seconds of the run (``pgmflow.core.smallwork``): per step, the minibatch's E-step
    (documents x distinct words per document x K x the E-step's iteration cap, ~1 ns each) and the topic
    update (K x vocabulary); per evaluation, the held-out documents' E-step; times the restarts."""
    c, s, K = plan.corpus, plan.schedule, plan.model.K
    words_per_doc = c.nnz / max(c.n_docs, 1)
    step = s.batch_docs * words_per_doc * K * plan.estep.max_iter * 1e-9 + K * c.n_words * 20e-9
    n_evals = 1 + (s.n_steps // plan.outputs.eval_every if plan.outputs.eval_every else 0)
    heldout = c.n_docs * plan.heldout_fraction * words_per_doc * K * plan.estep.max_iter * 1e-9
    return (1 + plan.restarts) * (s.n_steps * step + n_evals * heldout)
