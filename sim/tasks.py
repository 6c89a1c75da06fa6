"""The tasks of one run, and the one input width they share.

A run trains one task (`sim.task`) or several (`sim.tasks`, `fleetrl train --tasks A,B,C`).
Every role builds the same `TaskSet` from the config, so they agree on the transition schema,
the network input and each task's place in it:

    >>> tasks = TaskSet.for_run(config)                # FetchReach-v4 + FetchPush-v4
    >>> tasks.obs_dim, tasks.schema().obs_dim          # 25 + 2: the widest obs ++ a task one-hot
    (27, 27)
    >>> env = tasks.make_env(0, config.sim.randomization)  # Reach, its obs padded to 27
    >>> env = tasks.training_env(1, config)            # Push as a sampler trains in it
    >>> tasks.index(get_task("FetchPush-v4").task_id)  # registry id -> place in the run
    1

Tasks of different observation sizes are padded, not given input layers of their own. Each
observation is zero-padded to the widest task's size and followed by a one-hot of the task's
place in the run. The one-hot is the mask: it says which task the row is, hence which of the
padded dims are real. Why padding:
- one replay schema, so the buffer stores every task of the run in the same fixed-size records;
- one actor input, so samplers, learners, the evaluator and the exported ONNX graph all run
  one network;
- the dense policy also sees which task it acts in (FetchPush and FetchPickAndPlace have the
  same 25-d observation and differ only in where the goal lies).
Per-task input layers would need per-task weight groups, routing by task in every role and one
exported graph per task. With padding the cost is a few zero inputs (Reach: 15 of 27), and
one thing padding alone gets wrong: a dim that means the gripper's x in one task and a hand's
x in another mixes two distributions in one normalizer. So each task keeps its own input
statistics, picked by the one-hot (nets/models.py, Normalizer; model.task_norm).

A single-task run is a TaskSet of one: no padding, no one-hot, the task's own schema, as
before multi-task runs existed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from foundation.config import ConfigError, RandomizationConfig, RunConfig
from foundation.config_experience import GRASP_TASKS
from foundation.wire import TransitionSchema
from sim.registry import TaskSpec, get_task, make_env


@dataclass(frozen=True)
class TaskSet:
    tasks: tuple[TaskSpec, ...]

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ConfigError("a run needs at least one task")
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ConfigError(f"sim.tasks lists a task twice: {names}")
        for field in ("goal_dim", "act_dim"):
            values = {t.name: getattr(t, field) for t in self.tasks}
            if len(set(values.values())) > 1:
                raise ConfigError(f"sim.tasks: every task of a run needs the same {field}; got {values}")

    @classmethod
    def of(cls, names: Sequence[str | int]) -> TaskSet:
        return cls(tuple(get_task(n) for n in names))

    @classmethod
    def for_run(cls, config: RunConfig) -> TaskSet:
        """sim.tasks, or sim.task alone when sim.tasks is empty."""
        return cls.of(config.sim.tasks or (config.sim.task,))

    @classmethod
    def parse(cls, label: str) -> TaskSet:
        """The TaskSet a `label` names ("FetchReach-v4" or "FetchReach-v4,FetchPush-v4")."""
        return cls.of([name for name in label.split(",") if name])

    @property
    def label(self) -> str:
        """The task names, comma-joined: what checkpoints record as their "task"."""
        return ",".join(self.names)

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def multi(self) -> bool:
        return len(self.tasks) > 1

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tasks)

    @property
    def obs_dim(self) -> int:
        """The shared observation width: the widest task's, plus the task one-hot when several."""
        widest = max(t.obs_dim for t in self.tasks)
        return widest + len(self.tasks) if self.multi else widest

    @property
    def goal_dim(self) -> int:
        return self.tasks[0].goal_dim

    @property
    def act_dim(self) -> int:
        return self.tasks[0].act_dim

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(t.task_id for t in self.tasks)

    def schema(self) -> TransitionSchema:
        return TransitionSchema(obs_dim=self.obs_dim, goal_dim=self.goal_dim, act_dim=self.act_dim)

    def index(self, task_id: int) -> int:
        """The place of a registry task id in this run (what the task embedding is indexed by)."""
        try:
            return self.ids.index(int(task_id))
        except ValueError:
            known = dict(zip(self.names, self.ids, strict=True))
            raise KeyError(f"task id {task_id} is not one of this run's tasks {known}") from None

    def indices(self, task_ids: np.ndarray) -> np.ndarray:
        """Places of an array of registry task ids (KeyError names the first foreign id)."""
        lookup = np.full(max(self.ids) + 1, -1, np.int64)
        lookup[list(self.ids)] = np.arange(len(self.tasks))
        ids = np.asarray(task_ids, np.int64)
        bad = (ids < 0) | (ids >= len(lookup))
        out = np.where(bad, -1, lookup[np.clip(ids, 0, len(lookup) - 1)])
        if (out < 0).any():
            self.index(int(ids[out < 0][0]))  # raises, naming it
        return out

    def pad(self, obs: np.ndarray, index: int) -> np.ndarray:
        """A task's observation(s) [..., obs_dim_of_task] at the run's width."""
        if not self.multi:
            return obs
        obs = np.asarray(obs, np.float32)
        out = np.zeros((*obs.shape[:-1], self.obs_dim), np.float32)
        out[..., : obs.shape[-1]] = obs
        out[..., self.obs_dim - len(self.tasks) + index] = 1.0
        return out

    def make_env(
        self,
        index: int,
        randomization: RandomizationConfig | None = None,
        control_hz: float = 0.0,
        reward: str = "sparse",
        max_episode_steps: int = 0,
        grasped_start: float = 0.0,
    ) -> gym.Env:
        """Task `index`'s env (sim.registry.make_env), its observations at the run's width.
        `grasped_start` (sim.grasped_start: a sampler's training envs only) applies to a task that
        can grasp (FetchPickAndPlace-v4); the run's other tasks start as they always do."""
        spec = self.tasks[index]
        share = grasped_start if spec.name in GRASP_TASKS else 0.0
        env = make_env(spec, randomization, control_hz, reward, max_episode_steps, share)
        return PaddedObservation(env, self, index) if self.multi else env

    def training_env(self, index: int, config: RunConfig) -> gym.Env:
        """Task `index`'s env as a sampler trains in it: the run's randomization, rate and reward,
        and sim.grasped_start's held-object starts (sim/grasped_start.py). Scoring builds its envs
        with make_env (sim/measure.py), so no scored episode starts held."""
        sim = config.sim
        return self.make_env(index, sim.randomization, sim.control_hz, sim.reward, grasped_start=sim.grasped_start)

    def assigned(self, worker: int, workers: int) -> list[int]:
        """The task places a sampler works on: round-robin, so N samplers and N tasks give one
        task each, one sampler takes every task, and more samplers than tasks share them."""
        if workers <= len(self.tasks):
            return [i for i in range(len(self.tasks)) if i % workers == worker % workers]
        return [worker % len(self.tasks)]


class PaddedObservation(gym.ObservationWrapper):
    """obs["observation"] zero-padded to the run's width and followed by the task one-hot."""

    def __init__(self, env: gym.Env, tasks: TaskSet, index: int) -> None:
        super().__init__(env)
        self.tasks, self.task_index = tasks, index
        spaces: dict[str, Any] = dict(env.observation_space.spaces)  # type: ignore[attr-defined]
        spaces["observation"] = gym.spaces.Box(-np.inf, np.inf, (tasks.obs_dim,), np.float32)
        self.observation_space = gym.spaces.Dict(spaces)

    def observation(self, observation: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {**observation, "observation": self.tasks.pad(observation["observation"], self.task_index)}
