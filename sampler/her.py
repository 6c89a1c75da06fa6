"""Hindsight Experience Replay relabeling, 'future' strategy (Andrychowicz et al. 2017, sec. 3.3).

For an episode of T steps, every transition is stored once with its real goal and `k` more
times with a goal achieved later in the same episode (uniform over steps t..T-1), its reward
recomputed by the task's own reward function. Relabeling happens on the sampler, so the
buffer and the learners only ever see ordinary transitions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fleetrl.wire import Transitions

RewardFn = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (achieved, desired) -> reward [N]


@dataclass
class Episode:
    """One episode's arrays, leading dim T."""

    obs: np.ndarray
    achieved_goal: np.ndarray  # achieved goal *after* each step (from next observation)
    desired_goal: np.ndarray
    action: np.ndarray
    next_obs: np.ndarray
    terminated: np.ndarray

    def __len__(self) -> int:
        return int(self.action.shape[0])


def relabel_future(episode: Episode, k: int, reward_fn: RewardFn, rng: np.random.Generator) -> Transitions:
    """The episode's transitions plus k 'future' relabeled copies: (k + 1) * T rows."""
    T = len(episode)
    goals = [episode.desired_goal]
    for _ in range(k):
        future = rng.integers(np.arange(T), T)  # for each t, an index uniform in [t, T)
        goals.append(episode.achieved_goal[future])
    goal = np.concatenate(goals).astype(np.float32)
    achieved = np.tile(episode.achieved_goal, (k + 1, 1))
    reps = k + 1
    return Transitions(
        obs=np.tile(episode.obs, (reps, 1)).astype(np.float32),
        goal=goal,
        action=np.tile(episode.action, (reps, 1)).astype(np.float32),
        reward=np.asarray(reward_fn(achieved, goal), np.float32).reshape(-1),
        next_obs=np.tile(episode.next_obs, (reps, 1)).astype(np.float32),
        done=np.tile(episode.terminated, reps).astype(np.float32),
    )
