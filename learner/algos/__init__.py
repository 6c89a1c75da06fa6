"""The algorithms a learner trains with, by the name learner.algo gives (foundation.config_algos.ALGOS).

    algorithm = build_algorithm(config.learner)   # a learner.algorithm.Algorithm

Each module reads top to bottom with its paper beside it: sac.py, tqc.py, crossq.py.
"""

from __future__ import annotations

from collections.abc import Callable

from foundation.config import LearnerConfig
from learner.algorithm import Algorithm
from learner.algos.crossq import CrossQ
from learner.algos.sac import SAC
from learner.algos.tqc import TQC

ALGORITHMS: dict[str, Callable[[LearnerConfig], Algorithm]] = {
    "sac": lambda learner: SAC(),
    "tqc": lambda learner: TQC(drop=learner.tqc.drop),
    "crossq": lambda learner: CrossQ(),
}


def build_algorithm(learner: LearnerConfig) -> Algorithm:
    """The algorithm learner.algo names, with its section's settings (a ConfigError names the
    choices for an unknown name)."""
    learner.algorithm()  # refuses an unknown name
    return ALGORITHMS[learner.algo](learner)
