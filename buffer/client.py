"""The learner's side of the buffer: it reads Redis directly, no gRPC hop. Other roles use
this, never the storage or service internals.

    with connect(redis_addresses) as redis_client:
        sampler = ReplaySampler(redis_client, run_id, schema, config, seed=learner_id)
        sampler.wait_for(min_replay_transitions, timeout_sec=60.0)
        batch = sampler.sample(256)      # SampledBatch(transitions, policy_version, task_id, demo)

Samplers push over gRPC to an ingest service through `buffer.ingest_client.IngestClient`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from buffer.api import SampledBatch
from buffer.draw import draw_slots
from buffer.quotas import TaskQuotas
from buffer.ratelimit import SampleLimiter, SampleToInsertRatio
from buffer.storage import TemporalStorage
from buffer.strategies import make_strategy
from buffer.window_cache import WindowCache
from foundation.config import BufferConfig
from foundation.errors import RunFailed
from foundation.transport import UNREACHABLE_LOG_SEC
from foundation.wire import TransitionSchema

log = logging.getLogger("fleetrl.buffer.client")


def _nothing() -> None:
    pass


class EmptyBufferError(RunFailed, RuntimeError):
    """sample() was called while the buffer holds no valid transition."""


class ReplaySampler:
    """Random batches from the live windows of one run (implements BatchSource).

    A composition of units that each stand alone:

    - `cache` (buffer/window_cache.py): the committed windows, read from Redis into a local
      replica (`ring`, buffer/replica.py), so sampling never waits on the network;
    - `strategy` (buffer/strategies.py), named by `sampling` (learner.replay_sampling):
      'uniform', 'recency' (`half_life`) or 'version' (`max_policy_lag`); buffer/draw.py draws
      a batch with it;
    - `quotas` (buffer/quotas.py), with `balance_tasks` (a multi-task run's registry task ids):
      every batch holds each task's share of rows, even or as set_task_shares says;
    - `limiter` (buffer/ratelimit.py), with `limit`: sampling waits while samplers lag.
    """

    def __init__(
        self,
        client: RedisCluster,
        run_id: str,
        schema: TransitionSchema,
        config: BufferConfig,
        seed: int,
        refresh_interval_sec: float = 0.05,
        sampling: str = "uniform",
        half_life: int = 200_000,
        max_policy_lag: int = 20_000,
        limit: SampleToInsertRatio | None = None,
        balance_tasks: tuple[int, ...] = (),
    ) -> None:
        self.sampling = sampling
        self.strategy = make_strategy(sampling, half_life, max_policy_lag)
        self.quotas = TaskQuotas(tuple(balance_tasks)) if len(balance_tasks) > 1 else None
        self.limiter = SampleLimiter(limit) if limit is not None else None
        self.lag_fallbacks = 0  # batches drawn from the newest rows: none was in the strategy's span
        storage = TemporalStorage(client, run_id, schema, config)
        self.layout = storage.layout
        self.cache = WindowCache(client, storage, WindowCache.ring_for(storage))
        self.ring = self.cache.ring
        self.refresh_interval_sec = refresh_interval_sec
        self._rng = np.random.default_rng(seed)
        self._last_refresh = -float("inf")
        self._last_warning = -UNREACHABLE_LOG_SEC

    @property
    def rate_limited_sec(self) -> float:
        """Seconds wait_to_sample() waited for the samplers (0 without a limit)."""
        return self.limiter.rate_limited_sec if self.limiter is not None else 0.0

    @property
    def balance_tasks(self) -> tuple[int, ...]:
        return self.quotas.tasks if self.quotas is not None else ()

    @property
    def task_shares(self) -> np.ndarray | None:
        return self.quotas.shares if self.quotas is not None else None

    def size(self) -> int:
        """Valid transitions in the local cache (what sample() draws from)."""
        return self.ring.valid_count

    def refresh(self) -> bool:
        """Read the committed head and fetch the records committed since; True if the cache
        changed. One round trip when nothing changed, two otherwise. With a limit, this
        learner's sampled rows are reported to the run's counter too."""
        self._last_refresh = time.monotonic()
        changed = self.cache.refresh()
        if self.limiter is not None:
            self.limiter.report(self.cache.storage.add_sampled)
        return changed

    def try_refresh(self) -> bool:
        """refresh(), but a Redis that does not answer is logged (once a minute) and the cache
        kept: a learner trains on what it holds while Redis is away."""
        try:
            return self.refresh()
        except (RedisError, RedisClusterException) as err:
            self._last_refresh = time.monotonic()
            if time.monotonic() - self._last_warning >= UNREACHABLE_LOG_SEC:
                self._last_warning = time.monotonic()
                log.warning("redis of run %r unreachable (%s); sampling from the cache", self.layout.run_id, err)
            return False

    def wait_to_sample(self, batch_size: int, stop: threading.Event, on_wait: Callable[[], object] = _nothing) -> bool:
        """Flow control: wait until the run's ratio lets `batch_size` more rows be sampled
        (refreshing, so inserts and other learners' samples count); False once `stop` is set.
        `on_wait()` runs at every poll that finds no room (a heartbeat)."""
        if self.limiter is None:
            return True
        return self.limiter.wait(lambda: self.ring.read_upto, batch_size, stop, self.try_refresh, on_wait)

    def wait_for(self, min_transitions: int, timeout_sec: float) -> int:
        """Refresh until at least `min_transitions` are cached; returns size() or raises TimeoutError."""
        deadline = time.monotonic() + timeout_sec
        while True:
            self.refresh()
            if self.size() >= min_transitions:
                return self.size()
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"replay buffer of run {self.layout.run_id!r} holds {self.size()} valid transitions "
                    f"after {timeout_sec}s, waited for {min_transitions}: are samplers pushing?"
                )
            time.sleep(max(self.refresh_interval_sec, 0.01))

    def sample(self, batch_size: int, version: int = 0) -> SampledBatch:
        """`batch_size` rows with replacement over the cached valid records, drawn as
        `sampling` says (`version`: the learner's, for 'version' sampling).

        Refreshes first when the last refresh is older than refresh_interval_sec.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size ({batch_size}) must be >= 1")
        if time.monotonic() - self._last_refresh >= self.refresh_interval_sec:
            self.try_refresh()
        if self.size() == 0:
            raise EmptyBufferError(
                f"replay buffer of run {self.layout.run_id!r} holds no valid transition yet; "
                "call wait_for(min_transitions, timeout_sec) before sampling"
            )
        drawn = draw_slots(self.ring, self.strategy, self.quotas, self._rng, batch_size, version)
        self.lag_fallbacks += drawn.fell_back
        records = self.ring.at(drawn.positions)
        if self.limiter is not None:
            self.limiter.drawn(batch_size)
        return SampledBatch(
            transitions=self.layout.transitions(records),
            policy_version=records["policy_version"].astype(np.int64),
            task_id=records["task_id"].astype(np.int64),
            demo=records["demo"] != 0,
        )

    def set_task_shares(self, shares: np.ndarray | None) -> None:
        """Each balance_tasks task's share of every batch from now on (None: even). The prefetch
        thread reads the newest: one assignment, no lock needed."""
        if self.quotas is not None:
            self.quotas.set_shares(shares)
        elif shares is not None:
            raise ValueError(f"task shares {np.asarray(shares).tolist()}: this sampler balances no tasks")
