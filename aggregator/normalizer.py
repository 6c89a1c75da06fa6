"""The running totals behind the shared input normalizer (the obs_norm group).

    totals = NormalizerTotals(spec)
    totals.add(norm_stats)          # every accepted push's batch statistics, checked first
    obs_norm = totals.flat()        # mean ++ std per normalizer row, for the next version

The totals are [count, sum..., sum of squares...] per normalizer row (one per task with
ModelSpec.task_norm), accumulated in float64 over the whole run and never forgotten: every
version's obs_norm standardizes by everything learners have reported so far.
"""

from __future__ import annotations

import numpy as np

from aggregator.validation import norm_stats_size
from foundation.policy import ModelSpec
from nets.models import norm_from_stats


class NormalizerTotals:
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.totals = np.zeros(norm_stats_size(spec), np.float64)

    def add(self, stats: np.ndarray) -> None:
        """Count one batch's statistics (checked by GradientValidator.check_norm_stats)."""
        self.totals += stats

    def flat(self) -> np.ndarray:
        """The obs_norm group these totals give (float32 mean ++ std)."""
        return norm_from_stats(self.totals, self.spec.input_dim, self.spec.norm_rows, self.spec.one_hot)

    def state(self) -> np.ndarray:
        return self.totals.copy()

    def load_state(self, totals: np.ndarray) -> None:
        self.totals = np.array(totals, np.float64)
