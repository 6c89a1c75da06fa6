"""HER 'future' relabeling (sampler/her.py): row counts, goal provenance, rewards."""

from __future__ import annotations

import numpy as np
import pytest

from foundation.acting import Episode, rollout
from sampler.her import moved, relabel_future
from sim.registry import goal_reward, make_env

T, OBS, GOAL, ACT = 7, 4, 3, 2


def reach_reward(achieved: np.ndarray, desired: np.ndarray) -> np.ndarray:
    return -(np.linalg.norm(achieved - desired, axis=-1) > 0.05).astype(np.float32)


def make_episode(length: int = T, seed: int = 0) -> Episode:
    rng = np.random.default_rng(seed)
    steps = np.arange(length, dtype=np.float32)
    return Episode(
        obs=rng.normal(size=(length, OBS)).astype(np.float32),
        # distinct per step (1 apart), so a relabeled goal identifies the step it came from
        achieved_goal=(steps[:, None] + np.array([0.0, 10.0, 20.0], np.float32)).astype(np.float32),
        desired_goal=np.tile(np.array([100.0, 100.0, 100.0], np.float32), (length, 1)),
        action=rng.uniform(-1, 1, (length, ACT)).astype(np.float32),
        next_obs=rng.normal(size=(length, OBS)).astype(np.float32),
        terminated=np.zeros(length, np.float32),
        reward=np.full(length, -1.0, np.float32),
        success=np.zeros(length, bool),
    )


def source_steps(episode: Episode, goals: np.ndarray) -> np.ndarray:
    """For each goal row, the step whose achieved goal it equals (asserting there is exactly one)."""
    matches = np.all(goals[:, None, :] == episode.achieved_goal[None, :, :], axis=-1)
    assert np.all(matches.sum(1) == 1), "a relabeled goal is not an achieved goal of the episode"
    return matches.argmax(1)


@pytest.mark.parametrize("k", [0, 1, 4])
def test_output_has_k_plus_one_copies_with_the_real_goal_first(k):
    episode = make_episode()
    out = relabel_future(episode, k, reach_reward, np.random.default_rng(0))
    assert len(out) == (k + 1) * T
    for name in ("obs", "goal", "action", "reward", "next_obs", "done"):
        assert getattr(out, name).dtype == np.float32, name
    np.testing.assert_array_equal(out.goal[:T], episode.desired_goal)
    for copy in range(k + 1):
        rows = slice(copy * T, (copy + 1) * T)
        np.testing.assert_array_equal(out.obs[rows], episode.obs)
        np.testing.assert_array_equal(out.action[rows], episode.action)
        np.testing.assert_array_equal(out.next_obs[rows], episode.next_obs)
        np.testing.assert_array_equal(out.done[rows], episode.terminated)


def test_k_zero_is_the_plain_episode():
    episode = make_episode()
    episode.terminated[-1] = 1.0
    out = relabel_future(episode, 0, reach_reward, np.random.default_rng(0))
    np.testing.assert_array_equal(out.goal, episode.desired_goal)
    np.testing.assert_array_equal(out.reward, reach_reward(episode.achieved_goal, episode.desired_goal))
    np.testing.assert_array_equal(out.done, episode.terminated)
    assert np.all(out.reward == -1)


def test_relabeled_goals_come_from_the_same_or_a_later_step():
    episode = make_episode(length=20)
    k = 50
    out = relabel_future(episode, k, reach_reward, np.random.default_rng(1))
    steps = np.tile(np.arange(20), k)
    sources = source_steps(episode, out.goal[20:])
    assert np.all(sources >= steps)
    # the last step can only be relabeled with its own achieved goal: always a success
    assert np.all(sources[steps == 19] == 19)
    # 'future' is uniform over [t, T): from step 0 every step is drawn, and not only the first
    from_first = sources[steps == 0]
    assert len(set(from_first)) > 10
    assert 5 < from_first.mean() < 14


def test_rewards_are_the_reward_function_of_achieved_and_goal():
    episode = make_episode()
    k = 4
    out = relabel_future(episode, k, reach_reward, np.random.default_rng(2))
    achieved = np.tile(episode.achieved_goal, (k + 1, 1))
    np.testing.assert_array_equal(out.reward, reach_reward(achieved, out.goal))
    relabeled = slice(T, None)
    same_step = source_steps(episode, out.goal[relabeled]) == np.tile(np.arange(T), k)
    np.testing.assert_array_equal(out.reward[relabeled] == 0, same_step)
    assert same_step.any() and not same_step.all()


def test_same_rng_seed_gives_the_same_relabeling():
    episode = make_episode()
    a = relabel_future(episode, 3, reach_reward, np.random.default_rng(5))
    b = relabel_future(episode, 3, reach_reward, np.random.default_rng(5))
    np.testing.assert_array_equal(a.pack(), b.pack())


def test_real_rows_of_a_fetch_rollout_carry_the_env_rewards():
    env = make_env("FetchReach-v4")
    try:
        rng = np.random.default_rng(0)
        obs, _ = env.reset(seed=3)
        env_rewards = []
        for _ in range(50):
            action = rng.uniform(-1.0, 1.0, env.action_space.shape).astype(np.float32)
            obs, reward, terminated, truncated, _ = env.step(action)
            env_rewards.append(reward)
            if terminated or truncated:
                break
        episode, _ = rollout(env, None, seed=3, rng=np.random.default_rng(0))  # same seed, same actions
        out = relabel_future(episode, 4, lambda a, d: goal_reward(env, a, d), np.random.default_rng(0))
    finally:
        env.close()
    assert len(episode) == len(env_rewards) == 50
    np.testing.assert_array_equal(out.reward[:50], np.asarray(env_rewards, np.float32))
    # relabeling turns failures into successes: the real goal was missed, relabeled ones are hit
    assert out.reward[:50].mean() < out.reward[50:].mean()
    assert np.all(out.reward[50:].reshape(4, 50)[:, -1] == 0)


