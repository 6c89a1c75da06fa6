"""Meta-World v3 tasks as goal envs, so fleetrl's HER samplers train them like Fetch.

    env = make_env("MetaWorld-reach-v3")     # sim/registry.py registers these ids
    obs, info = env.reset(seed=0)
    obs["observation"].shape, obs["desired_goal"].shape   # (36,), (3,)

Meta-World (metaworld 3.1.1, pinned with mujoco 3.3.0 in one resolve) gives a flat 39-d
observation whose last 3 entries are the goal position, a dense shaped reward and
info["success"]. fleetrl learns goal-conditioned policies with HER, which needs what Fetch's
GoalEnv gives: observation, achieved_goal and desired_goal apart, and a reward function of
(achieved, desired) to relabel with. So each task here names what its goal is about:

    task                   achieved_goal           success
    MetaWorld-reach-v3     the hand (obs[0:3])     within 5 cm of the goal
    MetaWorld-push-v3      the puck (obs[4:7])     within 5 cm of the goal

and the reward is Fetch's sparse one: 0 within the threshold, -1 otherwise. The observation is
the other 36 entries (hand, gripper, objects, and the previous frame's). Episodes have a fixed
horizon (no termination on success) shorter than Meta-World's 500 steps: the registry's
max_episode_steps. Each reset picks one of Meta-World's 50 variations of the task (MT1's train
tasks: goal and object positions) with the env's own seeded generator, so reset(seed=s)
gives the same episode start every time, as the evaluator's held-out seeds need.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

GOAL = slice(36, 39)  # where Meta-World's v3 observation holds the goal position
ACHIEVED = {"reach-v3": slice(0, 3), "push-v3": slice(4, 7)}  # hand, and the first object


class MetaWorldGoal(gym.Env):
    """One Meta-World v3 task (`env_name`, e.g. "reach-v3") with Fetch's goal-env interface:
    dict observations, compute_reward(achieved, desired, info) and distance_threshold."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, env_name: str, distance_threshold: float = 0.05) -> None:
        try:
            import metaworld
        except ImportError as err:
            raise ImportError(
                "Meta-World tasks need metaworld: pip install metaworld==3.1.1 mujoco==3.3.0 (in one command)"
            ) from err
        if env_name not in ACHIEVED:
            raise ValueError(f"Meta-World task {env_name!r}: fleetrl knows {sorted(ACHIEVED)}")
        benchmark = metaworld.MT1(env_name, seed=0)  # the task's 50 variations, fixed
        self._variations = benchmark.train_tasks
        # Meta-World's own path limit (500) never ends an episode: fleetrl's is shorter.
        self._env = benchmark.train_classes[env_name]()
        self._achieved = ACHIEVED[env_name]
        self.distance_threshold = distance_threshold
        self.action_space = self._env.action_space
        box = lambda n: gym.spaces.Box(-np.inf, np.inf, (n,), np.float64)  # noqa: E731
        self.observation_space = gym.spaces.Dict(
            {"observation": box(36), "achieved_goal": box(3), "desired_goal": box(3)}
        )

    @property
    def model(self):
        """The MuJoCo model (sim/randomization.py scales its dynamics)."""
        return self._env.model

    def _split(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        flat = np.asarray(flat, np.float64)
        return {
            "observation": np.concatenate([flat[: GOAL.start], flat[GOAL.stop :]]),
            "achieved_goal": flat[self._achieved].copy(),
            "desired_goal": flat[GOAL].copy(),
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._env.set_task(self._variations[int(self.np_random.integers(len(self._variations)))])
        flat, info = self._env.reset()
        return self._split(flat), dict(info)

    def step(self, action):
        flat, _, _, _, info = self._env.step(np.asarray(action, np.float32))
        obs = self._split(flat)
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], info))
        return obs, reward, False, False, {**info, "is_success": float(reward == 0.0)}

    def compute_reward(self, achieved_goal, desired_goal, info) -> np.ndarray:
        distance = np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1)
        return -(distance > self.distance_threshold).astype(np.float32)

    def close(self) -> None:
        self._env.close()
