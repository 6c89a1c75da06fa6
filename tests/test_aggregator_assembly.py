"""StepAssembly (aggregator/assembly.py): K-of-M steps, staleness, the deadline and the weighted
mean, on plain arrays, without weights or an optimizer."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from aggregator.assembly import StepAssembly
from aggregator.validation import GradientError, sum_of_squares
from foundation.config import AggregatorConfig
from foundation.policy import GRADIENT_GROUPS

CONFIG = AggregatorConfig(step_deadline_ms=50.0, max_grad_norm=0.0, staleness_power=1.0)
SIZES = {"actor": 5, "critic": 7, "log_alpha": 1}


def grads(seed: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {g: (scale * rng.normal(size=n)).astype(np.float32) for g, n in SIZES.items()}


def squares(g: dict[str, np.ndarray]) -> float:
    return sum(sum_of_squares(v) for v in g.values())


def add(assembly: StepAssembly, learner: str, g: dict[str, np.ndarray], staleness: int = 0, batch: int = 16) -> bool:
    return assembly.add(learner, g, squares(g), staleness, batch)


def test_a_step_is_full_once_k_learners_have_one_pending():
    assembly = StepAssembly(CONFIG, grads_per_step=3, max_staleness=1)
    assert not add(assembly, "a", grads(0)) and not add(assembly, "b", grads(1))
    assert assembly.pending == 2
    assert add(assembly, "c", grads(2))
    assembly.close()
    assert assembly.pending == 0


def test_a_learners_next_gradient_is_a_repeat_that_closes_the_step():
    assembly = StepAssembly(CONFIG, grads_per_step=2, max_staleness=1)
    assert not assembly.holds("fast")
    add(assembly, "fast", grads(0))
    assert assembly.holds("fast") and assembly.repeat_steps == 1
    assert not assembly.holds("slow") and assembly.repeat_steps == 1


def test_staleness_drops_what_is_too_old_and_refuses_the_future():
    assembly = StepAssembly(CONFIG, grads_per_step=1, max_staleness=2)
    assert [assembly.staleness(base, 5) for base in (5, 4, 3, 2)] == [0, 1, 2, None]
    with pytest.raises(GradientError, match="6 is ahead of the aggregator") as err:
        assembly.staleness(6, 5)
    assert err.value.field == "base_version"


def test_the_deadline_closes_a_step_short_of_k():
    assembly = StepAssembly(CONFIG, grads_per_step=2, max_staleness=1)
    assert not assembly.due()  # nothing pending
    add(assembly, "a", grads(0))
    assert not assembly.due(now=assembly.opened + 0.049)
    assert assembly.due(now=assembly.opened + 0.051) and assembly.deadline_steps == 1
    off = StepAssembly(dataclasses.replace(CONFIG, step_deadline_ms=0.0), grads_per_step=2, max_staleness=1)
    add(off, "a", grads(0))
    assert not off.due(now=off.opened + 1e6) and off.deadline_steps == 0


def test_the_mean_weighs_by_batch_size_and_discounts_staleness():
    assembly = StepAssembly(CONFIG, grads_per_step=3, max_staleness=2)
    g = [grads(seed) for seed in range(3)]
    add(assembly, "a", g[0], staleness=0, batch=16)  # weight 16
    add(assembly, "b", g[1], staleness=1, batch=64)  # weight 64 / 2
    add(assembly, "c", g[2], staleness=0, batch=0)  # unknown size: weight 1
    mean = assembly.close()
    assert mean is not None
    for group in GRADIENT_GROUPS:
        expected = (16 * g[0][group].astype(np.float64) + 32 * g[1][group] + g[2][group]) / 49
        np.testing.assert_allclose(mean.grads[group], expected, rtol=1e-6)
        assert mean.grads[group].dtype == np.float32
    assert mean.norm == pytest.approx(np.sqrt(squares(mean.grads)), rel=1e-6)


def test_one_gradient_is_its_own_mean_uncopied_with_the_validators_norm():
    assembly = StepAssembly(CONFIG, grads_per_step=1, max_staleness=1)
    g = grads(4)
    add(assembly, "a", g)
    mean = assembly.close()
    assert mean is not None and all(mean.grads[k] is g[k] for k in g)
    assert mean.norm == pytest.approx(np.sqrt(squares(g)))


def test_the_mean_is_clipped_to_max_grad_norm_and_counted():
    assembly = StepAssembly(dataclasses.replace(CONFIG, max_grad_norm=1.0), grads_per_step=1, max_staleness=1)
    g = grads(5, scale=10.0)
    add(assembly, "a", g)
    mean = assembly.close()
    assert mean is not None and assembly.clipped == 1
    assert mean.norm == pytest.approx(1.0) and np.sqrt(squares(mean.grads)) == pytest.approx(1.0, rel=1e-5)
    np.testing.assert_allclose(mean.grads["critic"], g["critic"] / np.sqrt(squares(g)), rtol=1e-5)
    add(assembly, "a", grads(6, scale=1e-3))
    assert assembly.close() is not None and assembly.clipped == 1  # within the bound: untouched


def test_two_near_float32_max_gradients_average_without_overflow():
    assembly = StepAssembly(CONFIG, grads_per_step=2, max_staleness=1)
    huge = {g: np.full(n, 3e38, np.float32) for g, n in SIZES.items()}
    add(assembly, "a", huge)
    add(assembly, "b", huge)
    mean = assembly.close()
    assert mean is not None and all(np.all(v == np.float32(3e38)) for v in mean.grads.values())
    clipping = StepAssembly(dataclasses.replace(CONFIG, max_grad_norm=10.0), grads_per_step=2, max_staleness=1)
    add(clipping, "a", huge)
    add(clipping, "b", huge)
    clipped = clipping.close()
    assert clipped is not None and clipped.norm == pytest.approx(10.0)


def test_a_mean_whose_norm_is_not_finite_makes_no_step():
    assembly = StepAssembly(CONFIG, grads_per_step=1, max_staleness=1)
    assembly.add("a", grads(0), float("inf"), 0, 16)
    assert assembly.close() is None and assembly.pending == 0


def test_grads_per_step_below_one_is_refused():
    with pytest.raises(ValueError, match=r"grads_per_step \(0\) must be >= 1"):
        StepAssembly(CONFIG, grads_per_step=0, max_staleness=1)
