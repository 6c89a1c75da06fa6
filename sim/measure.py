"""How an evaluation episode is scored: each task as its benchmark scores it, or as it trains.

    env = eval_env(tasks, index, randomization, control_hz, reward, measure="field")
    episode, success = rollout(env, policy, seed=s, rng=rng, deterministic=True)

- "field": Meta-World's measure for a Meta-World task (success = its info["success"] at any
  step of a 500-step episode, the horizon of its benchmarks); a Fetch task's own (the last
  step of its 50), which is its training horizon already.
- "training": the registry's training horizon (max_episode_steps) and the last step's success.

Success at any step is scored by ending the episode at its first successful step
(`EndOnSuccess`): the last step's flag is then the any-step verdict, and a solved episode costs
only the steps it took. The episode's return covers those steps.
"""

from __future__ import annotations

import gymnasium as gym

from foundation.config import RandomizationConfig
from sim.tasks import TaskSet

MEASURES = ("field", "training")


class EndOnSuccess(gym.Wrapper):
    """Truncates an episode at its first step whose info["is_success"] is set."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated or bool(info.get("is_success", 0.0)), info


def eval_env(
    tasks: TaskSet,
    index: int,
    randomization: RandomizationConfig | None = None,
    control_hz: float = 0.0,
    reward: str = "sparse",
    measure: str = "field",
) -> gym.Env:
    """Task `index` of the run, built to be scored by `measure` (the module docstring)."""
    if measure not in MEASURES:
        raise ValueError(f"eval.measure ({measure!r}) must be one of {MEASURES}")
    spec = tasks.tasks[index]
    if measure == "training":
        return tasks.make_env(index, randomization, control_hz, reward)
    env = tasks.make_env(index, randomization, control_hz, reward, spec.eval_episode_steps)
    return EndOnSuccess(env) if spec.success_at_any_step else env
