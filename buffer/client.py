"""The buffer's client classes: other roles use these, never the storage or service internals.

Learner side (reads Redis directly, no gRPC hop):

    with connect(redis_addresses) as redis_client:
        sampler = ReplaySampler(redis_client, run_id, schema, config, seed=learner_id)
        sampler.wait_for(min_replay_transitions, timeout_sec=60.0)
        batch = sampler.sample(256)      # SampledBatch(transitions, policy_version, task_id)

Sampler side (pushes over gRPC to an ingest service):

    with IngestClient(address, sampler_id=3, run_id=run_id, push_timeout_sec=10.0) as ingest:
        ack = ingest.push(transitions, seq=seq, policy_version=v, task_id=t, env_steps=n)
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import cast

import grpc
import numpy as np
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from buffer.api import SampledBatch
from buffer.layout import RecordLayout
from buffer.ratelimit import RATE_LIMITED, SampleToInsertRatio
from buffer.storage import TemporalStorage
from foundation.config import BufferConfig
from foundation.config_learning import REPLAY_SAMPLING
from foundation.errors import FleetrlError, RunFailed
from foundation.proto import fleetrl_pb2 as pb
from foundation.proto import fleetrl_pb2_grpc as pb_grpc
from foundation.transport import NO_SECURITY, UNREACHABLE_LOG_SEC, Backoff, Security
from foundation.wire import Transitions, TransitionSchema, batch_to_proto

log = logging.getLogger("fleetrl.buffer.client")
# A push refused by flow control is offered again after 25 ms, then 50, ... up to 400 ms: the
# learners' tolerance covers that much latency many times over, and the buffer parses fewer
# re-sent batches (a rate-limited sampler re-sent one every 10 ms at first: 40 RPCs/s).
RATE_LIMITED_POLL_SEC = 0.025
RATE_LIMITED_MAX_SEC = 0.4
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # a TransitionBatch; gRPC's own limit (transport.py) is larger


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


class PushRejected(FleetrlError, ValueError):
    """The ingest service refused a batch as invalid (INVALID_ARGUMENT); retrying cannot help."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"push rejected ({code.name}): {details}")
        self.code = code
        self.details = details


class IngestUnavailable(RunFailed, ConnectionError):
    """Push was retried for max_retry_sec without an ack."""


class IngestClient:
    """A sampler's connection to one ingest service: at-least-once pushes.

    push() retries UNAVAILABLE, DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED with capped
    exponential backoff until acked (flow control's RESOURCE_EXHAUSTED, "rate limited": from
    RATE_LIMITED_POLL_SEC up to RATE_LIMITED_MAX_SEC, counted in `rate_limited_sec`, never
    logged as a fault). The service
    stores each (sampler_id, incarnation, seq) once, so a retry of a batch that was in fact
    stored is answered `duplicate=True`. INVALID_ARGUMENT raises PushRejected at once; any
    other status propagates as grpc.RpcError.
    """

    RETRYABLE = (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    BACKOFF_FIRST_SEC = 0.05
    BACKOFF_MAX_SEC = 2.0

    def __init__(
        self,
        address: str,
        *,
        sampler_id: int,
        run_id: str,
        push_timeout_sec: float = 10.0,
        security: Security = NO_SECURITY,
    ) -> None:
        if push_timeout_sec <= 0:
            raise ValueError(f"push_timeout_sec ({push_timeout_sec}) must be > 0")
        self.address = address
        self.sampler_id = sampler_id
        self.run_id = run_id
        self.push_timeout_sec = push_timeout_sec
        self._channel = security.channel(address)
        self._stub = pb_grpc.ReplayIngestStub(self._channel)
        self._backoff = Backoff(f"ingest service {address}", self.BACKOFF_FIRST_SEC, self.BACKOFF_MAX_SEC, sampler_id)
        # New for every client, i.e. every sampler process start: with seq, the idempotency key.
        self.incarnation = secrets.randbits(63) or 1
        self.rate_limited_sec = 0.0  # waited on flow control (buffer/ratelimit.py): learners behind

    def __enter__(self) -> IngestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def push(
        self,
        transitions: Transitions,
        *,
        seq: int,
        policy_version: int,
        task_id: int,
        env_steps: int,
        episodes: int = 0,
        successes: int = 0,
        max_retry_sec: float | None = None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> pb.PushAck:
        """Push one batch until acked (an ack means it is in Redis); returns the PushAck.

        `seq` must grow by one per new batch of this sampler and stay the same on a re-push.
        `episodes` and `successes` count the training episodes that ended in this batch (the
        buffer's Stats report training success over the last 100 episodes from them).
        With `max_retry_sec`, gives up with IngestUnavailable after that long; by default it
        retries until `should_stop()` (then IngestUnavailable too): the caller's stop flag, so a
        sampler whose buffer is gone still stops promptly. While retrying it logs the
        unreachable service once a minute.
        """
        batch = batch_to_proto(
            transitions,
            run_id=self.run_id,
            sampler_id=self.sampler_id,
            seq=seq,
            policy_version=policy_version,
            task_id=task_id,
            env_steps=env_steps,
            episodes=episodes,
            successes=successes,
            incarnation=self.incarnation,
        )
        if batch.ByteSize() > MAX_MESSAGE_BYTES:
            # gRPC would refuse it with RESOURCE_EXHAUSTED, which is retried: fail here instead.
            raise ValueError(
                f"batch of {len(transitions)} transitions is {batch.ByteSize()} bytes, over the "
                f"{MAX_MESSAGE_BYTES}-byte message limit: push it in smaller batches"
            )
        backoff = self._backoff  # one per client: the once-a-minute log spans its pushes
        backoff.reset()
        held = RATE_LIMITED_POLL_SEC
        while True:
            try:
                return self._stub.Push(batch, timeout=self.push_timeout_sec)
            except grpc.RpcError as e:
                call = cast(grpc.Call, e)  # every RpcError raised by a unary call is also a Call
                code = call.code()
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise PushRejected(code, call.details()) from e
                if code not in self.RETRYABLE:
                    raise
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED and (call.details() or "").startswith(RATE_LIMITED):
                    if should_stop():  # flow control: learners are behind; wait for them, not past a stop
                        raise IngestUnavailable(f"push of seq {seq} still rate limited when stopping") from e
                    time.sleep(held)
                    self.rate_limited_sec += held
                    held = min(2 * held, RATE_LIMITED_MAX_SEC)  # each refusal re-sends the batch: ask less often
                    continue
                out_of_time = max_retry_sec is not None and backoff.elapsed_sec + backoff.delay > max_retry_sec
                if out_of_time or should_stop():
                    why = f"after {max_retry_sec}s" if out_of_time else "before stopping"
                    raise IngestUnavailable(
                        f"push of seq {seq} to {self.address} not acked {why}: "
                        f"last status {code.name}: {call.details()}"
                    ) from e
                backoff.wait(code.name, f"; still retrying seq {seq}")

    def stats(self, wait_for_ready: bool = False, timeout_sec: float | None = None) -> pb.BufferStats:
        """The service's counters (one call, no retry; `wait_for_ready` waits out a (re)start,
        for at most `timeout_sec`, default push_timeout_sec)."""
        timeout = self.push_timeout_sec if timeout_sec is None else timeout_sec
        return self._stub.Stats(pb.BufferStatsRequest(), timeout=timeout, wait_for_ready=wait_for_ready)
