"""The learner's side of the buffer: it reads Redis directly, no gRPC hop. Other roles use
this, never the storage or service internals.

    with connect(redis_addresses) as redis_client:
        sampler = ReplaySampler(redis_client, run_id, schema, config, seed=learner_id)
        sampler.wait_for(min_replay_transitions, timeout_sec=60.0)
        batch = sampler.sample(256)      # SampledBatch(transitions, policy_version, task_id)

Samplers push over gRPC to an ingest service through `buffer.ingest_client.IngestClient`.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from buffer.api import SampledBatch
from buffer.layout import RecordLayout
from buffer.ratelimit import RATE_LIMITED_POLL_SEC, SampleToInsertRatio
from buffer.storage import TemporalStorage
from foundation.config import BufferConfig
from foundation.config_learning import REPLAY_SAMPLING
from foundation.errors import RunFailed
from foundation.transport import UNREACHABLE_LOG_SEC
from foundation.wire import TransitionSchema

log = logging.getLogger("fleetrl.buffer.client")


class EmptyBufferError(RunFailed, RuntimeError):
    """sample() was called while the buffer holds no valid transition."""


class ReplaySampler:
    """Random batches from the live windows of one run (implements BatchSource).

    Keeps a local copy of every committed, live record in one ring array indexed by position
    (position % ring size), so sampling is a vectorized draw with no per-window loop. Only
    positions below the committed head are read, each once: they are final (written, or
    skipped as stalled and then marked invalid), so nothing is ever re-read.

    `sampling` (learner.replay_sampling): 'uniform' over every live row; 'recency': a row's
    weight halves every `half_life` positions of age (an exponential draw of the age); 'version':
    uniform over the rows whose policy version is at most `max_policy_lag` behind the version
    given to sample(), the buffer bucketed by version as the design's is. Positions are
    time-ordered and versions rise with time, so the eligible rows are a suffix of the ring,
    found by bisection and then checked row by row. When no row is young enough (samplers far
    behind), the newest rows stand in and `lag_fallbacks` counts it.

    `balance_tasks` (a multi-task run's registry task ids): every batch holds batch_size / n
    rows of each task (the remainder to the first ones), whatever each task's share of the
    buffer, or the shares set_task_shares gave. A task with no row yet leaves its quota to the
    others.
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
        if sampling not in REPLAY_SAMPLING:
            raise ValueError(f"sampling {sampling!r}: expected one of {REPLAY_SAMPLING}")
        self.sampling, self.half_life, self.max_policy_lag = sampling, half_life, max_policy_lag
        self.balance_tasks = tuple(balance_tasks) if len(balance_tasks) > 1 else ()
        self.task_shares: np.ndarray | None = None  # of balance_tasks; None: even
        self.lag_fallbacks = 0  # 'version' batches drawn from the newest rows: none was young enough
        self.limit = limit  # flow control: sampling waits while samplers lag (buffer/ratelimit.py)
        self.rate_limited_sec = 0.0
        self._sampled = 0  # rows sampled by every learner of the run, as of the last refresh
        self._unreported = 0  # rows this learner sampled since
        self.client = client
        self.layout = RecordLayout(run_id, schema, config)
        self._storage = TemporalStorage(client, run_id, schema, config)
        self.refresh_interval_sec = refresh_interval_sec
        self._rng = np.random.default_rng(seed)
        # Whole windows, enough for every live one plus the one being filled.
        windows = -(-config.capacity_transitions // config.window_size_transitions) + 2
        self._ring = np.zeros(windows * config.window_size_transitions, dtype=self.layout.dtype)
        self._read_upto = 0  # positions below this are in the ring (or evicted)
        self._low = 0  # oldest live position
        self._valid_count = 0
        self._last_refresh = -float("inf")
        self._last_warning = -UNREACHABLE_LOG_SEC

    def size(self) -> int:
        """Valid transitions in the local cache (what sample() draws from)."""
        return self._valid_count

    def refresh(self) -> bool:
        """Read the committed head and fetch the records committed since; True if the cache
        changed. One round trip when nothing changed, two otherwise."""
        self._last_refresh = time.monotonic()
        snapshot = self._storage.snapshot()
        if snapshot.committed == self._read_upto:
            snapshot = snapshot._replace(committed=self._storage.advance())  # past a stalled writer
        low = snapshot.oldest_window * self.layout.window_size
        changed = low > self._low
        if changed:
            self._drop_below(low)
        start = max(self._read_upto, low)
        if snapshot.committed > start:
            self._read(start, snapshot.committed, snapshot.skipped)
            changed = True
        self._read_upto = max(self._read_upto, snapshot.committed)
        if self.limit is not None:
            self._sampled, self._unreported = self._storage.add_sampled(self._unreported), 0
        return changed

    def wait_to_sample(self, batch_size: int, stop: threading.Event) -> bool:
        """Flow control: wait until the run's ratio lets `batch_size` more rows be sampled
        (refreshing, so inserts and other learners' samples count); False once `stop` is set."""
        if self.limit is None:
            return True
        waited = time.monotonic()
        while not self.limit.sample_ok(self._read_upto, self._sampled + self._unreported, batch_size):
            if stop.wait(RATE_LIMITED_POLL_SEC):
                return False
            self.try_refresh()
        self.rate_limited_sec += time.monotonic() - waited
        return True

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

    def _read(self, start: int, stop: int, skipped: tuple[tuple[int, int], ...]) -> None:
        pipe = self.client.pipeline(transaction=False)
        segments = list(self.layout.segments(start, stop - start))
        size = self.layout.record_bytes
        for seg in segments:
            first = seg.first_slot * size
            pipe.getrange(self.layout.window_key(seg.window), first, first + (seg.stop - seg.start) * size - 1)
        for seg, data in zip(segments, pipe.execute(), strict=True):
            records = self.layout.decode(data or b"")
            position = start + seg.start
            count = seg.stop - seg.start
            chunk = np.zeros(count, dtype=self.layout.dtype)  # missing bytes read as invalid
            chunk[: len(records)] = records[:count]
            for s_start, s_count in skipped:  # a skipped range is invalid whatever was written late
                lo, hi = max(s_start, position), min(s_start + s_count, position + count)
                if lo < hi:
                    chunk["valid"][lo - position : hi - position] = 0
            idx = self._slots(position, count)
            self._valid_count -= int(np.count_nonzero(self._ring["valid"][idx]))
            self._ring[idx] = chunk
            self._valid_count += int(np.count_nonzero(chunk["valid"]))

    def _slots(self, position: int, count: int) -> np.ndarray:
        return (position + np.arange(count)) % len(self._ring)

    def _drop_below(self, low: int) -> None:
        start = max(self._low, low - len(self._ring))
        if low > start:
            idx = self._slots(start, low - start)
            self._valid_count -= int(np.count_nonzero(self._ring["valid"][idx]))
            self._ring["valid"][idx] = 0
        self._low = low

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
        low, high = max(self._low, self._read_upto - len(self._ring)), self._read_upto
        oldest = version - self.max_policy_lag if self.sampling == "version" else None
        first = self._first_at_least(oldest, low, high) if oldest is not None else low
        # Rejection sampling: draw positions, redraw the few that are invalid (skipped, unwritten
        # or, by version, too old), and with balance_tasks those past their task's quota.
        quota = self._quota(batch_size)
        slots = np.empty(0, np.int64)
        for _ in range(100 if first < high else 0):
            wanted = batch_size - len(slots) if quota is None else int(quota.sum())
            draws = self._positions(first, high, 2 * wanted * (1 if quota is None else len(quota)) + 8)
            draws %= len(self._ring)
            ok = self._ring["valid"][draws] != 0
            if oldest is not None:
                ok &= self._ring["policy_version"][draws].astype(np.int64) >= oldest
            if quota is not None:
                draws, quota = self._fill_quota(draws[ok], quota)
                ok = np.ones(len(draws), bool)
            slots = np.concatenate([slots, draws[ok]])
            if len(slots) >= batch_size or (quota is not None and not quota.any()):
                break
        if quota is not None and 0 < len(slots) < batch_size:  # a task without rows: others fill in
            slots = np.concatenate([slots, self._rng.choice(slots, batch_size - len(slots))])
        if len(slots) < batch_size:  # no valid row young enough: the newest valid rows stand in
            self.lag_fallbacks += 1
            newest = self._slots(low, high - low)[::-1]
            newest = newest[self._ring["valid"][newest] != 0][: 4 * batch_size]
            slots = self._rng.choice(newest, batch_size)
        records = self._ring[slots[:batch_size]]
        self._unreported += batch_size
        return SampledBatch(
            transitions=self.layout.transitions(records),
            policy_version=records["policy_version"].astype(np.int64),
            task_id=records["task_id"].astype(np.int64),
        )

    def set_task_shares(self, shares: np.ndarray | None) -> None:
        """Each balance_tasks task's share of every batch from now on (None: even). The prefetch
        thread reads the newest: one assignment, no lock needed."""
        if shares is not None:
            shares = np.asarray(shares, np.float64)
            if shares.shape != (len(self.balance_tasks),) or not np.all(shares >= 0) or shares.sum() <= 0:
                raise ValueError(
                    f"task shares {shares.tolist()}: need {len(self.balance_tasks)} values >= 0 with a positive sum"
                )
            shares = shares / shares.sum()
        self.task_shares = shares

    def _quota(self, batch_size: int) -> np.ndarray | None:
        """Rows still wanted per task of balance_tasks (None: no balancing): even, or by
        task_shares (largest remainders, so the quotas sum to batch_size)."""
        if not self.balance_tasks:
            return None
        n, shares = len(self.balance_tasks), self.task_shares
        if shares is None:
            return np.array([batch_size // n + (i < batch_size % n) for i in range(n)], np.int64)
        exact = shares * batch_size
        quota = np.floor(exact).astype(np.int64)
        quota[np.argsort(quota - exact)[: batch_size - int(quota.sum())]] += 1
        return quota

    def _fill_quota(self, draws: np.ndarray, quota: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The draws each task still has room for, and the quota left after them. A task not
        hit once in 500 uniform draws (absent, or under ~1% of the rows) gives up its quota."""
        task = self._ring["task_id"][draws]
        kept, left = [], quota.copy()
        for i, task_id in enumerate(self.balance_tasks):
            mine = draws[task == task_id][: left[i]]
            kept.append(mine)
            left[i] = 0 if (len(mine) == 0 and len(draws) >= 500) else left[i] - len(mine)
        return np.concatenate(kept), left

    def _positions(self, low: int, high: int, n: int) -> np.ndarray:
        """`n` positions in [low, high): uniform, or by an exponential draw of their age."""
        if self.sampling != "recency":
            return self._rng.integers(low, high, size=n)
        # Inverse CDF of a geometric-like age with weight 2^(-age / half_life), truncated at
        # the oldest live row.
        span, rate = high - low, np.log(2.0) / self.half_life
        u = self._rng.random(n)
        age = np.floor(-np.log1p(-u * -np.expm1(-rate * span)) / rate).astype(np.int64)
        return high - 1 - np.minimum(age, span - 1)

    def _first_at_least(self, version: int, low: int, high: int) -> int:
        """The first position in [low, high) whose policy version is >= `version`, by bisection
        (versions rise with position; an invalid row counts as old)."""
        while low < high:
            mid = (low + high) // 2
            row = self._ring[mid % len(self._ring)]
            if row["valid"] and int(row["policy_version"]) >= version:
                high = mid
            else:
                low = mid + 1
        return low
