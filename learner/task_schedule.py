"""Which share of each batch each task of a multi-task run gets (learner.task_sampling).

    schedule = TaskSchedule(tasks.names, replay, agg, min_share=0.1)
    while learning:
        schedule.refresh()          # at most every refresh_sec: the evaluator's newest curve score
        batch = replay.sample(...)  # quotas by the shares it set

'even' (the default) gives every task batch_size / n rows. 'success' gives each task
`min_share` and the rest in proportion to 1 - its success on the evaluator's newest curve
score of the live policy (AggregatorStats.last_curve.task_success), so a task the policy
already solves keeps enough rows not to be forgotten while an unsolved one gets the learner.
Before any score, and while every task scores 1, the shares stay even.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Protocol

import grpc
import numpy as np

from foundation.proto import fleetrl_pb2 as pb

log = logging.getLogger(__name__)


def success_shares(success: Sequence[float], min_share: float) -> np.ndarray:
    """min_share each, the rest in proportion to 1 - success; even when every task is solved."""
    n = len(success)
    if not 0.0 <= min_share * n <= 1.0:
        raise ValueError(f"min_share ({min_share}) must be in [0, 1/{n}]: {n} tasks must fit in one batch")
    need = np.clip(1.0 - np.asarray(success, np.float64), 0.0, 1.0)
    if need.sum() <= 0:
        return np.full(n, 1.0 / n)
    return min_share + (1.0 - n * min_share) * need / need.sum()


class _Shares(Protocol):
    def set_task_shares(self, shares: np.ndarray | None) -> None: ...


class _Stats(Protocol):
    def stats(self, timeout_sec: float = 5.0) -> pb.AggregatorStats: ...


class TaskSchedule:
    """Polls the aggregator's newest curve score and sets the replay client's task shares."""

    def __init__(
        self, names: Sequence[str], replay: _Shares, agg: _Stats, min_share: float, refresh_sec: float = 5.0
    ) -> None:
        self.names, self.replay, self.agg = list(names), replay, agg
        self.min_share, self.refresh_sec = min_share, refresh_sec
        self.scored_version = -1  # the curve score the shares come from (-1: none yet)
        self.shares = np.full(len(self.names), 1.0 / len(self.names))
        self._next = 0.0

    def refresh(self) -> None:
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.refresh_sec
        try:
            curve = self.agg.stats(timeout_sec=2.0).last_curve
        except grpc.RpcError as err:  # the aggregator away: keep the shares, try again later
            log.debug("task schedule: no stats (%s)", err.code())
            return
        scores = dict(curve.task_success)
        if curve.version <= self.scored_version or not all(name in scores for name in self.names):
            return
        self.scored_version = curve.version
        self.shares = success_shares([scores[name] for name in self.names], self.min_share)
        self.replay.set_task_shares(self.shares)
        log.info(
            "task shares from the v%d curve score: %s",
            curve.version,
            dict(zip(self.names, self.shares.round(3), strict=True)),
        )
