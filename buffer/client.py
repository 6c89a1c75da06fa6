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

import random
import time
from dataclasses import dataclass, field
from typing import cast

import grpc
import numpy as np
from redis.cluster import RedisCluster

from buffer.api import SampledBatch
from buffer.layout import RecordLayout
from buffer.storage import Snapshot, TemporalStorage
from fleetrl.config import BufferConfig
from fleetrl.proto import fleetrl_pb2 as pb
from fleetrl.proto import fleetrl_pb2_grpc as pb_grpc
from fleetrl.wire import Transitions, TransitionSchema, batch_to_proto

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
# A fully reserved window whose unwritten slots stay unwritten this long is taken as final:
# the ingest server that reserved them died before writing. Until then it is re-read.
GAP_GIVE_UP_SEC = 10.0


class EmptyBufferError(RuntimeError):
    """sample() was called while the buffer holds no valid transition."""


@dataclass
class _CachedWindow:
    records: np.ndarray  # one window's records; slots not read yet are zero (valid == 0)
    valid_prefix: int = 0  # records[:valid_prefix] are all valid; reading resumes here
    valid_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # valid slots
    gap_since: float | None = None  # when a fully reserved window was first seen with gaps


class ReplaySampler:
    """Uniform random batches from the live windows of one run (implements BatchSource).

    Keeps a local copy of every live window: a window is read once when complete and then
    only dropped on eviction; the newest, still growing window is read incrementally with
    GETRANGE from the end of its valid prefix. Reserved slots whose write is still in flight
    read as zeros and are skipped until a later refresh finds them written.
    """

    def __init__(
        self,
        client: RedisCluster,
        run_id: str,
        schema: TransitionSchema,
        config: BufferConfig,
        seed: int,
        refresh_interval_sec: float = 0.05,
    ) -> None:
        self.client = client
        self.layout = RecordLayout(run_id, schema, config)
        self._storage = TemporalStorage(client, run_id, schema, config)
        self.refresh_interval_sec = refresh_interval_sec
        self._rng = np.random.default_rng(seed)
        self._windows: dict[int, _CachedWindow] = {}
        self._snapshot = Snapshot(0, 0)
        self._last_refresh = -float("inf")
        self._index: tuple[list[int], np.ndarray] = ([], np.zeros(0, np.int64))

    def size(self) -> int:
        """Valid transitions in the local cache (what sample() draws from)."""
        return int(self._index[1][-1]) if len(self._index[1]) else 0

    def refresh(self) -> bool:
        """Read the head and fetch new records; True if the cache changed.

        Costs one round trip when nothing changed, two otherwise (one pipelined read of every
        window with new records).
        """
        self._last_refresh = time.monotonic()
        snapshot = self._storage.snapshot()
        changed = self._evict(snapshot.oldest_window)
        self._snapshot = snapshot
        reads = self._pending_reads(snapshot)
        if reads:
            pipe = self.client.pipeline(transaction=False)
            for window, start, stop in reads:
                key = self.layout.window_key(window)
                if start == 0 and stop == self.layout.window_size:
                    pipe.get(key)
                else:
                    pipe.getrange(key, start * self.layout.record_bytes, stop * self.layout.record_bytes - 1)
            for (window, start, _), data in zip(reads, pipe.execute(), strict=True):
                changed |= self._merge(window, start, data or b"")
        if changed:
            self._rebuild_index()
        return changed

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

    def sample(self, batch_size: int) -> SampledBatch:
        """`batch_size` rows uniformly with replacement over every cached valid record.

        Refreshes first when the last refresh is older than refresh_interval_sec.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size ({batch_size}) must be >= 1")
        if time.monotonic() - self._last_refresh >= self.refresh_interval_sec:
            self.refresh()
        windows, cumulative = self._index
        if self.size() == 0:
            raise EmptyBufferError(
                f"replay buffer of run {self.layout.run_id!r} holds no valid transition yet; "
                "call wait_for(min_transitions, timeout_sec) before sampling"
            )
        draws = self._rng.integers(0, self.size(), size=batch_size)
        which = np.searchsorted(cumulative, draws, side="right")
        records = np.empty(batch_size, dtype=self.layout.dtype)
        for i in np.unique(which):
            rows = which == i
            cached = self._windows[windows[i]]
            first = cumulative[i - 1] if i > 0 else 0
            records[rows] = cached.records[cached.valid_idx[draws[rows] - first]]
        return SampledBatch(
            transitions=self.layout.transitions(records),
            policy_version=records["policy_version"].astype(np.int64),
            task_id=records["task_id"].astype(np.int64),
        )

    def _evict(self, oldest_window: int) -> bool:
        dead = [w for w in self._windows if w < oldest_window]
        for window in dead:
            del self._windows[window]
        return bool(dead)

    def _pending_reads(self, snapshot: Snapshot) -> list[tuple[int, int, int]]:
        """(window, first slot, stop slot) of every live window with slots not yet read valid."""
        reads = []
        now = time.monotonic()
        for window in range(snapshot.oldest_window, self.layout.windows_below(snapshot.head)):
            reserved = self.layout.reserved_in(window, snapshot.head)
            cached = self._windows.get(window)
            start = cached.valid_prefix if cached else 0
            if start >= reserved:
                continue
            if cached and cached.gap_since is not None and now - cached.gap_since > GAP_GIVE_UP_SEC:
                continue
            reads.append((window, start, reserved))
        return reads

    def _merge(self, window: int, start: int, data: bytes) -> bool:
        cached = self._windows.get(window)
        if cached is None:
            records = np.zeros(self.layout.window_size, dtype=self.layout.dtype)
            cached = self._windows[window] = _CachedWindow(records)
        new = self.layout.decode(data)
        if not len(new):
            return False
        cached.records[start : start + len(new)] = new
        invalid = np.flatnonzero(new["valid"] == 0)
        cached.valid_prefix = start + (int(invalid[0]) if len(invalid) else len(new))
        cached.valid_idx = np.flatnonzero(cached.records["valid"])
        fully_reserved = self.layout.reserved_in(window, self._snapshot.head) == self.layout.window_size
        if cached.valid_prefix < self.layout.window_size and fully_reserved and cached.gap_since is None:
            cached.gap_since = time.monotonic()
        return True

    def _rebuild_index(self) -> None:
        windows = sorted(w for w, c in self._windows.items() if len(c.valid_idx))
        counts = [len(self._windows[w].valid_idx) for w in windows]
        self._index = (windows, np.cumsum(np.asarray(counts, dtype=np.int64)))


class PushRejected(ValueError):
    """The ingest service refused a batch as invalid (INVALID_ARGUMENT); retrying cannot help."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"push rejected ({code.name}): {details}")
        self.code = code
        self.details = details


