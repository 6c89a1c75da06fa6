"""evaluate() on the real FetchReach env: scripted policies with known outcomes, early stop, seeds."""

from __future__ import annotations

import numpy as np
import pytest

from foundation.acting import Policy, WeightsSnapshot, rollout
from foundation.checkpoint import CheckpointError
from foundation.config import EvalConfig
from foundation.policy import ModelSpec
from sampler.evaluator import EpisodeLog, NearTarget, evaluate, next_interval_sec, score_checkpoint
from sim.registry import get_task, make_env

SEED = 1_000_000


class Reacher:
    """Moves the gripper toward the goal: action = clip(gain * (goal - gripper)), gripper 0."""

    def __init__(self, gain: float) -> None:
        self.gain = gain
        self.modes: list[bool] = []
        self.first_goals: list[np.ndarray] = []
        self._last_goal: np.ndarray | None = None

    def act(self, obs: dict[str, np.ndarray], deterministic: bool, task: int = 0) -> np.ndarray:
        self.modes.append(deterministic)
        goal = obs["desired_goal"]
        if self._last_goal is None or not np.array_equal(goal, self._last_goal):
            self.first_goals.append(goal.copy())
            self._last_goal = goal.copy()
        action = np.zeros(4, np.float32)
        action[:3] = np.clip((goal - obs["observation"][:3]) * self.gain, -1.0, 1.0)
        return action


@pytest.fixture(scope="module")
def env():
    env = make_env("FetchReach-v4")
    yield env
    env.close()


def test_a_reaching_policy_scores_full_success_with_deterministic_actions(env):
    policy = Reacher(gain=10.0)
    result = evaluate(env, policy, EvalConfig(episodes=5, seed=SEED))
    assert (result.success_rate, result.episodes) == (1.0, 5)
    assert -10.0 < result.mean_return <= 0.0  # a few steps of -1 before the goal is reached
    assert len(policy.modes) == 5 * 50 and all(policy.modes)


def test_a_policy_that_would_reach_the_target_is_never_cut_short(env):
    result = evaluate(env, Reacher(gain=10.0), EvalConfig(episodes=10, seed=SEED), stop_below=0.9)
    assert (result.success_rate, result.episodes) == (1.0, 10)


def test_a_hopeless_policy_stops_as_soon_as_the_target_is_out_of_reach(env):
    config = EvalConfig(episodes=10, seed=SEED)
    still = Reacher(gain=0.0)
    # Per-episode outcomes on the same seeds, to know where the early stop must happen.
    outcomes = [
        rollout(env, still, seed=SEED + i, rng=np.random.default_rng(0), deterministic=True)[1]
        for i in range(config.episodes)
    ]
    assert sum(outcomes) < 9
    failures = np.cumsum(~np.array(outcomes))
    stop_after = int(np.argmax(failures > 1)) + 1  # 0.9 of 10 episodes allows one failure
    result = evaluate(env, Reacher(gain=0.0), config, stop_below=0.9)
    assert result.episodes == stop_after < config.episodes
    assert result.success_rate == pytest.approx(np.mean(outcomes[:stop_after]))
    full = evaluate(env, Reacher(gain=0.0), config)
    assert full.episodes == 10 and full.success_rate == pytest.approx(np.mean(outcomes))


def test_identical_seeds_give_identical_results_and_other_seeds_other_goals(env):
    config = EvalConfig(episodes=6, seed=SEED)
    a, b, c = Reacher(gain=0.5), Reacher(gain=0.5), Reacher(gain=0.5)
    first = evaluate(env, a, config)
    evaluate(env, Reacher(gain=0.0), EvalConfig(episodes=2, seed=7))  # other work on the env in between
    second = evaluate(env, b, config)
    assert first == second
    assert len(a.first_goals) == 6
    np.testing.assert_array_equal(np.array(a.first_goals), np.array(b.first_goals))
    evaluate(env, c, EvalConfig(episodes=6, seed=SEED + 100))
    assert not np.allclose(np.array(a.first_goals), np.array(c.first_goals))


def _snapshot(version: int, seed: int) -> WeightsSnapshot:
    task = get_task("FetchReach-v4")
    spec = ModelSpec(task.obs_dim, task.goal_dim, task.act_dim, (16,))
    rng = np.random.default_rng(seed)
    obs_norm = np.concatenate([np.zeros(spec.input_dim), np.ones(spec.input_dim)]).astype(np.float32)
    actor = rng.normal(0, 0.3, spec.actor_size()).astype(np.float32)
    return WeightsSnapshot(version=version, tensors={"actor": actor, "obs_norm": obs_norm}, spec=spec)


