"""NormalizerTotals (aggregator/normalizer.py): the run's input statistics behind obs_norm."""

from __future__ import annotations

import numpy as np

from aggregator.normalizer import NormalizerTotals
from foundation.policy import ModelSpec
from nets.models import norm_stats

SPEC = ModelSpec(obs_dim=3, goal_dim=2, act_dim=2, hidden_sizes=(8,))


def test_the_totals_give_mean_and_std_of_every_batch_added_and_survive_a_restore():
    totals = NormalizerTotals(SPEC)
    rng = np.random.default_rng(0)
    batches = [rng.normal(2.0 * i, 1.0 + i, (30, SPEC.input_dim)) for i in range(3)]
    for x in batches:
        totals.add(norm_stats(x))
    everything = np.concatenate(batches)
    np.testing.assert_allclose(totals.flat()[: SPEC.input_dim], everything.mean(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(totals.flat()[SPEC.input_dim :], everything.std(0), rtol=1e-4)
    restored = NormalizerTotals(SPEC)
    restored.load_state(totals.state())
    np.testing.assert_array_equal(restored.flat(), totals.flat())
    restored.add(norm_stats(batches[0]))  # a copy: the original's totals stay
    assert not np.array_equal(restored.state(), totals.state())
