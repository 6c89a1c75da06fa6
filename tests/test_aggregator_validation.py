"""GradientValidator (aggregator/validation.py): a push fits the model, or GradientError names
the field; one row per bad input."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.validation import GradientError, GradientValidator, global_norm, norm_stats_size, sum_of_squares
from foundation.policy import GRADIENT_GROUPS, ModelSpec
from nets.models import SACModel, norm_stats

SPEC = ModelSpec(obs_dim=3, goal_dim=2, act_dim=2, hidden_sizes=(8,))
SIZES = {g: SACModel(SPEC).get_flat(g).size for g in GRADIENT_GROUPS}
VALIDATOR = GradientValidator(SPEC, SIZES, max_input_abs=1e6)


def grads(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {g: rng.normal(size=SIZES[g]).astype(np.float32) for g in GRADIENT_GROUPS}


def stats(seed: int, n: int = 16) -> np.ndarray:
    rng = np.random.default_rng(1000 + seed)
    return norm_stats(rng.normal(seed, 1.0 + seed, (n, SPEC.input_dim)))


def _without(group: str):
    return lambda g, s: ({k: v for k, v in g.items() if k != group}, s)


def _with(group: str, value):
    return lambda g, s: ({**g, group: value(g)}, s)


def _poison(group: str, index: int, value: float):
    def mutate(g, s):
        bad = g[group].copy()
        bad[index] = value
        return {**g, group: bad}, s

    return mutate


def _stats(value):
    return lambda g, s: (g, value(s))


def _negative_count(g, s):
    s = s.copy()
    s[0] = -1
    return g, s


# One row per bad gradient: (case, mutate(grads, norm_stats) -> (grads, norm_stats), field, message).
BAD_GRADIENTS = [
    ("missing actor", _without("actor"), "tensors", "missing group(s) ['actor']"),
    ("missing log_alpha", _without("log_alpha"), "tensors", "missing group(s) ['log_alpha']"),
    ("unknown group", _with("critic_target", lambda g: g["critic"]), "tensors", "unknown group(s) ['critic_target']"),
    ("short critic", _with("critic", lambda g: g["critic"][:-1]), "tensors[critic].shape", "expected ["),
    ("2-D actor", _with("actor", lambda g: g["actor"][None]), "tensors[actor].shape", "[1, "),
    (
        "scalar log_alpha",
        _with("log_alpha", lambda g: g["log_alpha"][0]),
        "tensors[log_alpha].shape",
        "[], expected [1]",
    ),
    ("NaN actor", _poison("actor", 5, float("nan")), "tensors[actor].data", "contains NaN or inf"),
    ("inf critic", _poison("critic", 0, float("inf")), "tensors[critic].data", "contains NaN or inf"),
    ("-inf log_alpha", _poison("log_alpha", 0, -float("inf")), "tensors[log_alpha].data", "contains NaN or inf"),
    ("short norm_stats", _stats(lambda s: s[:-1]), "tensors[norm_stats].shape", f"expected [{1 + 2 * SPEC.input_dim}]"),
    ("2-D norm_stats", _stats(lambda s: s[None]), "tensors[norm_stats].shape", "expected"),
    (
        "NaN norm_stats",
        _stats(lambda s: np.where(np.arange(s.size) == 3, np.nan, s)),
        "tensors[norm_stats].data",
        "NaN",
    ),
    ("negative count", _negative_count, "tensors[norm_stats].data", "count -1 must be a whole number >= 1"),
]

# One row per bad set of normalizer statistics of a 16-row batch: (case, mutate(stats), message).
BAD_NORM_STATS = [
    ("zero count", lambda s: np.concatenate([[0.0], s[1:]]), "count 0 must be a whole number >= 1"),
    ("fractional count", lambda s: np.concatenate([[2.5], s[1:]]), "count 2.5 must be a whole number"),
    ("count over the batch", lambda s: np.concatenate([[17.0], s[1:]]), r"and <= batch_size \(16\)"),
    ("3e38 sums", lambda s: np.concatenate([s[:1], np.full(len(s) - 1, 3e38)]), "beyond max_input_abs"),
    (
        "squares below the sums",
        lambda s: np.concatenate([s[: 1 + SPEC.input_dim], np.zeros(SPEC.input_dim)]),
        "inconsistent with the sums",
    ),
]


@pytest.mark.parametrize("case,mutate,field,message", BAD_GRADIENTS, ids=[r[0] for r in BAD_GRADIENTS])
def test_a_bad_gradient_is_refused_naming_the_field(case, mutate, field, message):
    bad_grads, bad_stats = mutate(grads(1), stats(1))
    with pytest.raises(GradientError) as err:
        VALIDATOR.check(bad_grads, bad_stats)
    assert err.value.field == field
    assert message in str(err.value)


@pytest.mark.parametrize("case,mutate,message", BAD_NORM_STATS, ids=[r[0] for r in BAD_NORM_STATS])
def test_bad_normalizer_statistics_are_refused_naming_the_limit(case, mutate, message):
    bad = mutate(stats(0).astype(np.float64)).astype(np.float32)
    with pytest.raises(GradientError, match=message) as err:
        VALIDATOR.check_norm_stats(bad, batch_size=16)
    assert err.value.field == "tensors[norm_stats].data"


def test_the_input_bound_is_the_validators_own():
    rows = np.full((4, SPEC.input_dim), 50.0)
    GradientValidator(SPEC, SIZES, max_input_abs=100.0).check_norm_stats(norm_stats(rows), batch_size=4)
    with pytest.raises(GradientError, match=r"beyond max_input_abs \(10\)"):
        GradientValidator(SPEC, SIZES, max_input_abs=10.0).check_norm_stats(norm_stats(rows), batch_size=4)


def test_a_sound_gradient_returns_its_squared_norm():
    g = grads(3)
    expected = sum(float(np.sum(v.astype(np.float64) ** 2)) for v in g.values())
    assert VALIDATOR.check(g, stats(3), batch_size=16) == pytest.approx(expected, rel=1e-6)
    assert global_norm(g) == pytest.approx(np.sqrt(expected), rel=1e-6)
    assert norm_stats_size(SPEC) == stats(3).size


def test_squares_of_huge_float32_elements_are_summed_in_float64():
    huge = np.full(4, 3e38, np.float32)  # each square overflows float32, not float64
    assert sum_of_squares(huge) == pytest.approx(4 * 9e76, rel=1e-6)
    assert not np.isfinite(sum_of_squares(np.array([1.0, np.nan], np.float32)))
    assert not np.isfinite(sum_of_squares(np.array([np.inf], np.float32)))
