"""The sampler's Policy: epsilon-random exploration only when acting stochastically."""

from __future__ import annotations

import numpy as np
import pytest

from foundation.acting import Policy, WeightsSnapshot
from foundation.policy import ModelSpec

SPEC = ModelSpec(obs_dim=3, goal_dim=2, act_dim=4, hidden_sizes=(8,))


def _snapshot() -> WeightsSnapshot:
    # Zero weights and a log_std bias of -5: the actor's own actions are tanh(N(0, 0.007)), ~0.
    obs_norm = np.concatenate([np.zeros(SPEC.input_dim), np.ones(SPEC.input_dim)]).astype(np.float32)
    actor = np.zeros(SPEC.actor_size(), np.float32)
    actor[-SPEC.act_dim :] = -5.0  # the output layer's bias ends with log_std
    return WeightsSnapshot(1, {"actor": actor, "obs_norm": obs_norm}, SPEC)


def _policy(random_action_prob: float, random_keep_dims: int = 0) -> Policy:
    policy = Policy(seed=0, random_action_prob=random_action_prob, random_keep_dims=random_keep_dims)
    assert policy.refresh(_snapshot())
    return policy


OBS = {"observation": np.zeros(3, np.float32), "desired_goal": np.zeros(2, np.float32)}


def test_deterministic_actions_never_take_the_random_branch():
    policy = _policy(1.0)
    for _ in range(20):
        np.testing.assert_array_equal(policy.act(OBS, deterministic=True), np.zeros(4, np.float32))


def test_random_action_prob_sets_the_share_of_uniform_actions():
    # The actor's own actions stay within 0.05 of 0; a uniform action lies beyond 0.05 95% of the time.
    def far_share(prob: float) -> float:
        policy = _policy(prob)
        actions = np.array([policy.act(OBS, deterministic=False) for _ in range(2000)])
        return float(np.mean(np.abs(actions[:, 0]) > 0.05))

    assert far_share(0.0) == 0.0
    assert 0.95 * 0.3 - 0.04 < far_share(0.3) < 0.95 * 0.3 + 0.04
    assert far_share(1.0) > 0.92


def test_the_exploring_policy_takes_the_samplers_exploration_settings():
    from foundation.config import RunConfig, with_overrides

    overrides = ["sampler.random_action_prob=0.5", "sampler.random_keep_dims=1", "sampler.random_action_repeat=3"]
    policy = Policy.exploring(with_overrides(RunConfig(), overrides), seed=0)
    assert (policy.random_action_prob, policy.random_keep_dims, policy.random_action_repeat) == (0.5, 1, 3)


def test_random_keep_dims_leaves_the_gripper_to_the_policy_on_random_steps():
    # Every step random (prob 1): the arm's three dims are uniform, the last (the gripper) the
    # actor's own (~0), so a random step cannot open a grasp the policy holds.
    policy = _policy(1.0, random_keep_dims=1)
    actions = np.array([policy.act(OBS, deterministic=False) for _ in range(2000)])
    assert np.mean(np.abs(actions[:, :3]) > 0.05) > 0.9
    assert np.abs(actions[:, 3]).max() < 0.05
    assert np.mean(np.abs(np.array([_policy(1.0).act(OBS, False) for _ in range(200)])[:, 3]) > 0.05) > 0.9
    np.testing.assert_array_equal(policy.act(OBS, deterministic=True), np.zeros(4, np.float32))
    # Off (0), the same seed draws the same actions as a Policy built without the option.
    base = Policy(seed=0, random_action_prob=0.3)
    assert base.refresh(_snapshot())
    off = _policy(0.3, random_keep_dims=0)
    np.testing.assert_array_equal(
        [base.act(OBS, deterministic=False) for _ in range(50)], [off.act(OBS, deterministic=False) for _ in range(50)]
    )


def test_random_keep_dims_beyond_the_action_is_refused_naming_the_field():
    from foundation.config import ConfigError, RunConfig, with_overrides

    policy = Policy.exploring(with_overrides(RunConfig(), ["sampler.random_keep_dims=5"]), seed=0)
    with pytest.raises(
        ConfigError, match=r"sampler.random_keep_dims \(5\) must be <= the task's action dimensions \(4\)"
    ):
        policy.refresh(_snapshot())
    with pytest.raises(ConfigError, match="random_keep_dims"):
        with_overrides(RunConfig(), ["sampler.random_keep_dims=-1"]).validate()