def test_the_sampler_policy_evaluates_deterministically_from_a_weights_snapshot(env):
    policy = Policy(seed=0)
    assert policy.refresh(None) is False
    assert policy.refresh(_snapshot(3, seed=0)) is True
    assert policy.version == 3
    assert policy.refresh(_snapshot(3, seed=1)) is False  # same version: kept
    config = EvalConfig(episodes=3, seed=SEED)
    first = evaluate(env, policy, config)
    assert first.episodes == 3 and 0.0 <= first.success_rate <= 1.0
    assert evaluate(env, policy, config) == first  # deterministic actions: no sampling noise
    obs, _ = env.reset(seed=SEED)
    action = policy.act(obs, deterministic=True)
    assert action.shape == (4,) and np.all(np.abs(action) < 1.0)
    np.testing.assert_array_equal(action, policy.act(obs, deterministic=True))
    assert not np.array_equal(policy.act(obs, deterministic=False), policy.act(obs, deterministic=False))


def test_a_full_score_continues_the_curve_episodes_on_the_same_seeds(env):
    config = EvalConfig(episodes=6, curve_episodes=2, seed=SEED)
    done = EpisodeLog()
    policy = Reacher(gain=10.0)
    curve = evaluate(env, policy, config, until=config.curve_episodes, episodes=done)
    assert curve.episodes == 2
    full = evaluate(env, policy, config, stop_below=0.9, episodes=done)
    assert full == evaluate(env, Reacher(gain=10.0), config)  # the same as scoring all six at once
    assert full.episodes == 6 and len(policy.first_goals) == 6  # no episode was run twice


def test_a_full_score_is_not_continued_once_the_target_is_out_of_reach(env):
    config = EvalConfig(episodes=10, curve_episodes=3, seed=SEED)
    done = EpisodeLog(successes=[False, False, False], returns=[-50.0] * 3)  # 3 of 10 failed: 0.9 is gone
    result = evaluate(env, Reacher(gain=10.0), config, stop_below=0.9, episodes=done)
    assert result.episodes == 3


@pytest.mark.parametrize(
    "curve_success,age_sec,expected",
    [
        (0.0, 5.0, 2.0),  # early in a run: min_interval_sec (Reach learns in seconds)
        (0.0, 100.0, 10.0),  # far from the target: a tenth of the run's age
        (0.2, 3000.0, 60.0),  # ... capped at max_interval_sec
        (0.45, 3000.0, 2.0),  # within reach (>= half the 0.9 target): every min_interval_sec
        (1.0, 3000.0, 2.0),
    ],
)
def test_evaluation_is_rare_far_from_the_target_and_frequent_near_it(curve_success, age_sec, expected):
    config = EvalConfig(min_interval_sec=2.0, max_interval_sec=60.0, interval_run_fraction=0.1)
    assert next_interval_sec(config, 0.9, curve_success, age_sec) == pytest.approx(expected)


@pytest.mark.parametrize(
    "misses,near_max,expected",
    [
        (0, 16.0, 2.0),  # a new best curve success: score again soon
        (1, 16.0, 4.0),  # no progress: the wait doubles ...
        (3, 16.0, 16.0),
        (50, 16.0, 16.0),  # ... up to near_max_interval_sec
        (50, 1.0, 2.0),  # a cap below min_interval_sec is min_interval_sec
        (50, 600.0, 60.0),  # and one above max_interval_sec is max_interval_sec
    ],
)
def test_a_plateau_near_the_target_is_scored_less_and_less_often(misses, near_max, expected):
    config = EvalConfig(min_interval_sec=2.0, max_interval_sec=60.0, near_max_interval_sec=near_max)
    assert next_interval_sec(config, 0.9, 0.8, 3000.0, misses) == pytest.approx(expected)
    assert next_interval_sec(config, 0.9, 0.2, 3000.0, misses) == pytest.approx(60.0)  # far off: unchanged


@pytest.mark.parametrize(
    "curve_success,score_cpu_sec,share,expected",
    [
        (0.8, 0.1, 0.1, 2.0),  # a cheap score: the rules above decide (0.9 s < 2 s)
        (0.8, 5.0, 0.1, 45.0),  # a 4-task score of 5 CPU seconds: 45 s, a tenth of a core
        (0.8, 10.0, 0.1, 90.0),  # above max_interval_sec too: the bound holds
        (0.2, 10.0, 0.1, 90.0),  # far from the target as well
        (0.2, 1.0, 0.1, 60.0),  # ... where the rules' 60 s is longer
        (0.8, 5.0, 0.5, 5.0),  # half a core: wait as long as the score took
        (0.8, 5.0, 0.0, 2.0),  # 0: no bound
    ],
)
def test_scoring_takes_at_most_its_share_of_a_core(curve_success, score_cpu_sec, share, expected):
    config = EvalConfig(min_interval_sec=2.0, max_interval_sec=60.0, interval_run_fraction=0.1, max_core_share=share)
    wait = next_interval_sec(config, 0.9, curve_success, 3000.0, 0, score_cpu_sec)
    assert wait == pytest.approx(expected)
    if share > 0:  # the share over a score and the wait after it
        assert score_cpu_sec / (score_cpu_sec + wait) <= share + 1e-9


