"""sim.registry: stable ids, dims that match the real envs, env construction, goal rewards."""

from __future__ import annotations

import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from foundation.config import RandomizationConfig
from foundation.config_experience import TASK_NAMES
from foundation.wire import TransitionSchema
from sim import (
    TASKS,
    DomainRandomization,
    TaskSpec,
    UnknownTaskError,
    get_task,
    goal_reward,
    goal_success,
    make_env,
)
from sim.metaworld import MetaWorldGoal

# The wire format depends on these; a change here is a breaking change to stored data.
STABLE_IDS = [
    ("FetchReach-v4", 0),
    ("FetchPush-v4", 1),
    ("FetchPickAndPlace-v4", 2),
    ("FetchSlide-v4", 3),
    ("MetaWorld-reach-v3", 4),
    ("MetaWorld-push-v3", 5),
    ("MetaWorld-pick-place-v3", 6),
    ("MetaWorld-door-open-v3", 7),
    ("MetaWorld-drawer-open-v3", 8),
    ("MetaWorld-drawer-close-v3", 9),
    ("MetaWorld-button-press-topdown-v3", 10),
    ("MetaWorld-peg-insert-side-v3", 11),
    ("MetaWorld-window-open-v3", 12),
    ("MetaWorld-window-close-v3", 13),
]


