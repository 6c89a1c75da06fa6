"""sim.randomization: ranges, restoration, reproducibility, latency, noise, nominal fallback."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import asdict

import gymnasium as gym
import mujoco
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from foundation.config import ConfigError, RandomizationConfig
from sim import TASKS, DomainRandomization, make_env
from sim.randomization import NOMINAL_CONFIG, NOMINAL_PARAMS

# Every per-episode scale pinned to 1: the dynamics are nominal, so the effect of the one
# knob a test turns on can be compared exactly against an unwrapped env.
NEUTRAL = dataclasses.replace(NOMINAL_CONFIG, enabled=True)
WIDE = RandomizationConfig(
    mass_scale=(0.5, 2.0),
    friction_scale=(0.3, 1.5),
    damping_scale=(0.6, 1.4),
    weld_stiffness_scale=(0.7, 1.3),
    action_scale=(0.8, 1.2),
    obs_noise_std=0.01,
    action_latency_steps=(0, 2),
)


SCALE_FIELDS = ("mass_scale", "friction_scale", "damping_scale", "weld_stiffness_scale", "action_scale")


def _neutral(**changes: object) -> RandomizationConfig:
    return RandomizationConfig(**{**asdict(NEUTRAL), **changes})


def _actions(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, size=4).astype(np.float32) for _ in range(n)]


def _rollout(env: gym.Env, seed: int | None, actions: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
    obs, _ = env.reset(seed=seed)
    return [obs] + [env.step(a)[0] for a in actions]


def _assert_same_obs(a: list[dict], b: list[dict], keys: tuple[str, ...] = ("observation",)) -> None:
    assert len(a) == len(b)
    for t, (x, y) in enumerate(zip(a, b, strict=True)):
        for key in keys:
            np.testing.assert_array_equal(x[key], y[key], err_msg=f"step {t}, {key}")


def _nominal_model(task: str) -> mujoco.MjModel:
    """The model of a freshly built env: the nominal values to compare against."""
    return make_env(task).unwrapped.model


@pytest.mark.parametrize("name", list(TASKS))
def test_check_env_passes_with_randomization(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*Box observation space m.*infinity")
        # check_env on any wrapper warns that it is not the raw env; the wrapper is the point.
        warnings.filterwarnings("ignore", message=".*different from the unwrapped version")
        check_env(make_env(name, WIDE), skip_render_check=True)


def test_same_seed_gives_identical_episodes() -> None:
    actions = _actions(25)
    first = make_env("FetchPush-v4", WIDE)
    second = make_env("FetchPush-v4", WIDE)
    keys = ("observation", "achieved_goal", "desired_goal")
    for seed in (0, 1):
        run_a, params_a = _rollout(first, seed, actions), first.current_params
        run_b, params_b = _rollout(second, seed, actions), second.current_params
        assert params_a == params_b
        _assert_same_obs(run_a, run_b, keys)
    # The same env, reseeded after other episodes, replays the episode exactly.
    _assert_same_obs(_rollout(first, 0, actions), _rollout(second, 0, actions), keys)
    # Unseeded resets continue the seeded stream, identically in both envs.
    _assert_same_obs(_rollout(first, None, actions), _rollout(second, None, actions), keys)


def test_different_seeds_draw_different_params() -> None:
    env = make_env("FetchPush-v4", WIDE)
    draws = []
    for seed in range(8):
        env.reset(seed=seed)
        draws.append(env.current_params)
    for field in SCALE_FIELDS:
        assert len({getattr(p, field) for p in draws}) == len(draws), field


def test_params_are_within_ranges_and_model_is_nominal_times_scale() -> None:
    env = make_env("FetchPush-v4", WIDE)
    nominal = _nominal_model("FetchPush-v4")
    model = env.unwrapped.model
    obj, weld = model.body("object0").id, 0
    latencies = set()
    env.reset(seed=0)
    for _ in range(40):
        env.reset()
        p = env.current_params
        for field in SCALE_FIELDS:
            low, high = getattr(WIDE, field)
            assert low <= getattr(p, field) <= high, (field, p)
        assert WIDE.action_latency_steps[0] <= p.latency_steps <= WIDE.action_latency_steps[1]
        latencies.add(p.latency_steps)
        # Written from the nominal copies, never from last episode's values: no compounding.
        np.testing.assert_allclose(model.body_mass[obj], nominal.body_mass[obj] * p.mass_scale, rtol=1e-12)
        np.testing.assert_allclose(model.body_inertia[obj], nominal.body_inertia[obj] * p.mass_scale, rtol=1e-12)
        np.testing.assert_array_equal(np.delete(model.body_mass, obj), np.delete(nominal.body_mass, obj))
        np.testing.assert_allclose(model.geom_friction[:, 0], nominal.geom_friction[:, 0] * p.friction_scale)
        np.testing.assert_array_equal(model.geom_friction[:, 1:], nominal.geom_friction[:, 1:])
        np.testing.assert_allclose(model.dof_damping, nominal.dof_damping * p.damping_scale, rtol=1e-12)
        # Weld stiffness ~ 1 / timeconst^2 at a fixed damping ratio.
        expected = nominal.eq_solref[weld, 0] / np.sqrt(p.weld_stiffness_scale)
        np.testing.assert_allclose(model.eq_solref[weld], [expected, nominal.eq_solref[weld, 1]], rtol=1e-12)
        np.testing.assert_allclose(model.body_subtreemass[obj], model.body_mass[obj], rtol=1e-12)
    assert latencies == {0, 1, 2}  # both ends of the inclusive range are drawn


def test_restore_nominal_writes_back_every_nominal_value() -> None:
    env = make_env("FetchSlide-v4", WIDE)
    for seed in range(5):
        env.reset(seed=seed)
    env.restore_nominal()
    model, nominal = env.unwrapped.model, _nominal_model("FetchSlide-v4")
    for field in (
        "body_mass",
        "body_inertia",
        "geom_friction",
        "dof_damping",
        "eq_solref",
        "body_invweight0",
    ):
        np.testing.assert_array_equal(getattr(model, field), getattr(nominal, field), err_msg=field)


def test_reach_has_no_object_and_keeps_its_masses() -> None:
    env = make_env("FetchReach-v4", WIDE)
    assert env.object_body_names == ()
    env.reset(seed=0)
    np.testing.assert_array_equal(env.unwrapped.model.body_mass, _nominal_model("FetchReach-v4").body_mass)
    assert make_env("FetchPickAndPlace-v4", WIDE).object_body_names == ("object0",)


@pytest.mark.parametrize("latency", [1, 3])
def test_latency_delays_actions_exactly_k_steps(latency: int) -> None:
    actions = _actions(12)
    delayed = make_env("FetchPush-v4", _neutral(action_latency_steps=(latency, latency)))
    run = _rollout(delayed, 0, actions)
    assert delayed.current_params.latency_steps == latency
    shifted = [np.zeros(4, np.float32)] * latency + actions[: len(actions) - latency]
    keys = ("observation", "achieved_goal", "desired_goal")
    _assert_same_obs(run, _rollout(make_env("FetchPush-v4"), 0, shifted), keys)


def test_action_scale_multiplies_the_applied_action() -> None:
    actions = _actions(10)
    scaled = make_env("FetchReach-v4", _neutral(action_scale=(0.5, 0.5)))
    halved = [a * np.float32(0.5) for a in actions]
    _assert_same_obs(_rollout(scaled, 3, actions), _rollout(make_env("FetchReach-v4"), 3, halved))


def test_noise_is_on_observation_only_and_rewards_stay_true() -> None:
    std, actions = 0.01, _actions(49)
    noisy, clean = make_env("FetchPush-v4", _neutral(obs_noise_std=std)), make_env("FetchPush-v4")
    noisy.reset(seed=5)
    clean.reset(seed=5)
    residuals = []
    for action in actions:
        obs_n, reward_n, *_ = noisy.step(action)
        obs_c, reward_c, *_ = clean.step(action)
        assert reward_n == reward_c
        np.testing.assert_array_equal(obs_n["achieved_goal"], obs_c["achieved_goal"])
        np.testing.assert_array_equal(obs_n["desired_goal"], obs_c["desired_goal"])
        residuals.append(obs_n["observation"] - obs_c["observation"])
    residuals = np.concatenate(residuals)  # 49 * 25 samples
    assert abs(residuals.std() - std) < 0.1 * std and abs(residuals.mean()) < 0.1 * std


def test_weld_stiffness_changes_how_far_the_arm_moves() -> None:
    # A stiffer weld drags the gripper closer to the commanded 5 cm step within one env step.
    push_x = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
    moved = []
    for scale in (0.25, 1.0, 4.0):
        env = make_env("FetchPush-v4", _neutral(weld_stiffness_scale=(scale, scale)))
        obs, _ = env.reset(seed=0)
        moved.append(env.step(push_x)[0]["observation"][0] - obs["observation"][0])
    assert moved[0] < moved[1] < moved[2] < 0.05


@pytest.mark.parametrize("config", [None, RandomizationConfig(enabled=False)])
def test_disabled_randomization_is_the_nominal_env(config: RandomizationConfig | None) -> None:
    actions = _actions(15)
    reference = _rollout(gym.make("FetchPickAndPlace-v4"), 2, actions)
    keys = ("observation", "achieved_goal", "desired_goal")
    _assert_same_obs(_rollout(make_env("FetchPickAndPlace-v4", config), 2, actions), reference, keys)


def test_wrapper_built_with_enabled_false_draws_nominal_params() -> None:
    actions = _actions(15)
    env = DomainRandomization(gym.make("FetchPickAndPlace-v4"), RandomizationConfig(enabled=False))
    run = _rollout(env, 2, actions)
    assert env.current_params == NOMINAL_PARAMS
    keys = ("observation", "achieved_goal", "desired_goal")
    _assert_same_obs(run, _rollout(gym.make("FetchPickAndPlace-v4"), 2, actions), keys)


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"mass_scale": (1.2, 0.8)}, "mass_scale"),
        ({"friction_scale": (0.0, 1.0)}, "friction_scale"),
        ({"damping_scale": (-1.0, 1.0)}, "damping_scale"),
        ({"action_scale": (1.0, float("inf"))}, "action_scale"),
        ({"weld_stiffness_scale": (1.0, 100.0)}, "weld_stiffness_scale"),  # past refsafe clamp
        ({"obs_noise_std": -0.1}, "obs_noise_std"),
        ({"obs_noise_std": float("nan")}, "obs_noise_std"),
        ({"action_latency_steps": (2, 1)}, "action_latency_steps"),
        ({"action_latency_steps": (-1, 0)}, "action_latency_steps"),
    ],
)
def test_bad_config_is_rejected_with_the_field_name(changes: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        make_env("FetchPush-v4", RandomizationConfig(**changes))


def test_step_checks_its_input_at_once() -> None:
    env = make_env("FetchReach-v4", _neutral(action_latency_steps=(3, 3)))
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(np.zeros(4, np.float32))
    env.reset(seed=0)
    # With latency the env would only meet this action 3 steps later; the wrapper refuses now.
    with pytest.raises(ValueError, match="action shape"):
        env.step(np.zeros(3, np.float32))
