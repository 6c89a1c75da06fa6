"""Task registry: names, stable integer ids, dimensions, and the one way to build an env.

Every transition on the wire carries a `task_id`; the learner and the exporter size their
networks from `TaskSpec` dims without building an env. So the ids and dims below are
literals, and tests check the dims against the real envs.

    >>> from sim import get_task, make_env, goal_reward
    >>> spec = get_task("FetchPush-v4")            # or get_task(1)
    >>> spec.task_id, spec.schema().row_floats
    (1, 59)
    >>> env = make_env(spec, RandomizationConfig())   # domain-randomized FetchPush
    >>> obs, info = env.reset(seed=0)
    >>> obs["observation"].shape, env.action_space.shape
    ((25,), (4,))
    >>> goal_reward(env, obs["achieved_goal"][None], obs["desired_goal"][None])  # shape [1]
"""

from __future__ import annotations

import contextlib
import io
import numbers
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import gymnasium as gym
import numpy as np

from foundation.config import RandomizationConfig
from foundation.config_experience import METAWORLD_TASKS, REWARDS, TASK_NAMES
from foundation.errors import FleetrlError
from foundation.wire import TransitionSchema
from sim.grasped_start import GraspedStart
from sim.metaworld import NATIVE_HZ as METAWORLD_HZ  # metaworld itself is imported only when built
from sim.metaworld import PATH_STEPS as METAWORLD_PATH_STEPS
from sim.metaworld import MetaWorldGoal
from sim.randomization import DomainRandomization
from sim.rate import NATIVE_HZ, ControlRate, episode_steps

# gymnasium_robotics prints an unrelated Adroit reward-change notice to stderr on import
# (via farama_notifications). Every sampler process would print it; swallow that one import.
with contextlib.redirect_stderr(io.StringIO()):
    import gymnasium_robotics

gym.register_envs(gymnasium_robotics)


class UnknownTaskError(FleetrlError, ValueError):
    """A task name or id is not in the registry; the message lists the known tasks."""


@dataclass(frozen=True)
class TaskSpec:
    """One task: its stable wire id, the gymnasium id it builds, and its fixed dimensions.

    `obs_dim` is the width of the "observation" entry only; goals are a separate column
    (`goal_dim`), as in foundation.wire.TransitionSchema.

        >>> get_task("FetchReach-v4").schema()
        TransitionSchema(obs_dim=10, goal_dim=3, act_dim=4)
    """

    name: str
    task_id: int
    gym_id: str
    obs_dim: int
    goal_dim: int
    act_dim: int
    max_episode_steps: int
    native_hz: float = NATIVE_HZ  # decisions per simulated second of the task's own env (Fetch 25)
    family: Literal["fetch", "metaworld"] = "fetch"  # gymnasium-robotics, or sim/metaworld.py
    field_episode_steps: int = 0  # the horizon its benchmark scores an episode over (0: max_episode_steps)
    success_at_any_step: bool = False  # its benchmark's success: at any step (True) or the last

    @property
    def eval_episode_steps(self) -> int:
        """The horizon of an evaluation episode scored as the task's benchmark scores it (sim/measure.py)."""
        return self.field_episode_steps or self.max_episode_steps

    @property
    def is_fetch(self) -> bool:
        """A Fetch task: it runs at any rate through sim/rate.py, and an exported graph re-times its
        velocity inputs (deploy_npu/retime.py). A Meta-World task re-times itself, from its own
        80 Hz up, and its observation reads the same at any rate (sim/metaworld.py)."""
        return self.family == "fetch"

    def schema(self) -> TransitionSchema:
        """The column layout of this task's transitions (fixed-size records in the buffer)."""
        return TransitionSchema(obs_dim=self.obs_dim, goal_dim=self.goal_dim, act_dim=self.act_dim)


def _fetch(name: str, task_id: int, obs_dim: int) -> TaskSpec:
    # Every Fetch task: 3-D goal (gripper or object position), 4-D action (dx, dy, dz,
    # gripper), 50-step episodes as registered by gymnasium_robotics.
    return TaskSpec(name, task_id, name, obs_dim, goal_dim=3, act_dim=4, max_episode_steps=50)


def _metaworld(env_name: str, task_id: int, max_episode_steps: int) -> TaskSpec:
    # sim/metaworld.py: a Meta-World v3 task as a goal env (36-d observation, 3-d goal, 4-d
    # action), built lazily so that metaworld is imported only by who runs it.
    name = f"MetaWorld-{env_name}"
    gym.register(id=f"fleetrl/{name}", entry_point="sim.metaworld:MetaWorldGoal", kwargs={"env_name": env_name})
    return TaskSpec(
        name, task_id, f"fleetrl/{name}", 36, goal_dim=3, act_dim=4, max_episode_steps=max_episode_steps,
        native_hz=METAWORLD_HZ, family="metaworld", field_episode_steps=METAWORLD_PATH_STEPS, success_at_any_step=True,
    )  # fmt: skip


