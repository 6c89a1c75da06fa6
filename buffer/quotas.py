"""Task quotas: how many rows of each task a multi-task batch holds.

    quotas = TaskQuotas(tasks=(0, 2, 5))        # a multi-task run's registry task ids
    quotas.set_shares([0.2, 0.3, 0.5])          # or None: even (learner.task_sampling decides)
    left = quotas.quota(256)                    # rows still wanted per task, summing to 256
    kept, left = quotas.fill(draws, task_of_draws, left)

Every batch holds batch_size / n rows of each task (the remainder to the first ones), whatever
each task's share of the buffer, or the shares set_shares gave. A task with no row yet (not hit
once in FILL_GIVE_UP uniform draws) gives its quota up to the others.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

FILL_GIVE_UP = 500  # draws without one row of a task: the task is absent, or under ~1% of the rows


class Filled(NamedTuple):
    kept: np.ndarray  # the draws each task had room for
    left: np.ndarray  # rows still wanted per task after them


class TaskQuotas:
    def __init__(self, tasks: tuple[int, ...]) -> None:
        if len(tasks) < 2 or len(set(tasks)) != len(tasks):
            raise ValueError(f"task quotas need two or more distinct task ids, got {tasks}")
        self.tasks = tuple(tasks)
        self.shares: np.ndarray | None = None  # of tasks, summing to 1; None: even

    def set_shares(self, shares: np.ndarray | None) -> None:
        """Each task's share of every batch from now on (None: even). A prefetch thread reads
        the newest: one assignment, no lock needed."""
        if shares is not None:
            shares = np.asarray(shares, np.float64)
            if shares.shape != (len(self.tasks),) or not np.all(shares >= 0) or shares.sum() <= 0:
                raise ValueError(
                    f"task shares {shares.tolist()}: need {len(self.tasks)} values >= 0 with a positive sum"
                )
            shares = shares / shares.sum()
        self.shares = shares

    def quota(self, batch_size: int) -> np.ndarray:
        """Rows wanted per task: even, or by shares (largest remainders, so the quotas sum to
        batch_size)."""
        n, shares = len(self.tasks), self.shares
        if shares is None:
            return np.array([batch_size // n + (i < batch_size % n) for i in range(n)], np.int64)
        exact = shares * batch_size
        quota = np.floor(exact).astype(np.int64)
        quota[np.argsort(quota - exact)[: batch_size - int(quota.sum())]] += 1
        return quota

    def fill(self, draws: np.ndarray, task: np.ndarray, left: np.ndarray) -> Filled:
        """The draws (`task`: each one's task id) each task still has room for, in order, and
        the quota left after them. A task not hit once in FILL_GIVE_UP draws gives up its quota."""
        kept, left = [], left.copy()
        for i, task_id in enumerate(self.tasks):
            mine = draws[task == task_id][: left[i]]
            kept.append(mine)
            left[i] = 0 if (len(mine) == 0 and len(draws) >= FILL_GIVE_UP) else left[i] - len(mine)
        return Filled(np.concatenate(kept), left)
