"""Hindsight Experience Replay relabeling, 'future' strategy (Andrychowicz et al. 2017, sec. 3.3).

For an episode of T steps, every transition is stored once with its real goal and `k` more
times with a goal achieved later in the same episode (uniform over steps t..T-1), its reward
recomputed by the task's own reward function. Relabeling happens on the sampler, so the
buffer and the learners only ever see ordinary transitions.

An episode whose achieved goal never left the success region it started in (FetchPush's
object untouched) can be given fewer copies (`k_unmoved`): its relabeled goals are all where
the object already was, each a free success that says nothing about moving it. Fewer of them
make the episodes that moved something a larger share of every batch.

A shaped reward (sim.reward "shaped": Meta-World's own dense reward) is a function of the whole
simulator state, not of (achieved, desired), so no other goal's reward can be recomputed:
`own_reward_rows` stores such an episode once, with the rewards the env gave.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from foundation.acting import Episode
from foundation.wire import Transitions

RewardFn = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (achieved, desired) -> reward [N]


def moved(episode: Episode, reward_fn: RewardFn) -> bool:
    """Did the achieved goal ever leave the region where the task counts its first value as
    achieved? (the task's own reward of being there is the reference)"""
    start = np.broadcast_to(episode.achieved_goal[0], episode.achieved_goal.shape)
    at_start = np.asarray(reward_fn(start[:1], start[:1]), np.float64).reshape(-1)[0]
    return bool((np.asarray(reward_fn(episode.achieved_goal, start), np.float64) < at_start).any())


def relabel_future(
    episode: Episode,
    k: int,
    reward_fn: RewardFn,
    rng: np.random.Generator,
    k_unmoved: int = -1,
    n_step: int = 1,
    gamma: float = 1.0,
) -> Transitions:
    """The episode's transitions plus k 'future' relabeled copies: (k + 1) * T rows; k_unmoved
    copies instead (when 0 <= k_unmoved < k) for an episode whose achieved goal never moved.
    `n_step` > 1: n-step rows with rewards discounted by `gamma` (the module's docstring), and
    (k + 1) * (T - n_step + 1) rows for an episode that ends truncated."""
    if n_step < 1:
        raise ValueError(f"n_step ({n_step}) must be >= 1")
    if 0 <= k_unmoved < k and not moved(episode, reward_fn):
        k = k_unmoved
    T = len(episode)
    goals = [episode.desired_goal]
    for _ in range(k):
        future = rng.integers(np.arange(T), T)  # for each t, an index uniform in [t, T)
        goals.append(episode.achieved_goal[future])
    goal = np.concatenate(goals).astype(np.float32)
    reps = k + 1
    if n_step == 1:
        achieved = np.tile(episode.achieved_goal, (reps, 1))
        return Transitions(
            obs=np.tile(episode.obs, (reps, 1)).astype(np.float32),
            goal=goal,
            action=np.tile(episode.action, (reps, 1)).astype(np.float32),
            reward=np.asarray(reward_fn(achieved, goal), np.float32).reshape(-1),
            next_obs=np.tile(episode.next_obs, (reps, 1)).astype(np.float32),
            done=np.tile(episode.terminated, reps).astype(np.float32),
        )
    return _n_step_rows(episode, goal.reshape(reps, T, -1), reward_fn, n_step, gamma)


def own_reward_rows(episode: Episode, n_step: int = 1, gamma: float = 1.0) -> Transitions:
    """The episode's T transitions with the env's own rewards and its real goal, no relabeled
    copy; n-step rewards as relabel_future's (T - n_step + 1 rows for a truncated episode)."""
    if n_step < 1:
        raise ValueError(f"n_step ({n_step}) must be >= 1")
    starts = _row_starts(episode, n_step)
    T = len(episode)
    reward = np.zeros(len(starts), np.float64)
    for i in range(n_step):
        step = starts + i
        live = step < T  # a terminated episode's last rows have fewer than n steps left
        reward[live] += gamma**i * episode.reward[step[live]].astype(np.float64)
    last = np.minimum(starts + n_step - 1, T - 1)  # the step each row bootstraps after
    return Transitions(
        obs=episode.obs[starts].astype(np.float32),
        goal=episode.desired_goal[starts].astype(np.float32),
        action=episode.action[starts].astype(np.float32),
        reward=reward.astype(np.float32),
        next_obs=episode.next_obs[last].astype(np.float32),
        done=episode.terminated[last].astype(np.float32),
    )


def _row_starts(episode: Episode, n: int) -> np.ndarray:
    """The steps that begin an n-step row: every step of a terminated episode, and of a truncated
    one each step with n steps after it."""
    T = len(episode)
    terminal = bool(episode.terminated[-1])  # only an episode's last step can end it
    if not terminal and T < n:
        raise ValueError(f"an episode truncated after {T} steps holds no {n}-step row: learner.n_step must be <= {T}")
    return np.arange(T if terminal else max(0, T - n + 1))


def _n_step_rows(episode: Episode, goal: np.ndarray, reward_fn: RewardFn, n: int, gamma: float) -> Transitions:
    """Rows t of every copy (goal [copies, T, goal_dim]) with n-step rewards and next observations."""
    copies, T = goal.shape[:2]
    starts = _row_starts(episode, n)
    reward = np.zeros((copies, len(starts)), np.float64)
    for i in range(n):
        step = starts + i
        live = step < T  # a terminated episode's last rows have fewer than n steps left
        if not live.any():
            break
        achieved = np.broadcast_to(episode.achieved_goal[step[live]], (copies, int(live.sum()), goal.shape[2]))
        r = reward_fn(achieved.reshape(-1, goal.shape[2]), goal[:, starts[live]].reshape(-1, goal.shape[2]))
        reward[:, live] += gamma**i * np.asarray(r, np.float64).reshape(copies, -1)
    last = np.minimum(starts + n - 1, T - 1)  # the step each row bootstraps after
    rows = len(starts) * copies
    return Transitions(
        obs=np.tile(episode.obs[starts], (copies, 1)).astype(np.float32),
        goal=np.ascontiguousarray(goal[:, starts].reshape(rows, -1), np.float32),
        action=np.tile(episode.action[starts], (copies, 1)).astype(np.float32),
        reward=reward.reshape(-1).astype(np.float32),
        next_obs=np.tile(episode.next_obs[last], (copies, 1)).astype(np.float32),
        done=np.tile(episode.terminated[last], copies).astype(np.float32),
    )
