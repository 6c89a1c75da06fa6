"""WeightOptimizer (aggregator/optimizer.py): Adam on the gradient groups at the version's
learning rate, the target critics' Polyak update, overflow rollback, lazy expert steps and the
per-group checkpoint state, on flat vectors without validation or step assembly."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from aggregator.optimizer import WeightOptimizer, merged_state, per_group_state
from aggregator.sparse import ExpertSegments
from foundation.config import AggregatorConfig
from foundation.policy import GRADIENT_GROUPS, GROUPS, ModelSpec
from nets.models import SACModel

SPEC = ModelSpec(obs_dim=3, goal_dim=2, act_dim=2, hidden_sizes=(8,))
CONFIG = AggregatorConfig(lr=1e-2, tau=0.25, seed=0)
MOE = ModelSpec(5, 3, 2, (16,), kind="moe", experts=4, top_k=2, tasks=2, router="task")


def start(spec: ModelSpec = SPEC) -> dict[str, np.ndarray]:
    torch.manual_seed(0)
    model = SACModel(spec)
    return {g: model.get_flat(g) for g in GROUPS}


def grads(optimizer: WeightOptimizer, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {g: rng.normal(size=optimizer.sizes[g]).astype(np.float32) for g in GRADIENT_GROUPS}


def norm(g: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(np.sum(v.astype(np.float64) ** 2) for v in g.values())))


def adam(first: np.ndarray, gradients: list[np.ndarray], rates: list[float]) -> np.ndarray:
    param = torch.nn.Parameter(torch.from_numpy(first.copy()))
    optim = torch.optim.Adam([param], lr=rates[0])
    for lr, g in zip(rates, gradients, strict=True):
        optim.param_groups[0]["lr"] = lr
        param.grad = torch.from_numpy(g.copy())
        optim.step()
    return param.detach().numpy()


def test_a_step_is_adam_on_every_gradient_group_then_the_polyak_update():
    first = start()
    optimizer = WeightOptimizer({g: v.copy() for g, v in first.items()}, CONFIG)
    pushes = [grads(optimizer, seed) for seed in range(3)]
    target = first["critic_target"].astype(np.float64)
    for version, g in enumerate(pushes):
        assert optimizer.step(g, norm(g), version)
        target = (1 - CONFIG.tau) * target + CONFIG.tau * optimizer.view("critic")
    for group in GRADIENT_GROUPS:
        expected = adam(first[group], [g[group] for g in pushes], [CONFIG.lr] * 3)
        np.testing.assert_allclose(optimizer.view(group), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(optimizer.view("critic_target"), target, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(optimizer.view("obs_norm"), first["obs_norm"])  # not the optimizer's


def test_each_step_takes_its_versions_learning_rate():
    config = dataclasses.replace(CONFIG, lr_final=1e-3, lr_decay_start=10, lr_decay_end=12)
    first = start()
    optimizer = WeightOptimizer({g: v.copy() for g, v in first.items()}, config)
    pushes = [grads(optimizer, seed) for seed in range(3)]
    for version, g in zip((10, 11, 12), pushes, strict=True):
        optimizer.step(g, norm(g), version)
    rates = [1e-2, 5.5e-3, 1e-3]
    np.testing.assert_allclose(
        optimizer.view("actor"), adam(first["actor"], [g["actor"] for g in pushes], rates), rtol=1e-5, atol=1e-6
    )
    assert optimizer.adam.param_groups[0]["lr"] == pytest.approx(1e-3)


def test_a_step_that_overflows_adam_is_undone_and_the_next_steps_as_usual():
    optimizer = WeightOptimizer(start(), CONFIG)
    g = grads(optimizer, 0)
    optimizer.step(g, norm(g), 0)
    before, moments = {k: v.copy() for k, v in optimizer.views().items()}, optimizer.state()
    huge = {k: np.full(v.size, 3e38, np.float32) for k, v in g.items()}
    assert not optimizer.step(huge, norm(huge), 1)
    for group in GROUPS:
        np.testing.assert_array_equal(optimizer.view(group), before[group])
    for group in GRADIENT_GROUPS:
        assert torch.equal(optimizer.state()[group]["state"][0]["exp_avg_sq"], moments[group]["state"][0]["exp_avg_sq"])
    assert optimizer.step(grads(optimizer, 1), norm(g), 1)
    assert all(np.all(np.isfinite(v)) for v in optimizer.views().values())


def test_the_state_is_one_plain_adam_per_group_and_restores_to_the_same_next_step():
    optimizer = WeightOptimizer(start(), CONFIG)
    for version in range(2):
        g = grads(optimizer, version)
        optimizer.step(g, norm(g), version)
    state = optimizer.state()
    assert merged_state(per_group_state(optimizer.adam.state_dict()))["param_groups"] == [
        dict(group, params=[i]) for i, group in enumerate(optimizer.adam.state_dict()["param_groups"])
    ]
    for group in GRADIENT_GROUPS:
        plain = torch.optim.Adam([torch.nn.Parameter(torch.zeros(optimizer.sizes[group]))], lr=CONFIG.lr)
        plain.load_state_dict(state[group])
    restored = WeightOptimizer(start(), CONFIG)
    restored.set_weights(optimizer.views())
    restored.load_state(state)
    g = grads(optimizer, 9)
    for o in (optimizer, restored):
        o.step(g, norm(g), 2)
    for group in GROUPS:
        np.testing.assert_array_equal(restored.view(group), optimizer.view(group))


def test_lazy_steps_leave_an_idle_expert_alone_and_keep_its_target_copy_following_it():
    first = start(MOE)
    segments = ExpertSegments(SACModel(MOE), GRADIENT_GROUPS)
    layer = segments.layers["critic"][0]
    expert = slice(layer.weight_start, layer.weight_start + layer.weight_size)  # expert 0's weights
    bias = slice(layer.bias_start, layer.bias_start + layer.bias_size)
    never = slice(expert.start + layer.weight_size, expert.stop + layer.weight_size)  # expert 1's
    never_bias = slice(bias.start + layer.bias_size, bias.stop + layer.bias_size)
    lazy = WeightOptimizer({k: v.copy() for k, v in first.items()}, CONFIG, segments)
    dense = WeightOptimizer({k: v.copy() for k, v in first.items()}, CONFIG)
    g = grads(lazy, 0)
    g["critic"][never], g["critic"][never_bias] = 0.0, 0.0  # no row is ever routed to expert 1
    idle = grads(lazy, 1)
    idle["critic"][expert], idle["critic"][bias] = 0.0, 0.0  # none to expert 0 in the second step
    idle["critic"][never], idle["critic"][never_bias] = 0.0, 0.0
    for optimizer in (lazy, dense):
        optimizer.step(g, norm(g), 0)  # the first step is dense: it makes Adam's state
    before = {k: v.copy() for k, v in lazy.views().items()}  # views are live
    for optimizer in (lazy, dense):
        optimizer.step(idle, norm(idle), 1)
    after = lazy.views()
    np.testing.assert_array_equal(after["critic"][expert], before["critic"][expert])
    assert not np.array_equal(dense.view("critic")[expert], before["critic"][expert])  # momentum moves it
    assert not np.array_equal(after["critic"], before["critic"])  # the touched experts moved
    # The target copy of an expert once touched still moves tau toward it; one never touched
    # equals its expert throughout.
    polyak = (1 - CONFIG.tau) * before["critic_target"][expert] + CONFIG.tau * after["critic"][expert]
    np.testing.assert_allclose(after["critic_target"][expert], polyak, rtol=1e-6)
    np.testing.assert_array_equal(after["critic"][never], first["critic"][never])
    np.testing.assert_array_equal(after["critic_target"][never], after["critic"][never])
