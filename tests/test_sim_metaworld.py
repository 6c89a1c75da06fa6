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


def test_a_metaworld_task_slower_than_its_own_80_hz_is_refused():
    with pytest.raises(ValueError, match="below MetaWorld-reach-v3's own 80 Hz"):
        make_env("MetaWorld-reach-v3", control_hz=25.0)


def _held(hz: float, seconds: float, action) -> tuple[list[np.ndarray], object]:
    """The observations of `action` held for `seconds` of simulated time at `hz`, reset first."""
    env = make_env("MetaWorld-reach-v3", control_hz=hz)
    obs, _ = env.reset(seed=3)
    seen = [obs["observation"].copy()]
    for _ in range(round(seconds * hz)):
        obs, *_ = env.step(np.asarray(action, np.float32))
        seen.append(obs["observation"].copy())
    return seen, env


def test_a_metaworld_task_at_120_hz_keeps_its_seconds_hand_speed_and_previous_frame_age():
    native, env80 = _held(80.0, 0.125, [0.5, 0.0, -1.0, 0.0])
    fast, env120 = _held(120.0, 0.125, [0.5, 0.0, -1.0, 0.0])
    try:
        inner = env120.unwrapped._env
        assert inner.frame_skip == 3 and inner.model.opt.timestep == pytest.approx(1 / 360)
        assert env80.unwrapped._env.frame_skip == 5  # 80 Hz is its own rate: untouched
        assert env120.spec.max_episode_steps == 150  # 100 decisions of 12.5 ms = 150 of 8.33 ms
    finally:
        env80.close()
        env120.close()
    # The same episode start at both rates, and the hand as far along after the same seconds.
    np.testing.assert_allclose(native[0], fast[0], atol=1e-9)
    moved80, moved120 = native[-1][:3] - native[0][:3], fast[-1][:3] - fast[0][:3]
    assert np.linalg.norm(moved80) > 0.01
    np.testing.assert_allclose(moved120, moved80, atol=0.1 * np.linalg.norm(moved80))
    # The previous frame is 1/80 s old: at 120 Hz the mean of the frames 1 and 2 decisions ago
    # (the reset frame stands in for frames before it), and the difference the policy reads from
    # it matches 80 Hz's for the same motion.
    frames = [o[:18] for o in fast]
    for t in range(1, len(fast)):
        expected = 0.5 * (frames[t - 1] + frames[max(t - 2, 0)])
        np.testing.assert_allclose(fast[t][18:36], expected, atol=1e-12)
    step80, step120 = native[-1][:3] - native[-1][18:21], fast[-1][:3] - fast[-1][18:21]
    np.testing.assert_allclose(step120, step80, atol=0.15 * np.linalg.norm(step80))


def test_a_metaworld_task_at_its_own_rate_draws_what_it_drew():
    plain, at80 = make_env("MetaWorld-push-v3"), make_env("MetaWorld-push-v3", control_hz=80.0)
    try:
        a, _ = plain.reset(seed=1)
        b, _ = at80.reset(seed=1)
        rng = np.random.default_rng(0)
        for _ in range(20):
            action = rng.uniform(-1, 1, 4).astype(np.float32)
            np.testing.assert_array_equal(a["observation"], b["observation"])
            a, *_ = plain.step(action)
            b, *_ = at80.step(action)
    finally:
        plain.close()
        at80.close()
