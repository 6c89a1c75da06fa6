"""eval.measure (sim/measure.py): Meta-World tasks scored as the field scores them (success at
any step of a 500-step episode), or on the training horizon's last step."""

from __future__ import annotations

import numpy as np
import pytest
from metaworld import policies

from foundation.acting import rollout
from foundation.config import EvalConfig, RunConfig, with_overrides
from sampler.evaluator import eval_envs, evaluate
from sim.measure import EndOnSuccess, eval_env
from sim.tasks import TaskSet

SEED = 1_000_000


class ReachThenLeave:
    """Meta-World's reach expert until the goal is reached, then straight up and away."""

    def __init__(self) -> None:
        self.expert, self.reached = policies.SawyerReachV3Policy(), False

    def act(self, obs: dict[str, np.ndarray], deterministic: bool, task: int = 0) -> np.ndarray:
        achieved, goal = obs["achieved_goal"], obs["desired_goal"]
        self.reached = self.reached or bool(np.linalg.norm(achieved - goal) <= 0.05)  # reach-v3: success
        if self.reached:
            return np.array([0.0, -1.0, 1.0, 0.0], np.float32)
        flat = np.concatenate([obs["observation"], goal])
        return np.clip(self.expert.get_action(flat), -1.0, 1.0).astype(np.float32)


class Still:
    def act(self, obs: dict[str, np.ndarray], deterministic: bool, task: int = 0) -> np.ndarray:
        return np.zeros(4, np.float32)


def _score(measure: str, policy_type: type, episodes: int = 2, task: str = "MetaWorld-reach-v3") -> tuple:
    config = with_overrides(RunConfig(), [f"sim.task={task}", f"eval.measure={measure}"]).validate()
    (env,) = eval_envs(TaskSet.for_run(config), config)
    try:
        lengths = []
        for i in range(episodes):
            episode, _ = rollout(env, policy_type(), seed=SEED + i, rng=np.random.default_rng(0), deterministic=True)
            lengths.append(len(episode))
        result = evaluate(env, policy_type(), EvalConfig(episodes=episodes, seed=SEED, measure=measure))
    finally:
        env.close()
    return result, lengths


def test_the_field_measure_counts_a_success_at_any_step_and_ends_the_episode_there():
    field, lengths = _score("field", ReachThenLeave)
    assert field.success_rate == 1.0
    assert all(10 < n < 100 for n in lengths)  # ended at the first successful step
    training, lengths = _score("training", ReachThenLeave)
    assert training.success_rate == 0.0  # left the goal before the horizon's last step
    assert lengths == [100, 100]


def test_the_field_measure_gives_a_metaworld_task_500_steps():
    result, lengths = _score("field", Still, episodes=1, task="MetaWorld-push-v3")
    assert lengths == [500] and result.success_rate == 0.0
    assert _score("training", Still, episodes=1, task="MetaWorld-push-v3")[1] == [150]


def test_a_fetch_task_keeps_its_own_horizon_and_last_step_under_the_field_measure():
    (env,) = eval_envs(TaskSet.of(["FetchReach-v4"]), RunConfig())
    assert not isinstance(env, EndOnSuccess) and env.spec.max_episode_steps == 50


def test_at_120_hz_a_field_episode_lasts_meta_worlds_500_steps_of_time():
    env = eval_env(TaskSet.of(["MetaWorld-reach-v3"]), 0, control_hz=120.0)
    try:
        episode, _ = rollout(env, Still(), seed=SEED, rng=np.random.default_rng(0), deterministic=True)
    finally:
        env.close()
    assert len(episode) == 750  # past Meta-World's own 500-step limit, which no longer refuses the step


def test_an_unknown_measure_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"eval.measure \('best'\) must be one of"):
        eval_env(TaskSet.of(["MetaWorld-reach-v3"]), 0, measure="best")
    with pytest.raises(Exception, match=r"eval.measure \('best'\) must be one of"):
        with_overrides(RunConfig(), ["eval.measure=best"]).validate()
