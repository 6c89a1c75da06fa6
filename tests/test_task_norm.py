"""Per-task input statistics (model.task_norm): each task of a multi-task run is standardized
with its own mean and std, picked by the task one-hot its input carries."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from aggregator.core import AggregatorCore, GradientError
from foundation.config import AggregatorConfig
from foundation.policy import ModelSpec, NumpyActor
from nets.models import GRADIENT_GROUPS, Normalizer, SACModel, norm_from_stats, norm_stats

OBS, GOAL, TASKS = 6, 3, 2  # obs = 4 own columns ++ a 2-wide task one-hot
SPEC = ModelSpec(OBS, GOAL, 2, (16,), tasks=TASKS, task_norm=True)
SHARED = ModelSpec(OBS, GOAL, 2, (16,), tasks=TASKS)


def _rows(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows of two tasks whose coordinates differ as Fetch's and Meta-World's do: task 0 near
    1.3 with a 0.1 spread, task 1 near 0 with a 0.5 spread; the one-hot at columns 4:6."""
    rng = np.random.default_rng(seed)
    task = rng.integers(0, TASKS, n)
    centre, spread = np.array([1.3, 0.0])[task, None], np.array([0.1, 0.5])[task, None]
    rows = centre + spread * rng.standard_normal((n, SPEC.input_dim))
    rows[:, OBS - TASKS : OBS] = np.eye(TASKS)[task]
    return rows.astype(np.float32), task


def _standardized(spec: ModelSpec, rows: np.ndarray, task: np.ndarray) -> np.ndarray:
    norm = Normalizer.for_spec(spec)
    stats = norm_stats(rows, task, spec.norm_rows)
    norm.load_flat(norm_from_stats(stats, spec.input_dim, spec.norm_rows, spec.one_hot))
    with torch.no_grad():
        return norm(torch.from_numpy(rows)).numpy()


def test_each_task_is_standardized_with_its_own_statistics():
    rows, task = _rows(4000)
    own = np.r_[0:4, 6:9]  # the columns that are not the one-hot
    x = _standardized(SPEC, rows, task)
    for t in range(TASKS):
        np.testing.assert_allclose(x[task == t][:, own].mean(0), 0.0, atol=0.1)
        np.testing.assert_allclose(x[task == t][:, own].std(0), 1.0, atol=0.1)
    np.testing.assert_array_equal(x[:, 4:6], rows[:, 4:6])  # the one-hot passes unchanged
    # One shared set squashes task 0's range to a fraction of a unit: what per-task statistics fix.
    shared = _standardized(SHARED, rows, task)
    assert shared[task == 0][:, own].std(0).max() < 0.3


def test_a_task_not_seen_yet_keeps_the_identity():
    rows, task = _rows(100)
    stats = norm_stats(rows[task == 1], task[task == 1], TASKS)
    mean, std = SPEC.split_norm(norm_from_stats(stats, SPEC.input_dim, TASKS, SPEC.one_hot))
    np.testing.assert_array_equal(mean[0], 0.0)
    np.testing.assert_array_equal(std[0], 1.0)
    assert np.abs(std[1][:4] - 0.5).max() < 0.15


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_the_numpy_actor_picks_the_same_rows_as_the_torch_actor(kind):
    spec = ModelSpec(OBS, GOAL, 2, (16,), kind=kind, experts=4, tasks=TASKS, task_norm=True)
    torch.manual_seed(0)
    model = SACModel(spec)
    rows, task = _rows(256)
    model.set_flat("obs_norm", norm_from_stats(norm_stats(rows, task, TASKS), spec.input_dim, TASKS, spec.one_hot))
    actor = NumpyActor(spec, model.get_flat("actor"), model.get_flat("obs_norm"))
    for t in range(TASKS):
        x = rows[task == t]
        with torch.no_grad():
            mean, _ = model.actor(torch.from_numpy(x), torch.full((len(x),), t))
        np.testing.assert_allclose(actor.forward(x, t)[0], mean.numpy(), rtol=1e-4, atol=1e-5)


def test_the_aggregator_keeps_per_task_totals_and_names_a_wrong_shape():
    core = AggregatorCore(SPEC, AggregatorConfig(seed=0), 1, 1)
    rng = np.random.default_rng(0)
    rows, task = _rows(256)
    grads = {g: rng.standard_normal(core.sizes[g]).astype(np.float32) * 0.01 for g in GRADIENT_GROUPS}
    core.submit(core.version, grads, norm_stats(rows, task, TASKS), batch_size=256)
    mean, _ = SPEC.split_norm(core.weights(("obs_norm",))["obs_norm"])
    assert mean[0][0] == pytest.approx(1.3, abs=0.05) and mean[1][0] == pytest.approx(0.0, abs=0.1)
    with pytest.raises(GradientError, match=r"tensors\[norm_stats\]\.shape"):
        core.check_norm_stats(norm_stats(rows), batch_size=256)  # one shared block: the old layout
    one_task = norm_stats(rows[task == 1], task[task == 1], TASKS)  # a batch without task 0 is fine
    core.check_norm_stats(one_task, batch_size=256)


def test_specs_written_before_per_task_statistics_keep_one_shared_set():
    old = json.loads(SPEC.to_json())
    del old["task_norm"]
    spec = ModelSpec.from_json(json.dumps(old))
    assert spec.norm_rows == 1 and spec == SHARED
    assert SPEC.norm_rows == TASKS and ModelSpec(OBS, GOAL, 2, task_norm=True).norm_rows == 1  # one task: one set