def _stretches(random: np.ndarray) -> list[int]:
    """Lengths of the runs of True in `random`."""
    lengths, run = [], 0
    for flag in random:
        if flag:
            run += 1
        elif run:
            lengths.append(run)
            run = 0
    return [*lengths, run] if run else lengths


def test_random_action_repeat_holds_each_uniform_action_and_keeps_the_share_of_random_steps():
    # The actor's own actions stay within 0.05 of 0: a far action is a random one.
    policy = Policy(seed=0, random_action_prob=0.3, random_action_repeat=10)
    assert policy.refresh(_snapshot())
    policy.new_episode()
    actions = np.array([policy.act(OBS, deterministic=False) for _ in range(20000)])
    random = np.abs(actions).max(axis=1) > 0.05
    assert 0.3 - 0.04 < random.mean() < 0.3 + 0.04  # still the share random_action_prob names
    lengths = _stretches(random)
    assert np.median(lengths) == 10 and all(n % 10 == 0 for n in lengths)  # stretches of 10 (some abut)
    # within a stretch, one action throughout
    start = int(np.argmax(random))
    assert np.unique(actions[start : start + 10], axis=0).shape[0] == 1
    assert not np.array_equal(actions[start], actions[start + 10]) or not random[start + 10]
    np.testing.assert_array_equal(policy.act(OBS, deterministic=True), np.zeros(4, np.float32))


def test_random_action_repeat_keeps_the_gripper_to_the_policy_and_ends_with_the_episode():
    policy = Policy(seed=0, random_action_prob=1.0, random_keep_dims=1, random_action_repeat=5)
    assert policy.refresh(_snapshot())
    policy.new_episode()
    first = [policy.act(OBS, deterministic=False) for _ in range(3)]
    assert np.unique(np.array(first)[:, :3], axis=0).shape[0] == 1  # one held arm action
    assert np.abs(np.array(first)[:, 3]).max() < 0.05  # the gripper: the actor's own, each step
    policy.new_episode()  # the stretch ends with its episode: a new one draws a new action
    assert not np.array_equal(policy.act(OBS, deterministic=False)[:3], first[0][:3])


def test_random_action_repeat_1_draws_what_a_policy_without_it_draws():
    base = Policy(seed=0, random_action_prob=0.3)
    one = Policy(seed=0, random_action_prob=0.3, random_action_repeat=1)
    assert base.refresh(_snapshot()) and one.refresh(_snapshot())
    without = [base.act(OBS, deterministic=False) for _ in range(200)]
    np.testing.assert_array_equal(without, [one.act(OBS, deterministic=False) for _ in range(200)])


def test_random_action_repeat_comes_from_the_config_and_below_1_is_refused_naming_the_field():
    from foundation.config import RunConfig, with_overrides

    config = with_overrides(RunConfig(), ["sampler.random_action_prob=0.3", "sampler.random_action_repeat=8"])
    assert Policy.exploring(config, seed=0).random_action_repeat == 8
    with pytest.raises(ValueError, match="random_action_repeat"):
        with_overrides(RunConfig(), ["sampler.random_action_repeat=0"]).validate()


class _ThreeStepEnv:
    """A goal env whose episodes last 3 steps (rollout's contract: reset, step, dict observations)."""

    def __init__(self) -> None:
        self.t = 0

    def reset(self, seed=None):
        self.t = 0
        return dict(OBS, achieved_goal=np.zeros(2, np.float32)), {}

    def step(self, action):
        self.t += 1
        return dict(OBS, achieved_goal=np.zeros(2, np.float32)), -1.0, False, self.t == 3, {}


def test_rollout_starts_each_episode_without_the_last_ones_random_stretch():
    from foundation.acting import rollout

    policy = Policy(seed=0, random_action_prob=1.0, random_action_repeat=100)
    assert policy.refresh(_snapshot())
    rng = np.random.default_rng(0)
    first, _ = rollout(_ThreeStepEnv(), policy, seed=0, rng=rng)
    second, _ = rollout(_ThreeStepEnv(), policy, seed=1, rng=rng)
    assert np.unique(first.action, axis=0).shape[0] == 1 and np.unique(second.action, axis=0).shape[0] == 1
    assert not np.array_equal(first.action[0], second.action[0])  # a new stretch, not the old one's 97 steps
