"""Which share of a multi-task run's batches and env steps each task gets (learner.task_sampling).

    schedule = TaskSchedule(tasks.names, agg, min_share=0.1, apply=replay.set_task_shares, mode="success")
    while learning:
        schedule.refresh()          # at most every refresh_sec: the evaluator's newest curve score
        batch = replay.sample(...)  # quotas by the shares it set

    picker = TaskPicker(len(mine))              # a sampler: which of its tasks acts next
    schedule = TaskSchedule(names, agg, 0.1, apply=lambda s: picker.set_shares(s[mine]))
    turn = picker.pick(); ...; picker.record(turn, len(episode))

'even' (the default) gives every task batch_size / n rows and the same number of env steps.
'success' gives each task `min_share` and the rest in proportion to 1 - its success on the
evaluator's newest curve score of the live policy (AggregatorStats.last_curve.task_success),
so a task the policy already solves keeps enough rows and new episodes not to be forgotten,
while an unsolved one gets the learner and the samplers. Before any score, and while every
task scores 1, the shares stay even.
'focus' gives each task `min_share` and the rest to one task: the first, in the run's task
order (`--tasks A,B,C`), whose newest curve score is below the run's target_success. Tasks are
then learned one after another, each solved one rehearsed at min_share. Why: on a 2-core
machine a 4-task run's learner and samplers are the scarce part, and FetchPush learns nothing
until it has had some tens of thousands of updates and env steps of its own (single-task
onsets: 14k-38k updates). Shared in proportion to 1 - success, an unsolved task that cannot
be learned in the run (MetaWorld-push) took as much as FetchPush for the whole run and
FetchPush stayed at 0.00-0.08 for 30 minutes. With task-routed experts that share no weight,
learning one task at a time gives up no transfer. The order is the user's: a first task that
is never solved keeps the others at min_share (they still learn, slowly). The two modes on the
4-task set: docs/presets.md, "Multi-task runs".

Samplers divide env steps, not episodes: Meta-World's episodes are 150-500 steps where
Fetch's are 50, so taking episodes in turn gave FetchPush 15,600 of a 4-task run's 109k env
steps in a 45-minute run. A TaskPicker takes the
task furthest behind its share of the env steps taken so far (deficit round-robin).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc
import numpy as np

from foundation.config import SCORED_SAMPLING, RunConfig
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


def focus_shares(success: Sequence[float], min_share: float, target: float) -> np.ndarray:
    """min_share each, the rest to the first task scoring below `target`; even when every task
    reaches it."""
    n = len(success)
    if not 0.0 <= min_share * n <= 1.0:
        raise ValueError(f"min_share ({min_share}) must be in [0, 1/{n}]: {n} tasks must fit in one batch")
    unsolved = [i for i, rate in enumerate(success) if rate < target]
    if not unsolved:
        return np.full(n, 1.0 / n)
    shares = np.full(n, min_share)
    shares[unsolved[0]] += 1.0 - n * min_share
    return shares


def task_shares(mode: str, success: Sequence[float], min_share: float, target: float) -> np.ndarray:
    """The shares learner.task_sampling `mode` ('success' or 'focus') gives these scores."""
    if mode == "focus":
        return focus_shares(success, min_share, target)
    return success_shares(success, min_share)


class _Stats(Protocol):
    def stats(self, timeout_sec: float = 5.0) -> pb.AggregatorStats: ...


class TaskSchedule:
    """Polls the aggregator's newest curve score and hands each new set of shares to `apply`
    (a replay client's set_task_shares, a sampler's TaskPicker)."""

    def __init__(
        self,
        names: Sequence[str],
        agg: _Stats,
        min_share: float,
        apply: Callable[[np.ndarray], None],
        refresh_sec: float = 5.0,
        mode: str = "success",
        target: float = 0.9,
    ) -> None:
        if mode not in SCORED_SAMPLING:
            raise ValueError(f"task schedule mode {mode!r}: expected one of {SCORED_SAMPLING}")
        self.names, self.agg, self.apply = list(names), agg, apply
        self.min_share, self.refresh_sec = min_share, refresh_sec
        self.mode, self.target = mode, target
        self.scored_version = -1  # the curve score the shares come from (-1: none yet)
        self.shares = np.full(len(self.names), 1.0 / len(self.names))
        self._next = 0.0

    @classmethod
    def for_run(
        cls, config: RunConfig, names: Sequence[str], agg: _Stats, apply: Callable[[np.ndarray], None]
    ) -> TaskSchedule | None:
        """The run's schedule by learner.task_sampling ('success' or 'focus'); None for 'even'."""
        if config.learner.task_sampling not in SCORED_SAMPLING:
            return None
        mode, target = config.learner.task_sampling, config.target_success
        return cls(names, agg, config.learner.task_min_share, apply, mode=mode, target=target)

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
        self.shares = task_shares(self.mode, [scores[name] for name in self.names], self.min_share, self.target)
        self.apply(self.shares)
        log.info(
            "task shares (%s) from the v%d curve score: %s",
            self.mode,
            curve.version,
            {name: round(float(share), 3) for name, share in zip(self.names, self.shares, strict=True)},
        )


class TaskPicker:
    """Which of a sampler's tasks acts next: the one furthest behind its share of the env
    steps this sampler has taken (even shares until set_shares)."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"a sampler needs at least one task, got {n}")
        self.steps = np.zeros(n, np.int64)
        self.shares = np.full(n, 1.0 / n)

    def set_shares(self, shares: np.ndarray) -> None:
        """This sampler's tasks' shares of the run (renormalized over them)."""
        shares = np.asarray(shares, np.float64)
        if shares.shape != self.steps.shape or np.any(shares < 0) or shares.sum() <= 0:
            raise ValueError(f"shares {shares.tolist()} do not fit {len(self.steps)} tasks")
        self.shares = shares / shares.sum()

    def pick(self) -> int:
        deficit = self.shares * (self.steps.sum() + 1) - self.steps
        # a share of 0 is never picked; ties go to the lowest index, so the first picks are in order
        deficit[self.shares <= 0] = -np.inf
        return int(np.argmax(deficit))

    def record(self, turn: int, env_steps: int) -> None:
        self.steps[turn] += env_steps
