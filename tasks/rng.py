"""Randomness from identity, never from placement.

Every random stream is derived from the one master ``seed`` and the *identity* of the work that
uses it: ``numpy.random.SeedSequence(seed, spawn_key=(stage, *identity))``. Nothing here knows
about workers, blocks or arrival order, so a task recomputes the same numbers wherever and
whenever it runs.

Stage numbers are fixed forever (changing one changes every result of that stage).
"""

from __future__ import annotations

import numpy as np

# Stage identifiers: the first element of every spawn key.
STAGE_ISING_KEY = 1  # Philox key of the Ising sweep kernel (identity: chain)
STAGE_INIT = 2  # initial states (identity: chain, replica)
STAGE_EXPLORE = 3  # continuous explorers (identity: chain, replica, scan)
STAGE_SWAP = 4  # swap decisions (identity: chain, scan)
STAGE_DISORDER = 5  # quenched disorder of a spin glass (identity: disorder_seed)
STAGE_TARGET = 6  # random construction of a target, e.g. mixture means (identity: target seed)
STAGE_LDA_SYNTH_TOPICS = 7  # true topics and alpha of a synthetic LDA corpus (identity: none)
STAGE_LDA_SYNTH_DOCS = 8  # documents of one shard of a synthetic LDA corpus (identity: shard index)
STAGE_LDA_INIT = 9  # initial lambda of SVI for LDA (identity: none)
STAGE_LDA_ORDER = 10  # order in which a shard's documents enter minibatches (identity: shard, epoch)
STAGE_LDA_SPLIT = 11  # held-out documents and their observed/test halves (identity: shard)
STAGE_TESLA_GRAPH = 12  # graphs and edge weights of a synthetic time-varying network (identity: none)
STAGE_TESLA_GIBBS = 13  # Gibbs samples of a synthetic time-varying network (identity: time point)
STAGE_TESLA_SPLIT = 14  # held-out samples for TESLA model selection (identity: none)
STAGE_MEAN_FIELD = 15  # random restarts of naive mean field (identity: restart index)
STAGE_GP = 16  # inducing-point GPs (identity: stream, ...: 0 data part, 1 inducing init, 2 SVGP step)


def seed_sequence(seed: int, stage: int, *identity: int) -> np.random.SeedSequence:
    """The SeedSequence of one piece of work: ``SeedSequence(seed, spawn_key=(stage, *identity))``."""
    return np.random.SeedSequence(int(seed), spawn_key=(int(stage), *(int(i) for i in identity)))


def generator(seed: int, stage: int, *identity: int) -> np.random.Generator:
    """A NumPy Generator (Philox bit generator) for one piece of work."""
    return np.random.Generator(np.random.Philox(seed_sequence(seed, stage, *identity)))


def philox_key(seed: int, stage: int, *identity: int) -> np.ndarray:
    """A 64-bit Philox4x32 key as uint32 [2], for the counter-based kernels."""
    return seed_sequence(seed, stage, *identity).generate_state(2, dtype=np.uint32)
