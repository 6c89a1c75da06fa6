"""Temporal sharding on Redis Cluster: exactly-once appends to time windows, whole-window eviction.

    storage = TemporalStorage(redis_client, "run1", schema, BufferConfig())
    result = storage.write(transitions, task_id=0, policy_version=12, key=PushKey(3, incarnation, seq))
    result.duplicate        # True: this (sampler, incarnation, seq) was stored before; nothing new
    storage.snapshot()      # Snapshot(committed, oldest_window): readers see [.., committed) only

A write is three steps:
1. reserve (one Lua script on the run's hash slot): the dedup record of the sampler's
   incarnation says whether this seq is new, a retry of a write still in flight (same
   positions again), or stored before. New positions come from an INCRBY on the head; the
   reservation is recorded as pending. The dedup record is written in the same script, so it
   survives ingest restarts and holds with several ingest services behind one cluster.
2. SETRANGE the fixed-size records into their windows (other nodes; a retry rewrites the
   same bytes at the same positions, so a half-failed write that is retried doubles nothing).
3. commit (Lua, run slot): mark the reservation written and advance the committed head over
   every leading reservation that is written. The commit that marks it written also counts the
   batch, its env steps and a demonstration (per sampler) in the run's counters (`counters()`),
   once per push, kept with the data and restored by any ingest service that starts. A
   reservation still unwritten after `stalled_write_timeout_sec` (its writer and sampler both
   died) is skipped: recorded in the skipped set, which readers treat as invalid for good; a
   late retry of it is re-reserved.

Eviction: when the head passes the capacity, whole windows below the horizon are added to an
evict set and UNLINKed by writers, which remove them from the set only once UNLINK succeeded
(a failed UNLINK is retried by the next write). A late write into an evicted window puts it
back into the set.

The three Lua scripts, with the keys and arguments each takes, are in buffer/storage_lua.py.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple, cast

import numpy as np
from redis.cluster import RedisCluster
from redis.exceptions import TryAgainError

from buffer.layout import RecordLayout
from buffer.storage_lua import COMMIT_LUA, DUPLICATE, RESERVE_LUA, SNAPSHOT_LUA
from foundation.config import BufferConfig
from foundation.wire import Transitions, TransitionSchema

log = logging.getLogger("fleetrl.buffer")


class PushKey(NamedTuple):
    """The idempotency key of one push: new incarnation per sampler process start."""

    sampler_id: int
    incarnation: int
    seq: int


class WriteResult(NamedTuple):
    committed: int  # the committed head after this write
    stored: int  # rows this call stored (0 when the batch was stored before)
    duplicate: bool  # stored before: by an earlier attempt, maybe through another ingest service


class RunCounters(NamedTuple):
    """The run's acked figures, kept in Redis with the data: every ingest service, and every
    incarnation of one, reads and adds to the same ones."""

    env_steps: int  # env steps of every batch stored, each batch once
    batches: int
    env_steps_by_task: dict[int, int]  # registry task id -> env steps
    demo_episodes_by_sampler: dict[int, int] = {}  # sampler id -> demonstrations stored (never mutated)


class Snapshot(NamedTuple):
    """What a reader needs: positions [0, committed) are final (written, or skipped and listed
    in `skipped`); windows below `oldest_window` are evicted."""

    committed: int
    oldest_window: int
    skipped: tuple[tuple[int, int], ...] = ()  # (start, count) ranges to treat as invalid


class TemporalStorage:
    """Writes transitions of one run into time windows on a Redis Cluster, exactly once per
    PushKey (implements buffer.api.TransitionWriter)."""

    def __init__(self, client: RedisCluster, run_id: str, schema: TransitionSchema, config: BufferConfig) -> None:
        if config.capacity_transitions < 2 * config.window_size_transitions:
            raise ValueError(
                f"buffer.capacity_transitions ({config.capacity_transitions}) must be >= 2 * "
                f"window_size_transitions ({config.window_size_transitions}): eviction drops a whole window"
            )
        self.client = client
        self.layout = RecordLayout(run_id, schema, config)
        self.capacity = config.capacity_transitions
        self.stalled_ms = int(1000 * config.stalled_write_timeout_sec)
        self.dedup_ttl_sec = config.dedup_ttl_sec
        self.replicas_to_ack, self.replica_wait_ms = config.replicas_to_ack, config.replica_wait_ms
        self.under_replicated = 0  # writes acked with fewer replicas than replicas_to_ack (none attached)
        self._warned_at = -60.0
        self._reserve = client.register_script(RESERVE_LUA)
        self._commit = client.register_script(COMMIT_LUA)
        self._snapshot = client.register_script(SNAPSHOT_LUA)

    def write(
        self,
        transitions: Transitions,
        *,
        task_id: int,
        policy_version: int,
        key: PushKey | None = None,
        env_steps: int = 0,
        demonstration: bool = False,
    ) -> WriteResult:
        """Store a batch once per `key` (None: no idempotency, every call stores), and count it
        and its `env_steps` in the run's counters in the same commit (once, like the rows); a
        `demonstration` (its rows marked demo) is counted as one episode of the key's sampler.

        When this returns, the rows are in Redis and below the committed head. Raises
        ValueError for rows that do not fit the schema and redis.RedisError when Redis fails
        (nothing is acked then; a retry with the same key rewrites the same positions).
        """
        records = self.layout.encode(
            transitions, task_id=task_id, policy_version=policy_version, demonstration=demonstration
        )
        n = len(records)
        if n == 0:
            return WriteResult(self.snapshot().committed, 0, False)
        for _ in range(3):  # a reservation skipped as stalled is reserved anew (at most twice)
            status, start, oldest, evict = self._reserve_positions(n, key)
            if status == DUPLICATE:
                self._unlink(evict)
                return WriteResult(self.snapshot().committed, 0, True)
            self._write_records(records, start, oldest, evict)
            self._replicate([self.layout.window_key(s.window) for s in self.layout.segments(start, n)])
            demo_sampler = key.sampler_id if demonstration and key is not None else -1
            state, committed = self._commit_positions(start, n, key, (env_steps, task_id, demo_sampler))
            self._replicate([self.layout.committed_key])  # the commit and the dedup record, on one node
            if state == 1:
                return WriteResult(committed, n, False)
            if state == 2:  # a concurrent attempt of the same push committed it first
                return WriteResult(committed, 0, True)
        raise RuntimeError(f"write of {n} rows was skipped as stalled three times: writes take too long")

    def _replicate(self, keys: list[str]) -> None:
        """WAIT until `replicas_to_ack` replicas of every node holding `keys` have the writes so
        far; raises redis.RedisError (the push is not acked, and its retry rewrites) if they do
        not. A node with fewer replicas attached (its primary failed and it took over) is waited
        on for those it has: the fleet keeps its data flowing, counted in `under_replicated`
        and logged, until a replica rejoins."""
        if not self.replicas_to_ack:
            return
        nodes = {node.name: node for node in map(self.client.get_node_from_key, keys)}
        for node in nodes.values():
            held = self.client.execute_command("WAIT", self.replicas_to_ack, self.replica_wait_ms, target_nodes=node)
            if int(held) >= self.replicas_to_ack:
                continue
            info = self.client.execute_command("INFO", "replication", target_nodes=node)
            attached = int(info.get("connected_slaves", 0)) if isinstance(info, dict) else 0
            if int(held) < min(attached, self.replicas_to_ack):
                raise TryAgainError(
                    f"{node.name}: {held} of {attached} replicas hold the write after {self.replica_wait_ms} ms"
                )
            self.under_replicated += 1
            if time.monotonic() - self._warned_at >= 60.0:
                self._warned_at = time.monotonic()
                log.warning(
                    "redis %s has %d replica(s) attached, buffer.replicas_to_ack is %d: acking with %d "
                    "(%d such writes so far); restart or add a replica",
                    node.name, attached, self.replicas_to_ack, int(held), self.under_replicated,
                )  # fmt: skip

    def _reserve_positions(self, n: int, key: PushKey | None) -> tuple[int, int, int, list[int]]:
        layout = self.layout
        seq = key.seq if key is not None else 0
        dedup = layout.dedup_key(key.sampler_id, key.incarnation) if key is not None else layout.dedup_key(0, 0)
        reply = self._reserve(
            keys=[layout.head_key, layout.oldest_key, dedup, layout.pending_key, layout.evict_key, layout.skipped_key],
            args=[n, self.capacity, layout.window_size, seq, self.dedup_ttl_sec, _now_ms()],
        )
        status, start, oldest, *evict = (int(x) for x in reply)
        return status, start, oldest, evict

    def _write_records(self, records: np.ndarray, start: int, oldest: int, evict: list[int]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for segment in self.layout.segments(start, len(records)):
            if segment.window < oldest:
                continue  # already behind the capacity horizon: storing it would leak a key
            offset = segment.first_slot * self.layout.record_bytes
            pipe.setrange(
                self.layout.window_key(segment.window), offset, records[segment.start : segment.stop].tobytes()
            )
        for window in evict:
            pipe.unlink(self.layout.window_key(window))
        pipe.execute()
        if evict:  # only once UNLINK succeeded: a failure leaves them for the next write
            self.client.srem(self.layout.evict_key, *evict)

    def _commit_positions(
        self,
        start: int,
        n: int,
        key: PushKey | None,
        counted: tuple[int, int, int] = (0, 0, -1),
        stalled_ms: int | None = None,
    ) -> tuple[int, int]:
        """`counted`: (env_steps, task_id, demonstration's sampler id or -1) of the batch, added
        to the run's counters when this call commits it; `stalled_ms`: age past which a
        reservation is skipped (the config's)."""
        layout = self.layout
        seq = key.seq if key is not None else 0
        dedup = layout.dedup_key(key.sampler_id, key.incarnation) if key is not None else layout.dedup_key(0, 0)
        first, last = layout.window_of(max(start, 0)), layout.window_of(max(start + n - 1, 0))
        state, committed, _ = (
            int(x)
            for x in self._commit(
                keys=[
                    layout.committed_key,
                    layout.pending_key,
                    dedup,
                    layout.skipped_key,
                    layout.oldest_key,
                    layout.evict_key,
                    layout.counters_key,
                ],
                args=[
                    start,
                    n,
                    seq,
                    _now_ms(),
                    self.stalled_ms if stalled_ms is None else stalled_ms,
                    layout.window_size,
                    first,
                    last,
                    *counted,
                ],  # fmt: skip
            )
        )
        return state, committed

    def _unlink(self, evict: list[int]) -> None:
        if evict:
            pipe = self.client.pipeline(transaction=False)
            for window in evict:
                pipe.unlink(self.layout.window_key(window))
            pipe.execute()
            self.client.srem(self.layout.evict_key, *evict)

    def advance(self, abandon: bool = False) -> int:
        """Advance the committed head past stalled reservations (readers call this, so a run
        whose last writer died does not stall); returns the committed head. `abandon`: every
        reservation still unwritten is skipped, for a buffer no writer of which lives (a resumed
        run's, before its ingest service starts)."""
        return self._commit_positions(-1, 0, None, stalled_ms=0 if abandon else None)[1]

    def snapshot(self) -> Snapshot:
        """Committed head, oldest live window and the skipped ranges, read together (one slot)."""
        layout = self.layout
        committed, oldest, *skipped = self._snapshot(keys=[layout.committed_key, layout.oldest_key, layout.skipped_key])
        ranges = tuple((int(a), int(b)) for a, b in (cast(bytes, m).split(b":") for m in skipped))
        return Snapshot(int(committed), int(oldest), ranges)

    def counters(self) -> RunCounters:
        """The run's env steps, batches and demonstration episodes stored, each batch once,
        whichever ingest service (or incarnation of one) stored it."""
        fields = cast("dict[bytes, bytes]", self.client.hgetall(self.layout.counters_key))
        by_task = {int(k[len(b"env_steps:") :]): int(v) for k, v in fields.items() if k.startswith(b"env_steps:")}
        demos = {int(k[len(b"demo:") :]): int(v) for k, v in fields.items() if k.startswith(b"demo:")}
        return RunCounters(int(fields.get(b"env_steps", 0)), int(fields.get(b"batches", 0)), by_task, demos)

    def flow(self) -> tuple[int, int]:
        """(rows committed, rows sampled) of the run, read together (one slot, one round trip)."""
        committed, sampled = self.client.mget([self.layout.committed_key, self.layout.sampled_key])
        return int(committed or 0), int(sampled or 0)

    def add_sampled(self, rows: int) -> int:
        """Count `rows` more sampled by a learner; returns the run's total."""
        return int(self.client.incrby(self.layout.sampled_key, rows))

    def head(self) -> int:
        """Transitions committed in this run (written, or skipped as stalled)."""
        return self.snapshot().committed

    def live_windows(self) -> range:
        """Window indices not evicted, oldest first (empty before the first write)."""
        committed, oldest, _ = self.snapshot()
        return range(oldest, self.layout.windows_below(committed))

    def read_window(self, window: int) -> np.ndarray:
        """All records of a window, unwritten slots included (valid == 0); for tools and tests."""
        # Clients here never set decode_responses, so GET returns bytes; redis types it bytes | str.
        data = cast("bytes | None", self.client.get(self.layout.window_key(window)))
        return self.layout.decode(data or b"")

    def committed_rows(self) -> np.ndarray:
        """Every valid committed record's packed row, oldest first: what readers can see (an
        auditor's view, for fault tests and tools; reads every live window)."""
        committed, oldest, skipped = self.snapshot()
        rows = [np.zeros((0, self.layout.schema.row_floats), np.float32)]
        for window in range(oldest, self.layout.windows_below(committed)):
            records = self.read_window(window)
            positions = window * self.layout.window_size + np.arange(len(records))
            keep = (records["valid"] == 1) & (positions < committed)
            for start, count in skipped:
                keep &= ~((positions >= start) & (positions < start + count))
            rows.append(records["row"][keep])
        return np.concatenate(rows)

    def dedup_bytes(self, key: PushKey) -> int:
        """Memory Redis uses for one incarnation's dedup record (MEMORY USAGE), 0 if none."""
        return int(self.client.memory_usage(self.layout.dedup_key(key.sampler_id, key.incarnation)) or 0)


def _now_ms() -> int:
    return int(time.time() * 1000)
