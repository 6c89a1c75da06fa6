"""Meta-World v3 tasks through sim/ (sim/metaworld.py): goal envs HER can relabel."""

from __future__ import annotations

import numpy as np
import pytest

from foundation.acting import rollout
from foundation.config import RandomizationConfig
from sampler.her import relabel_future
from sim.registry import get_task, goal_reward, goal_success, make_env
from sim.tasks import TaskSet

TASKS = ("MetaWorld-reach-v3", "MetaWorld-push-v3")


@pytest.mark.parametrize("name", TASKS)
def test_a_metaworld_task_is_a_goal_env_with_the_registered_dims(name):
    spec = get_task(name)
    env = make_env(name, RandomizationConfig())  # domain randomization applies as to Fetch
    try:
        obs, _ = env.reset(seed=1)
        assert obs["observation"].shape == (spec.obs_dim,) and obs["desired_goal"].shape == (spec.goal_dim,)
        assert env.action_space.shape == (spec.act_dim,)
        episode, _ = rollout(env, None, seed=1, rng=np.random.default_rng(0))
        assert len(episode) == spec.max_episode_steps  # a fixed horizon, no termination
        out = relabel_future(episode, 4, lambda a, d: goal_reward(env, a, d), np.random.default_rng(0))
        assert np.all(np.isin(out.reward, [-1.0, 0.0]))
        assert np.all(out.reward[len(episode) :].reshape(4, -1)[:, -1] == 0)  # a goal reached by then
    finally:
        env.close()


def test_moving_the_hand_to_the_goal_succeeds_in_reach():
    env = make_env("MetaWorld-reach-v3")
    try:
        obs, _ = env.reset(seed=5)
        assert not goal_success(env, obs["achieved_goal"][None], obs["desired_goal"][None])[0]
        for _ in range(100):  # a proportional controller on the hand
            delta = np.clip((obs["desired_goal"] - obs["achieved_goal"]) * 20.0, -1.0, 1.0)
            obs, reward, terminated, truncated, info = env.step(np.r_[delta, 0.0].astype(np.float32))
            if truncated:
                break
        assert info["is_success"] == 1.0 and reward == 0.0 and not terminated
    finally:
        env.close()


def test_fetch_and_metaworld_tasks_train_together_at_one_padded_width():
    tasks = TaskSet.of(("FetchReach-v4", "FetchPush-v4", *TASKS))
    assert tasks.obs_dim == 36 + 4
    env = tasks.make_env(3)
    try:
        obs, _ = env.reset(seed=0)
        assert obs["observation"].shape == (40,) and obs["observation"][36:].tolist() == [0, 0, 0, 1]
    finally:
        env.close()


def test_another_control_rate_is_refused_for_a_metaworld_task():
    with pytest.raises(ValueError, match="re-times Fetch tasks only"):
        make_env("MetaWorld-reach-v3", control_hz=120.0)