def still_episode(length: int = T) -> Episode:
    """The achieved goal jitters by 1 mm but never leaves its first 5 cm success region."""
    episode = make_episode(length)
    jitter = np.random.default_rng(1).normal(0.0, 0.001, (length, 3)).astype(np.float32)
    episode.achieved_goal = np.array([0.5, 0.5, 0.4], np.float32) + jitter
    return episode


def test_an_episode_moved_when_its_achieved_goal_left_its_first_success_region():
    assert moved(make_episode(), reach_reward)  # 1 unit per step
    assert not moved(still_episode(), reach_reward)


def test_an_unmoved_episode_gets_k_unmoved_copies_and_a_moved_one_k():
    rng = np.random.default_rng(0)
    assert len(relabel_future(still_episode(), 4, reach_reward, rng, k_unmoved=1)) == 2 * T
    assert len(relabel_future(still_episode(), 4, reach_reward, rng, k_unmoved=0)) == T
    assert len(relabel_future(make_episode(), 4, reach_reward, rng, k_unmoved=1)) == 5 * T
    assert len(relabel_future(still_episode(), 4, reach_reward, rng)) == 5 * T  # -1: her_k for all
    assert len(relabel_future(still_episode(), 2, reach_reward, rng, k_unmoved=6)) == 3 * T  # never more than k


def test_an_untouched_fetchpush_object_is_an_unmoved_episode():
    env = make_env("FetchPush-v4")
    try:  # 50 random actions from this start never reach the object
        episode, _ = rollout(env, None, seed=3, rng=np.random.default_rng(0))
        reward = lambda a, d: goal_reward(env, a, d)  # noqa: E731
        assert not moved(episode, reward)
        pushed = Episode(**{**episode.__dict__, "achieved_goal": episode.achieved_goal.copy()})
        pushed.achieved_goal[-10:] += np.array([0.1, 0.0, 0.0], np.float32)  # the object slid 10 cm
        assert moved(pushed, reward)
    finally:
        env.close()


def _n_step_expected(episode: Episode, goal: np.ndarray, t: int, n: int, gamma: float) -> float:
    """sum_i gamma^i r(ag_{t+i}, goal) over the steps left, written out one step at a time."""
    total = 0.0
    for i in range(n):
        if t + i < len(episode):
            total += gamma**i * float(reach_reward(episode.achieved_goal[t + i], goal))
    return total


def test_n_step_one_is_the_one_step_relabeling():
    episode = make_episode()
    a = relabel_future(episode, 4, reach_reward, np.random.default_rng(3))
    b = relabel_future(episode, 4, reach_reward, np.random.default_rng(3), n_step=1, gamma=0.5)
    for name in ("obs", "goal", "action", "reward", "next_obs", "done"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@pytest.mark.parametrize("n", [2, 3])
def test_n_step_rows_sum_the_next_n_rewards_under_their_goal_and_skip_a_truncated_tail(n):
    episode, k, gamma = make_episode(), 3, 0.9
    # Goals at the achieved goals of steps 2 and 5, so rewards vary within a row's n steps.
    episode.desired_goal[:] = episode.achieved_goal[2]
    one = relabel_future(episode, k, reach_reward, np.random.default_rng(4))
    out = relabel_future(episode, k, reach_reward, np.random.default_rng(4), n_step=n, gamma=gamma)
    kept = T - n + 1  # rows 0..T-n: the later ones would bootstrap past the truncated end
    assert len(out) == (k + 1) * kept
    assert not (out.reward == 0).all() and not (out.reward == out.reward[0]).all()
    for copy in range(k + 1):
        for t in range(kept):
            row = copy * kept + t
            np.testing.assert_array_equal(out.goal[row], one.goal[copy * T + t])  # the same relabeled goal
            np.testing.assert_array_equal(out.obs[row], episode.obs[t])
            np.testing.assert_array_equal(out.action[row], episode.action[t])
            np.testing.assert_array_equal(out.next_obs[row], episode.next_obs[t + n - 1])
            assert out.done[row] == 0.0
            assert out.reward[row] == pytest.approx(_n_step_expected(episode, out.goal[row], t, n, gamma))


def test_n_step_rows_of_a_terminated_episode_keep_the_tail_with_done():
    episode, n, gamma = make_episode(), 3, 0.9
    episode.terminated[-1] = 1.0
    out = relabel_future(episode, 1, reach_reward, np.random.default_rng(5), n_step=n, gamma=gamma)
    assert len(out) == 2 * T
    for copy in range(2):
        for t in range(T):
            row = copy * T + t
            last = min(t + n - 1, T - 1)
            np.testing.assert_array_equal(out.next_obs[row], episode.next_obs[last])
            assert out.done[row] == (1.0 if last == T - 1 else 0.0)
            assert out.reward[row] == pytest.approx(_n_step_expected(episode, out.goal[row], t, n, gamma))


def test_an_episode_shorter_than_n_steps_is_refused_with_the_field_named():
    with pytest.raises(ValueError, match="learner.n_step"):
        relabel_future(make_episode(length=2), 1, reach_reward, np.random.default_rng(0), n_step=3, gamma=0.9)
    with pytest.raises(ValueError, match="n_step"):
        relabel_future(make_episode(), 1, reach_reward, np.random.default_rng(0), n_step=0)
