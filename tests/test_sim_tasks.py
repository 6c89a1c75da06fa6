"""A run's tasks (sim/tasks.py): one padded width, a task one-hot, sampler assignment."""

from __future__ import annotations

import numpy as np
import pytest

from foundation.config import ConfigError, RunConfig, with_overrides
from sim.registry import get_task
from sim.tasks import TaskSet

REACH_PUSH = ("FetchReach-v4", "FetchPush-v4")


def test_one_task_is_the_task_itself():
    tasks = TaskSet.for_run(RunConfig())
    assert not tasks.multi and tasks.names == ("FetchReach-v4",)
    assert tasks.schema() == get_task("FetchReach-v4").schema()
    obs = np.arange(10, dtype=np.float32)
    assert tasks.pad(obs, 0) is obs


def test_several_tasks_share_the_widest_observation_and_a_one_hot():
    tasks = TaskSet.for_run(with_overrides(RunConfig(), [f"sim.tasks={list(REACH_PUSH)}".replace("'", '"')]))
    assert tasks.names == REACH_PUSH and tasks.obs_dim == 25 + 2 and tasks.schema().obs_dim == 27
    padded = tasks.pad(np.ones((3, 10), np.float32), 0)
    assert padded.shape == (3, 27)
    np.testing.assert_array_equal(padded[:, :10], 1.0)
    np.testing.assert_array_equal(padded[:, 10:25], 0.0)
    np.testing.assert_array_equal(padded[:, 25:], [[1.0, 0.0]] * 3)
    np.testing.assert_array_equal(tasks.pad(np.ones(25, np.float32), 1)[25:], [0.0, 1.0])
    assert tasks.index(get_task("FetchPush-v4").task_id) == 1
    assert tasks.indices(np.array([1, 0, 1])).tolist() == [1, 0, 1]
    with pytest.raises(KeyError, match="task id 3 is not one of this run's tasks"):
        tasks.indices(np.array([0, 3]))
    assert TaskSet.parse(tasks.label) == tasks


def test_the_padded_env_observes_the_runs_width():
    tasks = TaskSet.of(REACH_PUSH)
    env = tasks.make_env(0)
    try:
        obs, _ = env.reset(seed=0)
        assert obs["observation"].shape == (27,) == env.observation_space["observation"].shape
        np.testing.assert_array_equal(obs["observation"][10:], [0.0] * 15 + [1.0, 0.0])
        obs, *_ = env.step(env.action_space.sample())
        assert obs["observation"][25:].tolist() == [1.0, 0.0]
    finally:
        env.close()


def test_tasks_are_dealt_to_samplers_round_robin():
    tasks = TaskSet.of(("FetchReach-v4", "FetchPush-v4", "FetchPickAndPlace-v4"))
    assert tasks.assigned(0, 1) == [0, 1, 2]  # one sampler takes every task in turn
    assert [tasks.assigned(i, 3) for i in range(3)] == [[0], [1], [2]]
    assert [tasks.assigned(i, 2) for i in range(2)] == [[0, 2], [1]]
    assert [tasks.assigned(i, 5) for i in range(5)] == [[0], [1], [2], [0], [1]]


def test_a_bad_task_list_is_a_clear_error():
    with pytest.raises(ConfigError, match="lists a task twice"):
        TaskSet.of(("FetchPush-v4", "FetchPush-v4"))
    with pytest.raises(ValueError, match="unknown task 'FetchFly-v0'"):
        TaskSet.of(("FetchPush-v4", "FetchFly-v0"))