def test_near_target_misses_count_scores_without_a_new_best():
    near = NearTarget()
    curves = [0.1, 0.5, 0.7, 0.7, 0.6, 0.8, 0.8, 0.3, 0.5, 0.9]
    assert [near.update(c, 0.9) for c in curves] == [0, 0, 0, 1, 2, 0, 1, 0, 1, 0]


def test_a_checkpoint_is_scored_on_the_same_held_out_episodes_every_time(tmp_path):
    from aggregator.core import AggregatorCore
    from foundation.checkpoint import save_checkpoint
    from foundation.config import AggregatorConfig, RunConfig

    core = AggregatorCore(ModelSpec(10, 3, 4, (32, 32)), AggregatorConfig(), grads_per_step=1, max_staleness=1)
    save_checkpoint(tmp_path, core.state(), keep=1)
    config = RunConfig()
    version, result = score_checkpoint(tmp_path, config, episodes=4)
    assert version == core.version and result.episodes == 4  # never cut short
    assert score_checkpoint(tmp_path, config, episodes=4)[1] == result
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint"):
        score_checkpoint(empty, config, episodes=4)


def test_fleetrl_evaluate_names_what_is_missing(tmp_path, capsys):
    from fleet.cli.main import main

    assert main(["evaluate", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_fleetrl_evaluate_first_seed_scores_a_disjoint_held_out_set(tmp_path, capsys):
    import dataclasses
    import json

    from aggregator.core import AggregatorCore
    from fleet.cli.main import main
    from foundation.checkpoint import save_checkpoint
    from foundation.config import AggregatorConfig, RunConfig

    config = RunConfig()
    (tmp_path / "config.json").write_text(config.to_json())
    core = AggregatorCore(ModelSpec(10, 3, 4, (32, 32)), AggregatorConfig(), grads_per_step=1, max_staleness=1)
    save_checkpoint(tmp_path / "checkpoints", core.state(), keep=1)
    assert main(["evaluate", str(tmp_path), "--episodes", "3", "--first-seed", "2000000", "--json"]) == 0
    fresh = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    moved = dataclasses.replace(config, eval=dataclasses.replace(config.eval, seed=2_000_000))
    expected = score_checkpoint(tmp_path / "checkpoints", moved, episodes=3)[1]
    assert fresh["first_seed"] == 2_000_000 and fresh["episodes"] == 3
    assert fresh["mean_return"] == expected.mean_return
    own = score_checkpoint(tmp_path / "checkpoints", config, episodes=3)[1]
    assert fresh["mean_return"] != own.mean_return  # other episodes than the evaluator's seeds
    assert main(["evaluate", str(tmp_path), "--first-seed", "-1"]) == 2
    assert "--first-seed: -1 < 0" in capsys.readouterr().err


def test_a_checkpoint_with_nan_weights_is_refused_before_any_episode(tmp_path):
    # score_checkpoint reads the policy with the same function as export (foundation.checkpoint).
    from aggregator.core import AggregatorCore
    from foundation.checkpoint import save_checkpoint
    from foundation.config import AggregatorConfig, RunConfig

    core = AggregatorCore(ModelSpec(10, 3, 4, (32, 32)), AggregatorConfig(), grads_per_step=1, max_staleness=1)
    state = core.state()
    state["weights"]["actor"] = np.full_like(state["weights"]["actor"], np.nan)
    save_checkpoint(tmp_path, state, keep=1)
    with pytest.raises(CheckpointError, match="NaN or inf"):
        score_checkpoint(tmp_path, RunConfig(), episodes=4)


class FailsOn:
    """Reaches the goal, except in the listed episodes (there it drives away from the goal)."""

    def __init__(self, failing: set[int]) -> None:
        self.failing, self.episode, self._goal = failing, -1, None

    def act(self, obs, deterministic, task=0):
        if self._goal is None or not np.array_equal(obs["desired_goal"], self._goal):
            self.episode += 1
            self._goal = obs["desired_goal"].copy()
        sign = -1.0 if self.episode in self.failing else 1.0
        action = np.zeros(4, np.float32)
        action[:3] = np.clip(sign * 10 * (obs["desired_goal"] - obs["observation"][:3]), -1, 1)
        return action


def test_early_stop_never_cuts_a_version_that_reaches_the_target_exactly():
    # 0.28 * 25 == 7.000000000000001 in floating point: ceil gives 8, one failure too few allowed.
    env = make_env("FetchReach-v4")
    try:
        result = evaluate(env, FailsOn(set(range(18))), EvalConfig(episodes=25, seed=1_000_000), stop_below=0.28)
    finally:
        env.close()
    assert result.episodes == 25 and result.success_rate == pytest.approx(7 / 25)
    assert result.success_rate >= 0.28