# Ids are part of the wire format and of stored data: never renumber, only append.
_SPECS = (
    _fetch("FetchReach-v4", 0, obs_dim=10),
    _fetch("FetchPush-v4", 1, obs_dim=25),
    _fetch("FetchPickAndPlace-v4", 2, obs_dim=25),
    _fetch("FetchSlide-v4", 3, obs_dim=25),
    # Short horizons: Meta-World's hand moves up to 1 cm per step, its goals lie 10-30 cm away;
    # its scripted experts first succeed after a median of 48 (reach) to 95 (peg-insert-side)
    # steps (seeds 0-19; peg-insert-side's expert misses some starts whatever the horizon).
    _metaworld("reach-v3", 4, max_episode_steps=100),
    _metaworld("push-v3", 5, max_episode_steps=150),
    _metaworld("pick-place-v3", 6, max_episode_steps=150),
    _metaworld("door-open-v3", 7, max_episode_steps=150),
    _metaworld("drawer-open-v3", 8, max_episode_steps=150),
    _metaworld("drawer-close-v3", 9, max_episode_steps=150),
    _metaworld("button-press-topdown-v3", 10, max_episode_steps=150),
    _metaworld("peg-insert-side-v3", 11, max_episode_steps=150),
    _metaworld("window-open-v3", 12, max_episode_steps=150),
    _metaworld("window-close-v3", 13, max_episode_steps=150),
)

TASKS: Mapping[str, TaskSpec] = types.MappingProxyType({s.name: s for s in _SPECS})
"""Every registered task by name, in task_id order."""

_BY_ID: Mapping[int, TaskSpec] = types.MappingProxyType({s.task_id: s for s in _SPECS})
if len(_BY_ID) != len(_SPECS) or len(TASKS) != len(_SPECS):
    raise RuntimeError("sim.registry: duplicate task name or id in _SPECS")
if tuple(s.name for s in _SPECS if not s.is_fetch) != METAWORLD_TASKS:
    raise RuntimeError("sim.registry: foundation.config_experience.METAWORLD_TASKS must be the Meta-World tasks")
if tuple(TASKS) != TASK_NAMES:
    raise RuntimeError(
        f"sim.registry: TASKS {tuple(TASKS)} differ from foundation.config_experience.TASK_NAMES {TASK_NAMES}"
    )


def _known_tasks() -> str:
    return ", ".join(f"{s.name} (id {s.task_id})" for s in _SPECS)


def get_task(name_or_id: str | int) -> TaskSpec:
    """Look a task up by name or by its wire id.

    >>> get_task("FetchSlide-v4").task_id
    3
    >>> get_task(3).name
    'FetchSlide-v4'
    >>> get_task("FetchFly-v0")   # UnknownTaskError: ... known tasks: FetchReach-v4 (id 0), ...
    """
    # bool is an int subclass; get_task(True) is a bug at the call site, not task 1.
    if isinstance(name_or_id, numbers.Integral) and not isinstance(name_or_id, bool):
        spec = _BY_ID.get(int(name_or_id))
    elif isinstance(name_or_id, str):
        spec = TASKS.get(name_or_id)
    else:
        spec = None
    if spec is None:
        raise UnknownTaskError(f"unknown task {name_or_id!r}; known tasks: {_known_tasks()}")
    return spec


def make_env(
    task: str | int | TaskSpec,
    randomization: RandomizationConfig | None = None,
    control_hz: float = 0.0,
    reward: str = "sparse",
    max_episode_steps: int = 0,
    grasped_start: float = 0.0,
) -> gym.Env:
    """Build a task's env: dict observations, Box(-1, 1, (act_dim,)) actions, time limit.

    With `randomization` given and enabled, the env is wrapped in DomainRandomization;
    with None or `enabled=False` it is the nominal task (the evaluator's default).
    `control_hz` (0: the task's own rate, `native_hz`) runs the task at another decision rate
    (Fetch: sim/rate.py; Meta-World, 80 Hz or faster: sim/metaworld.py). `reward` is sim.reward:
    "sparse", or "shaped" (a Meta-World task's own dense reward). `max_episode_steps` (0: the
    task's) sets the horizon at the task's own rate. `grasped_start` (sim.grasped_start, a
    training env's only) is the share of episodes that start with the object held
    (sim/grasped_start.py), inside the randomization, so the grip closes on this episode's
    masses and frictions.

        >>> env = make_env("FetchReach-v4")                          # nominal
        >>> env = make_env(0, RandomizationConfig(obs_noise_std=0.0))  # randomized dynamics
        >>> env = make_env("MetaWorld-push-v3", reward="shaped", max_episode_steps=500)
        >>> env = make_env("FetchPickAndPlace-v4", RandomizationConfig(), grasped_start=0.5)
    """
    spec = task if isinstance(task, TaskSpec) else get_task(task)
    problem = control_rate_problem(spec, control_hz) or reward_problem(spec, reward)
    if problem is not None:
        raise ValueError(problem)
    kwargs: dict[str, Any] = {} if spec.is_fetch else {"reward": reward}
    native_steps = max_episode_steps or spec.max_episode_steps
    if control_hz and control_hz != spec.native_hz:  # the same seconds at another rate
        steps = episode_steps(native_steps, control_hz, spec.native_hz)
        env = gym.make(spec.gym_id, max_episode_steps=steps, **kwargs)
        if spec.is_fetch:
            env = ControlRate(env, control_hz)  # sim/rate.py
        else:
            cast("MetaWorldGoal", env.unwrapped).set_control_rate(control_hz)  # sim/metaworld.py
    else:
        env = gym.make(spec.gym_id, max_episode_steps=native_steps, **kwargs)
    if grasped_start:
        env = GraspedStart(env, grasped_start)  # sim/grasped_start.py
    if randomization is not None and randomization.enabled:
        env = DomainRandomization(env, randomization)
    return env


