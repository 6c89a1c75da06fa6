"""sim.reward "shaped": a Meta-World task's own dense reward, stored as collected (no HER)."""

from __future__ import annotations

import numpy as np
import pytest

from foundation.acting import rollout
from foundation.config import RunConfig, with_overrides
from learner.gradients import Hyperparams
from sampler.her import own_reward_rows
from sampler.worker import episode_rows
from sim.registry import make_env

SHAPED = ["sim.reward=shaped", "sim.task=MetaWorld-push-v3", "sampler.her_k=0"]


def _lockstep(name: str, steps: int, seed: int = 3) -> list[tuple[float, float, dict, dict]]:
    """(sparse reward, shaped reward, sparse info, shaped info) of the same random actions in two envs."""
    sparse, shaped = make_env(name), make_env(name, reward="shaped")
    rng, out = np.random.default_rng(0), []
    try:
        sparse.reset(seed=seed)
        shaped.reset(seed=seed)
        for _ in range(steps):
            action = rng.uniform(-1, 1, 4).astype(np.float32)
            _, r_sparse, _, _, i_sparse = sparse.step(action)
            _, r_shaped, _, _, i_shaped = shaped.step(action)
            out.append((r_sparse, r_shaped, i_sparse, i_shaped))
    finally:
        sparse.close()
        shaped.close()
    return out


@pytest.mark.parametrize("name", ["MetaWorld-reach-v3", "MetaWorld-drawer-close-v3"])
def test_a_shaped_env_gives_metaworlds_own_reward_and_flag_on_the_same_episode(name):
    for r_sparse, r_shaped, i_sparse, i_shaped in _lockstep(name, 60):
        assert r_shaped == i_shaped["unscaled_reward"]  # Meta-World's evaluate_state reward
        assert r_sparse in (-1.0, 0.0) and 0.0 <= r_shaped <= 10.0
        assert i_shaped["is_success"] == i_shaped["success"] == i_sparse["is_success"]
    shaped_rewards = {round(r, 6) for _, r, _, _ in _lockstep(name, 60)}
    assert len(shaped_rewards) > 10  # dense: it changes as the hand moves


def test_a_fetch_task_refuses_a_shaped_reward_naming_the_field():
    with pytest.raises(ValueError, match=r"sim.reward \('shaped'\) must be 'sparse' for FetchPush-v4"):
        make_env("FetchPush-v4", reward="shaped")
    with pytest.raises(ValueError, match=r"sim.reward \('dense'\) must be one of"):
        make_env("MetaWorld-push-v3", reward="dense")


@pytest.fixture(scope="module")
def shaped_episode():
    env = make_env("MetaWorld-push-v3", reward="shaped")
    try:
        episode, _ = rollout(env, None, seed=5, rng=np.random.default_rng(1))
    finally:
        env.close()
    return episode


def test_the_sampler_stores_a_shaped_episode_once_with_the_envs_rewards(shaped_episode):
    config = with_overrides(RunConfig(), SHAPED).validate()
    rows = episode_rows(config, None, shaped_episode, np.random.default_rng(0))
    T = len(shaped_episode)
    assert len(rows) == T  # no relabeled copy
    np.testing.assert_array_equal(rows.reward, shaped_episode.reward)
    np.testing.assert_array_equal(rows.goal, shaped_episode.desired_goal)
    assert rows.reward.max() > 0.0  # Meta-World's reward, not the sparse {-1, 0}


def test_n_step_rows_of_a_shaped_episode_sum_its_discounted_rewards(shaped_episode):
    rows = own_reward_rows(shaped_episode, n_step=3, gamma=0.9)
    r = shaped_episode.reward.astype(np.float64)
    assert len(rows) == len(shaped_episode) - 2  # truncated: each row has 3 steps after it
    np.testing.assert_allclose(rows.reward[:5], r[:5] + 0.9 * r[1:6] + 0.81 * r[2:7], rtol=1e-6)
    np.testing.assert_array_equal(rows.next_obs[0], shaped_episode.next_obs[2])


def test_a_sparse_run_still_relabels_with_her():
    env = make_env("MetaWorld-push-v3")
    try:
        episode, _ = rollout(env, None, seed=5, rng=np.random.default_rng(1))
        config = with_overrides(RunConfig(), ["sim.task=MetaWorld-push-v3"]).validate()
        rows = episode_rows(config, env, episode, np.random.default_rng(0))
    finally:
        env.close()
    assert len(rows) == (1 + config.sampler.her_k) * len(episode)
    assert set(np.unique(rows.reward)) <= {-1.0, 0.0}


def test_the_learner_clips_returns_only_for_the_sparse_reward():
    assert Hyperparams.for_run(RunConfig(), act_dim=4).objective.clip_return
    assert not Hyperparams.for_run(with_overrides(RunConfig(), SHAPED), act_dim=4).objective.clip_return


def test_pushs_shaped_reward_is_flat_until_the_hand_nears_the_puck():
    """What docs/presets.md ("Meta-World push") says of the shaped reward: about 0.05 a step while
    the hand is far from the puck, whatever it does, against about 1,000 over an episode of
    Meta-World's scripted expert; so the shaped reward leaves exploration the same search."""
    from sim.metaworld_experts import ExpertPolicy

    env = make_env("MetaWorld-push-v3", reward="shaped")
    rng = np.random.default_rng(0)
    try:
        for seed in (0, 1):
            returns = {}
            for who in ("expert", "random", "still"):
                expert = ExpertPolicy("MetaWorld-push-v3", env.action_space)
                obs, _ = env.reset(seed=seed)
                rewards = []
                for _ in range(150):
                    if who == "expert":
                        action = expert.act(obs)
                    else:
                        action = rng.uniform(-1, 1, 4) if who == "random" else np.zeros(4)
                    obs, reward, _, _, _ = env.step(action)
                    rewards.append(reward)
                returns[who] = (sum(rewards), max(rewards))
            assert returns["expert"][0] > 900 and returns["expert"][1] == pytest.approx(10.0)
            assert returns["random"][0] < 10 and returns["still"][0] < 10
            assert returns["random"][1] < 0.1 and returns["still"][1] < 0.1
    finally:
        env.close()
