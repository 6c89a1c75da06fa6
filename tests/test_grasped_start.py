"""sim.grasped_start: FetchPickAndPlace training episodes that start with the object held
(sim/grasped_start.py), built only into a sampler's training envs."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from foundation.config import ConfigError, RandomizationConfig, RunConfig, tasks_overrides, with_overrides
from foundation.config_experience import GRASP_TASKS
from sampler.evaluator import eval_envs
from sim.grasped_start import FINGER_JOINTS, GraspedStart
from sim.registry import TASKS, make_env
from sim.tasks import TaskSet

PICK = "FetchPickAndPlace-v4"
LIFT = np.array([0.0, 0.0, 1.0, -1.0], np.float32)  # hand straight up at full speed, gripper closed


def _wrappers(env: gym.Env) -> list[type]:
    """The classes of every layer of an env, outermost first."""
    layers = [type(env)]
    while isinstance(env, gym.Wrapper):
        env = env.env
        layers.append(type(env))
    return layers


def _object_between_fingers(env: gym.Env) -> bool:
    """The object's centre lies between the two finger pads, which stand open around it."""
    fetch: Any = env.unwrapped
    model, data, utils = fetch.model, fetch.data, fetch._utils
    pads = [data.geom_xpos[model.geom(name.replace("_joint", "_link")).id] for name in FINGER_JOINTS]
    obj = utils.get_site_xpos(model, data, "object0")
    low, high = sorted(pad[1] for pad in pads)
    opening = [float(utils.get_joint_qpos(model, data, name)[0]) for name in FINGER_JOINTS]
    return bool(low < obj[1] < high and min(opening) > 0.02)  # closed on nothing they would read ~0


@pytest.mark.parametrize("control_hz", [0.0, 120.0])
def test_a_grasped_reset_holds_the_object_between_the_fingers_above_the_table_under_randomization(control_hz):
    env = make_env(PICK, RandomizationConfig(), control_hz=control_hz, grasped_start=1.0)
    fetch: Any = env.unwrapped
    for seed in range(8):
        obs, _ = env.reset(seed=seed)
        grip_to_object = obs["observation"][6:9]
        assert np.linalg.norm(grip_to_object) < 0.01, (seed, grip_to_object)
        assert _object_between_fingers(env), seed
        assert obs["achieved_goal"][2] > fetch.height_offset + 0.05, seed  # off the table, not resting on it


def test_lifting_with_the_gripper_closed_carries_the_object_up():
    env = make_env(PICK, RandomizationConfig(), grasped_start=1.0)
    for seed in range(5):
        obs, _ = env.reset(seed=seed)
        start = obs["achieved_goal"][2]
        for _ in range(10):
            obs, *_ = env.step(LIFT)
        assert obs["achieved_goal"][2] - start > 0.02, seed
        assert np.linalg.norm(obs["observation"][6:9]) < 0.01, seed  # it rose with the grip, still in it


def test_a_share_of_0_resets_and_steps_exactly_as_the_plain_env():
    plain, wrapped = gym.make(PICK), GraspedStart(gym.make(PICK), share=0.0)
    rng = np.random.default_rng(0)
    for seed in (0, None, None, 7, None):  # unseeded resets follow the env's own stream
        a, _ = plain.reset(seed=seed)
        b, _ = wrapped.reset(seed=seed)
        assert not wrapped.started_grasped
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
        for _ in range(3):
            action = rng.uniform(-1, 1, 4).astype(np.float32)
            np.testing.assert_array_equal(plain.step(action)[0]["observation"], wrapped.step(action)[0]["observation"])


def test_a_share_of_1_always_grasps_and_a_half_grasps_about_half_reproducibly():
    always = GraspedStart(gym.make(PICK), share=1.0)
    assert all(always.reset(seed=seed) and always.started_grasped for seed in range(10))
    half = GraspedStart(gym.make(PICK), share=0.5)
    draws = []
    for seed in range(200):
        half.reset(seed=seed)
        draws.append(half.started_grasped)
    assert 0.4 < np.mean(draws) < 0.6, np.mean(draws)
    for seed in (3, 11):  # the draw is the seed's: the same seed, the same start
        first, _ = half.reset(seed=seed)
        again, _ = half.reset(seed=seed)
        assert half.started_grasped == draws[seed]
        np.testing.assert_array_equal(first["observation"], again["observation"])


def test_in_a_multi_task_run_only_the_pick_and_place_env_starts_held():
    config = with_overrides(RunConfig(), [*tasks_overrides(["FetchPush-v4", PICK]), "sim.grasped_start=1"])
    tasks = TaskSet.for_run(config.validate())
    push, pick = (tasks.training_env(i, config) for i in range(2))
    assert GraspedStart not in _wrappers(push)
    assert GraspedStart in _wrappers(pick)
    pick.reset(seed=0)
    assert _object_between_fingers(pick)


@pytest.mark.parametrize("measure", ["field", "training"])
@pytest.mark.parametrize("randomize", [False, True])
def test_the_evaluators_envs_never_start_held(measure, randomize):
    overrides = [
        f"sim.task={PICK}",
        "sim.grasped_start=1",
        f'eval.measure="{measure}"',
        f"eval.randomize={str(randomize).lower()}",
    ]
    config = with_overrides(RunConfig(), overrides).validate()
    (env,) = eval_envs(TaskSet.for_run(config), config)
    assert GraspedStart not in _wrappers(env)
    for seed in range(3):
        obs, _ = env.reset(seed=seed)
        assert np.linalg.norm(obs["observation"][6:9]) > 0.05  # the object lies on the table, away from the grip


def test_grasp_tasks_are_the_fetch_tasks_whose_gripper_can_grasp_an_object():
    for spec in TASKS.values():
        if not spec.is_fetch:
            continue
        fetch: Any = make_env(spec).unwrapped
        assert (fetch.has_object and not fetch.block_gripper) == (spec.name in GRASP_TASKS), spec.name


def test_a_task_that_cannot_grasp_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"sim.grasped_start \(0.5\) must be 0 for FetchPush-v4: only a task whose"):
        make_env("FetchPush-v4", grasped_start=0.5)
    with pytest.raises(ValueError, match=r"sim.grasped_start \(0.5\) must be 0 for MetaWorld-push-v3: only a"):
        make_env("MetaWorld-push-v3", grasped_start=0.5)
    with pytest.raises(ValueError, match=r"sim.grasped_start \(1.5\) must be in \[0, 1\]"):
        make_env(PICK, grasped_start=1.5)
    with pytest.raises(ValueError, match=r"sim.grasped_start \(0.5\) must be 0 for FetchSlide-v4: only a task whose"):
        GraspedStart(gym.make("FetchSlide-v4"), share=0.5)


@pytest.mark.parametrize(
    "overrides",
    [
        [f"sim.task={PICK}", "sim.grasped_start=1.5"],  # out of [0, 1]
        ["sim.task=FetchPush-v4", "sim.grasped_start=0.5"],  # no task that can grasp
        ['sim.tasks=["FetchReach-v4","FetchSlide-v4"]', "sim.grasped_start=0.5"],
    ],
)
def test_a_run_that_cannot_take_it_is_refused_at_launch_naming_the_field(overrides):
    # the messages, row by row: tests/test_config.py (BAD_CONFIGS) and tests/test_cli_errors.py
    with pytest.raises(ConfigError) as err:
        with_overrides(RunConfig(), overrides).validate()
    assert err.value.field == "sim.grasped_start"