class IngestUnavailable(ConnectionError):
    """Push was retried for max_retry_sec without an ack."""


class IngestClient:
    """A sampler's connection to one ingest service: at-least-once pushes.

    push() retries UNAVAILABLE, DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED with capped
    exponential backoff until acked; the service dedups on (sampler_id, seq), so a retry of a
    batch that was in fact stored is answered `duplicate=True`. INVALID_ARGUMENT raises
    PushRejected at once; any other status propagates as grpc.RpcError.
    """

    RETRYABLE = (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    BACKOFF_FIRST_SEC = 0.05
    BACKOFF_MAX_SEC = 2.0

    def __init__(self, address: str, *, sampler_id: int, run_id: str, push_timeout_sec: float = 10.0) -> None:
        if push_timeout_sec <= 0:
            raise ValueError(f"push_timeout_sec ({push_timeout_sec}) must be > 0")
        self.address = address
        self.sampler_id = sampler_id
        self.run_id = run_id
        self.push_timeout_sec = push_timeout_sec
        self._channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        self._stub = pb_grpc.ReplayIngestStub(self._channel)
        self._jitter = random.Random(sampler_id)

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
        max_retry_sec: float | None = None,
    ) -> pb.PushAck:
        """Push one batch until acked (an ack means it is in Redis); returns the PushAck.

        `seq` must grow by one per new batch of this sampler and stay the same on a re-push.
        With `max_retry_sec`, gives up with IngestUnavailable after that long; by default it
        retries forever (the launcher's watchdog owns giving up on a dead service).
        """
        batch = batch_to_proto(
            transitions,
            run_id=self.run_id,
            sampler_id=self.sampler_id,
            seq=seq,
            policy_version=policy_version,
            task_id=task_id,
            env_steps=env_steps,
        )
        if batch.ByteSize() > MAX_MESSAGE_BYTES:
            # gRPC would refuse it with RESOURCE_EXHAUSTED, which is retried: fail here instead.
            raise ValueError(
                f"batch of {len(transitions)} transitions is {batch.ByteSize()} bytes, over the "
                f"{MAX_MESSAGE_BYTES}-byte message limit: push it in smaller batches"
            )
        start, delay = time.monotonic(), self.BACKOFF_FIRST_SEC
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
                if max_retry_sec is not None and time.monotonic() - start + delay > max_retry_sec:
                    raise IngestUnavailable(
                        f"push of seq {seq} to {self.address} not acked after {max_retry_sec}s: "
                        f"last status {code.name}: {call.details()}"
                    ) from e
            time.sleep(delay * self._jitter.uniform(0.5, 1.0))
            delay = min(2 * delay, self.BACKOFF_MAX_SEC)

    def stats(self, wait_for_ready: bool = False) -> pb.BufferStats:
        """The service's counters (one call, no retry; `wait_for_ready` waits out a (re)start)."""
        return self._stub.Stats(pb.BufferStatsRequest(), timeout=self.push_timeout_sec, wait_for_ready=wait_for_ready)