def _quiet_check_env(env: gym.Env) -> None:
    """check_env with its known, expected warnings silenced and every other warning an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # Fetch's observation Boxes are unbounded by design.
        warnings.filterwarnings("ignore", message=".*Box observation space m.*infinity")
        check_env(env, skip_render_check=True)  # headless: render would need a display


@pytest.mark.parametrize("name,task_id", STABLE_IDS)
def test_ids_are_stable(name: str, task_id: int) -> None:
    assert get_task(name).task_id == task_id
    assert get_task(task_id).name == name
    assert get_task(np.int64(task_id)).name == name  # task_id columns arrive as numpy ints


def test_registry_holds_exactly_the_stable_tasks_in_id_order() -> None:
    assert [(s.name, s.task_id) for s in TASKS.values()] == STABLE_IDS


def test_config_accepts_exactly_the_registered_tasks() -> None:
    # RunConfig.validate checks sim.task against TASK_NAMES (the config imports no role).
    assert TASK_NAMES == tuple(TASKS)


@pytest.mark.parametrize("name", list(TASKS))
def test_family_and_native_rate_follow_the_env_behind_the_task(name: str) -> None:
    spec = get_task(name)
    fetch = spec.gym_id.startswith("Fetch")  # gymnasium-robotics; Meta-World's are sim/metaworld.py's
    assert spec.is_fetch == fetch
    assert (spec.family, spec.native_hz) == (("fetch", 25.0) if fetch else ("metaworld", 80.0))
    assert fetch == (not isinstance(make_env(spec).unwrapped, MetaWorldGoal))


@pytest.mark.parametrize("name", list(TASKS))
def test_dims_match_the_real_env(name: str) -> None:
    spec = get_task(name)
    env = make_env(spec)
    space = env.observation_space
    assert isinstance(space, gym.spaces.Dict)
    assert space["observation"].shape == (spec.obs_dim,)
    assert space["achieved_goal"].shape == (spec.goal_dim,)
    assert space["desired_goal"].shape == (spec.goal_dim,)
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, (spec.act_dim,), np.float32)
    assert env.spec.max_episode_steps == spec.max_episode_steps
    assert spec.schema() == TransitionSchema(spec.obs_dim, spec.goal_dim, spec.act_dim)
    obs, _ = env.reset(seed=0)
    assert obs["observation"].shape == (spec.obs_dim,)


@pytest.mark.parametrize("name", list(TASKS))
def test_check_env_passes_nominal(name: str) -> None:
    _quiet_check_env(make_env(name).unwrapped)


@pytest.mark.parametrize("bad", ["FetchFly-v0", "fetchreach-v4", 99, -1, True, None, 1.0])
def test_unknown_task_error_lists_known_tasks(bad: object) -> None:
    with pytest.raises(UnknownTaskError) as info:
        get_task(bad)  # type: ignore[arg-type]  # bad input on purpose
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert repr(bad) in message
    for name, task_id in STABLE_IDS:
        assert f"{name} (id {task_id})" in message


def test_make_env_accepts_name_id_and_spec() -> None:
    for task in ("FetchSlide-v4", 3, get_task(3)):
        assert make_env(task).spec.id == "FetchSlide-v4"
    with pytest.raises(UnknownTaskError):
        make_env("FetchFly-v0")


def test_make_env_wraps_only_when_randomization_is_enabled() -> None:
    assert isinstance(make_env(0, RandomizationConfig()), DomainRandomization)
    assert not isinstance(make_env(0, RandomizationConfig(enabled=False)), DomainRandomization)
    assert not isinstance(make_env(0, None), DomainRandomization)


def test_episode_is_truncated_at_max_episode_steps() -> None:
    env = make_env("FetchReach-v4")
    env.reset(seed=0)
    env.action_space.seed(0)
    truncations = [env.step(env.action_space.sample())[3] for _ in range(get_task(0).max_episode_steps)]
    assert truncations == [False] * 49 + [True]


@pytest.mark.parametrize("name", ["FetchReach-v4", "FetchPush-v4"])
def test_goal_reward_and_success_match_the_env(name: str) -> None:
    env = make_env(name)
    rng = np.random.default_rng(0)
    desired = rng.uniform(-0.1, 0.1, size=(200, 3))
    # Half the rows within the 0.05 threshold, half beyond it: both rewards occur.
    achieved = desired + rng.normal(0.0, 0.04, size=(200, 3))
    reward = goal_reward(env, achieved, desired)
    assert reward.dtype == np.float32 and reward.shape == (200,)
    np.testing.assert_array_equal(reward, env.unwrapped.compute_reward(achieved, desired, {}))
    assert set(np.unique(reward)) == {-1.0, 0.0}
    success = goal_success(env, achieved, desired)
    assert success.dtype == bool
    np.testing.assert_array_equal(success, reward == 0.0)


def test_goal_reward_matches_the_reward_and_success_of_steps() -> None:
    env = make_env("FetchReach-v4")
    obs, _ = env.reset(seed=1)
    env.action_space.seed(1)
    for _ in range(10):
        obs, reward, _, _, info = env.step(env.action_space.sample())
        ag, dg = obs["achieved_goal"][None], obs["desired_goal"][None]
        assert goal_reward(env, ag, dg)[0] == reward
        assert goal_success(env, ag, dg)[0] == bool(info["is_success"])


def test_goal_reward_works_through_the_randomization_wrapper() -> None:
    env = make_env("FetchPush-v4", RandomizationConfig())
    obs, _ = env.reset(seed=0)
    assert goal_reward(env, obs["achieved_goal"][None], obs["desired_goal"][None]).shape == (1,)


@pytest.mark.parametrize(
    "achieved_shape,desired_shape",
    [((5, 3), (4, 3)), ((5, 2), (5, 2)), ((), ())],
)
def test_goal_reward_rejects_mismatched_goals(achieved_shape: tuple, desired_shape: tuple) -> None:
    env = make_env("FetchReach-v4")
    with pytest.raises(ValueError, match="goal"):
        goal_reward(env, np.zeros(achieved_shape), np.zeros(desired_shape))


def test_task_spec_is_frozen() -> None:
    with pytest.raises(AttributeError):
        get_task(0).task_id = 7  # type: ignore[misc]  # mutation on purpose
    assert isinstance(get_task(0), TaskSpec)


def test_import_prints_nothing() -> None:
    # gymnasium_robotics prints an Adroit notice on import; every sampler would repeat it.
    result = subprocess.run(
        [sys.executable, "-c", "import sim"], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout == "" and result.stderr == ""


def test_a_task_at_120_hz_keeps_its_seconds_and_its_hand_speed():
    """Fetch decides at 25 Hz; at 120 Hz a decision is exactly 1/120 s of simulated time, an
    episode lasts as long (240 steps), and a constant action moves the hand as far per second."""
    import numpy as np

    from sim.registry import make_env

    def hand_after(env, seconds: float) -> tuple[np.ndarray, int]:
        obs, _ = env.reset(seed=0)
        start = obs["observation"][:3].copy()
        steps = round(seconds / env.unwrapped.dt)
        for _ in range(steps):
            obs, *_ = env.step(np.array([1.0, 0.0, 0.0, 0.0], np.float32))
        return obs["observation"][:3] - start, steps

    native, fast = make_env("FetchReach-v4"), make_env("FetchReach-v4", control_hz=120.0)
    assert fast.unwrapped.dt == pytest.approx(1 / 120) and fast.spec.max_episode_steps == 240
    # Calibrated over 0.4 s (sim/rate.py); checked here over twice as long.
    moved_native, n_native = hand_after(native, 0.8)
    moved_fast, n_fast = hand_after(fast, 0.8)
    assert (n_native, n_fast) == (20, 96)
    assert moved_native[0] > 0.05 and moved_fast[0] == pytest.approx(moved_native[0], rel=0.1)
    with pytest.raises(ValueError, match="control_hz \\(-1"):
        make_env("FetchReach-v4", control_hz=-1.0)
