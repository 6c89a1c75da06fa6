"""aggregator.expert_adam "lazy" (aggregator/sparse.py): Adam and the target critics' average
skip the experts a version's gradient leaves untouched, and a task-routed run is unchanged."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from aggregator.core import AggregatorCore
from aggregator.sparse import ExpertSegments
from foundation.config import AggregatorConfig, ConfigError, RunConfig, with_overrides
from foundation.policy import GRADIENT_GROUPS, GROUPS, ModelSpec
from learner.algorithm import Batch, Objective
from learner.gradients import Hyperparams, compute_gradients
from nets.models import SACModel

TASKS = 3
SPEC = ModelSpec(5, 3, 2, (16, 16), kind="moe", experts=8, top_k=2, tasks=TASKS, router="task", task_heads=True)
LAZY = AggregatorConfig(lr=1e-2, tau=0.25, seed=0)
DENSE = dataclasses.replace(LAZY, expert_adam="dense")
# Routing held fixed, as model.gate_grad false with a settled balance: the task losses leave the
# gates alone and no balancing loss moves them, so each task keeps its experts every version.
HP = Hyperparams(Objective(gamma=0.95, target_entropy=-2.0), balance_coef=0.0)


def _batch(seed: int, tasks: list[int], rows: int = 24) -> Batch:
    rng = np.random.default_rng(seed)
    obs, goal = rng.normal(size=(rows, SPEC.obs_dim)), rng.normal(size=(rows, SPEC.goal_dim))
    action = rng.uniform(-1, 1, (rows, SPEC.act_dim))
    reward, done = -(rng.random(rows) < 0.5).astype(np.float32), np.zeros(rows, np.float32)
    task = np.array([tasks[i % len(tasks)] for i in range(rows)])
    return Batch.from_numpy(obs, goal, action, reward, rng.normal(size=obs.shape), done, task=task)


def _gradient(core: AggregatorCore, seed: int, tasks: list[int]) -> dict[str, np.ndarray]:
    """A learner's real gradient at the core's weights, on a batch of `tasks`' rows."""
    model = SACModel(SPEC).train_gates(False)
    for group, flat in core.weights().items():
        model.set_flat(group, flat)
    torch.manual_seed(seed)  # the actor's sampled actions
    return compute_gradients(model, _batch(seed, tasks), HP).grads


def _core(config: AggregatorConfig) -> AggregatorCore:
    return AggregatorCore(SPEC, config, grads_per_step=1, max_staleness=1)


def _stats() -> np.ndarray:
    return np.concatenate([[8.0], np.zeros(2 * SPEC.input_dim)] * SPEC.norm_rows).astype(np.float32)


def test_a_task_routed_run_whose_tasks_keep_their_experts_is_exactly_the_dense_one():
    lazy, dense = _core(LAZY), _core(DENSE)
    for version in range(6):
        g = _gradient(lazy, version, list(range(TASKS)))
        lazy.submit(version, g, _stats(), batch_size=24)
        dense.submit(version, {k: v.copy() for k, v in g.items()}, _stats(), batch_size=24)
    assert lazy.version == dense.version == 6
    for group in GROUPS:
        np.testing.assert_array_equal(lazy.weights()[group], dense.weights()[group], err_msg=group)
    # ... while most experts were skipped: 3 tasks x top-2 of 8 leave at least 2 untouched per layer.
    segments = ExpertSegments(SACModel(SPEC), GRADIENT_GROUPS)
    hits = segments.hits("critic", _gradient(lazy, 99, list(range(TASKS)))["critic"])
    assert all(2 <= int((~hit).sum()) for hit in hits), hits


def test_an_expert_left_untouched_keeps_its_weights_and_moments_where_dense_adam_drifts():
    lazy, dense = _core(LAZY), _core(DENSE)
    for core in (lazy, dense):  # every task, then task 0 alone: the others' experts go untouched
        core.submit(0, _gradient(core, 0, list(range(TASKS))), _stats(), batch_size=24)
    before = {name: core.weights() for name, core in (("lazy", lazy), ("dense", dense))}
    g = _gradient(lazy, 1, [0])
    lazy.submit(1, g, _stats(), batch_size=24)
    dense.submit(1, {k: v.copy() for k, v in g.items()}, _stats(), batch_size=24)
    segments = ExpertSegments(SACModel(SPEC), GRADIENT_GROUPS)
    idle = [~hit for hit in segments.hits("actor", g["actor"])]
    assert any(mask.any() for mask in idle)
    idle_ranges = segments.ranges("actor", idle)
    always = segments.always["actor"]
    moved_lazy = moved_dense = 0
    for a, b in idle_ranges:
        if any(a < y and x < b for x, y in always):
            continue  # ranges() adds the always-stepped parameters: compare experts only
        moved_lazy += int(np.any(lazy.weights()["actor"][a:b] != before["lazy"]["actor"][a:b]))
        moved_dense += int(np.any(dense.weights()["actor"][a:b] != before["dense"]["actor"][a:b]))
    assert moved_lazy == 0 and moved_dense > 0, (moved_lazy, moved_dense)


@pytest.mark.parametrize("tasks", [[1], [0, 2], [0, 1, 2]])
def test_the_ranges_cover_every_nonzero_gradient_element_and_skip_untouched_experts(tasks):
    # An expert is judged by its bias gradient: on real gradients, every expert with a nonzero
    # weight gradient has a nonzero bias gradient, so nothing nonzero is ever skipped.
    model = SACModel(SPEC)
    segments = ExpertSegments(model, GRADIENT_GROUPS)
    for seed in range(3):
        g = compute_gradients(model, _batch(seed, tasks), HP).grads
        for group in GRADIENT_GROUPS:
            covered = np.zeros(g[group].size, bool)
            for a, b in segments.ranges(group, segments.hits(group, g[group])):
                covered[a:b] = True
            assert not np.any(g[group][~covered]), group  # nothing nonzero is skipped
            if len(tasks) < TASKS and group != "log_alpha":
                assert covered.sum() < g[group].size, group  # and something is


def test_a_restored_lazy_core_continues_as_the_original():
    first = _core(LAZY)
    for version in range(3):
        first.submit(version, _gradient(first, version, [0, 2]), _stats(), batch_size=24)
    restored = _core(LAZY)
    restored.load_state(first.state())
    for version in range(3, 6):
        g = _gradient(first, version, [0, 1, 2])
        first.submit(version, g, _stats(), batch_size=24)
        restored.submit(version, {k: v.copy() for k, v in g.items()}, _stats(), batch_size=24)
    for group in GROUPS:
        np.testing.assert_array_equal(first.weights()[group], restored.weights()[group], err_msg=group)


def test_expert_adam_is_checked_at_launch():
    with pytest.raises(ConfigError, match="aggregator.expert_adam"):
        with_overrides(RunConfig(), ['aggregator.expert_adam="sparse"']).validate()


def test_a_dense_model_takes_the_dense_step():
    core = AggregatorCore(ModelSpec(5, 3, 2, (16,)), LAZY, grads_per_step=1, max_staleness=1)
    assert core.optimizer.segments is None