def training_episode_steps(spec: TaskSpec, control_hz: float = 0.0) -> int:
    """Decisions in one training episode of `spec` at `control_hz` (0: its own rate): what make_env's
    time limit allows, so the most env steps one episode (one sampler push) can hold."""
    if control_hz and control_hz != spec.native_hz:
        return episode_steps(spec.max_episode_steps, control_hz, spec.native_hz)
    return spec.max_episode_steps


def reward_problem(spec: TaskSpec, reward: str) -> str | None:
    """Why `spec` cannot give `reward` (sim.reward), or None when it can."""
    if reward not in REWARDS:
        return f"sim.reward ({reward!r}) must be one of {REWARDS}"
    if reward == "shaped" and spec.is_fetch:
        return f"sim.reward ('shaped') must be 'sparse' for {spec.name}: only Meta-World tasks have a shaped reward"
    return None


def control_rate_problem(spec: TaskSpec, control_hz: float) -> str | None:
    """Why `spec` cannot run at `control_hz` (0: its own rate), or None when it can: Fetch runs at
    any rate (sim/rate.py), Meta-World at its own 80 Hz or faster (sim/metaworld.py)."""
    if control_hz and not spec.is_fetch and control_hz < spec.native_hz:
        return (
            f"sim.control_hz ({control_hz:g}) is below {spec.name}'s own {spec.native_hz:g} Hz: a Meta-World "
            "task runs at its own rate or faster (sim/metaworld.py)"
        )
    return None


def _goal_arrays(env: gym.Env, achieved: np.ndarray, desired: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    achieved, desired = np.asarray(achieved), np.asarray(desired)
    if achieved.shape != desired.shape or achieved.ndim == 0:
        raise ValueError(
            f"achieved_goal {achieved.shape} and desired_goal {desired.shape} must have the same "
            "shape [..., goal_dim]: goals are compared row by row"
        )
    # Goal envs observe a spaces.Dict (a Mapping) of Boxes; gym types observation_space as any Space.
    goal_dim = cast("Mapping[str, gym.spaces.Box]", env.observation_space)["desired_goal"].shape[-1]
    if achieved.shape[-1] != goal_dim:
        raise ValueError(f"goal arrays end in {achieved.shape[-1]}, this task's goal_dim is {goal_dim}")
    return achieved, desired


def goal_reward(env: gym.Env, achieved_goal: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
    """The task's own sparse reward for each (achieved, desired) row: 0 reached, -1 not.

    Used for HER relabeling, so it must be the env's reward, not a re-implementation:

        >>> r = goal_reward(env, achieved, future_goals)   # [N, 3], [N, 3] -> [N] float32
    """
    achieved, desired = _goal_arrays(env, achieved_goal, desired_goal)
    goal_env: Any = env.unwrapped  # a gymnasium_robotics GoalEnv: compute_reward is not on gym.Env, and untyped
    reward = goal_env.compute_reward(achieved, desired, {})
    return np.asarray(reward, dtype=np.float32).reshape(achieved.shape[:-1])


def goal_success(env: gym.Env, achieved_goal: np.ndarray, desired_goal: np.ndarray) -> np.ndarray:
    """Whether each achieved goal reaches the desired one: within the distance_threshold of a Fetch
    task, by the task's own rule for Meta-World (sim/metaworld_tasks.py).

    >>> goal_success(env, obs["achieved_goal"][None], obs["desired_goal"][None])
    array([False])
    """
    achieved, desired = _goal_arrays(env, achieved_goal, desired_goal)
    if isinstance(env.unwrapped, MetaWorldGoal):
        return np.asarray(env.unwrapped.goal_success(achieved, desired), bool)
    distance = np.linalg.norm(achieved - desired, axis=-1)
    goal_env: Any = env.unwrapped  # a gymnasium_robotics Fetch env: distance_threshold is not on gym.Env, and untyped
    return distance < goal_env.distance_threshold
