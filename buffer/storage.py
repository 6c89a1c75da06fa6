"""Temporal sharding on Redis Cluster: append transitions to time windows, evict whole windows.

    storage = TemporalStorage(redis_client, "run1", schema, BufferConfig())
    head = storage.write(transitions, task_id=0, policy_version=12)
    storage.live_windows()   # range(oldest, newest + 1)

Each write reserves a position range with one atomic INCRBY on the run's head counter, so
several ingest servers can write concurrently into deterministic slots: SETRANGE at
`slot * record_bytes` of the window string. A reserved slot that is not written yet reads
back as zero bytes, whose `valid` flag (0) tells readers to skip it.

Skeleton version. Seams for the next issue: `RecordLayout.window_key(window, stripe)` for
striping a window over sub-shards; exactly-once across ingest restarts; rate limiting;
recency-weighted sampling.
"""

from __future__ import annotations

from typing import NamedTuple, cast

import numpy as np
from redis.cluster import RedisCluster

from buffer.layout import RecordLayout
from fleetrl.config import BufferConfig
from fleetrl.wire import Transitions, TransitionSchema

# Reserve `count` positions and advance the oldest-live-window marker in one step, so that
# exactly one writer claims each range of windows to evict. KEYS: head, oldest.
# ARGV: count, capacity_transitions, window_size_transitions.
# Returns {new head, oldest before, oldest after}; the caller UNLINKs [before, after).
_RESERVE_LUA = """
local head = redis.call('INCRBY', KEYS[1], ARGV[1])
local capacity = tonumber(ARGV[2])
local window_size = tonumber(ARGV[3])
local live = 0
if head > capacity then live = math.floor((head - capacity) / window_size) end
local before = tonumber(redis.call('GET', KEYS[2]) or '0')
if live > before then
  redis.call('SET', KEYS[2], live)
  return {head, before, live}
end
return {head, before, before}
"""


class Snapshot(NamedTuple):
    """What a reader needs to know: positions [0, head) were reserved; windows below
    `oldest_window` are evicted."""

    head: int
    oldest_window: int


class TemporalStorage:
    """Writes transitions of one run into time windows on a Redis Cluster (implements
    buffer.api.TransitionWriter)."""

    def __init__(self, client: RedisCluster, run_id: str, schema: TransitionSchema, config: BufferConfig) -> None:
        if config.capacity_transitions < 2 * config.window_size_transitions:
            raise ValueError(
                f"buffer.capacity_transitions ({config.capacity_transitions}) must be >= 2 * "
                f"window_size_transitions ({config.window_size_transitions}): eviction drops a whole window"
            )
        self.client = client
        self.layout = RecordLayout(run_id, schema, config)
        self.capacity = config.capacity_transitions
        self._reserve = client.register_script(_RESERVE_LUA)

    def write(self, transitions: Transitions, *, task_id: int, policy_version: int) -> int:
        """Store a batch; returns the head after it (its rows hold positions [head - n, head)).

        When this returns, the rows are in Redis. Raises ValueError for rows that do not fit
        the schema and redis.RedisError when Redis fails (nothing is acked then).
        """
        records = self.layout.encode(transitions, task_id=task_id, policy_version=policy_version)
        n = len(records)
        if n == 0:
            return self.head()
        head, evict_from, oldest = (
            int(x)
            for x in self._reserve(
                keys=[self.layout.head_key, self.layout.oldest_key],
                args=[n, self.capacity, self.layout.window_size],
            )
        )
        pipe = self.client.pipeline(transaction=False)
        for segment in self.layout.segments(head - n, n):
            if segment.window < oldest:
                continue  # already behind the capacity horizon: storing it would leak a key
            key = self.layout.window_key(segment.window)
            offset = segment.first_slot * self.layout.record_bytes
            pipe.setrange(key, offset, records[segment.start : segment.stop].tobytes())
        for window in range(evict_from, oldest):
            pipe.unlink(self.layout.window_key(window))
        pipe.execute()
        return head

    def snapshot(self) -> Snapshot:
        """Head and oldest live window, read together (they share one hash slot)."""
        head, oldest = self.client.mget([self.layout.head_key, self.layout.oldest_key])
        return Snapshot(int(head or 0), int(oldest or 0))

    def head(self) -> int:
        """Transitions ever reserved in this run (written ones, plus any write in flight)."""
        return self.snapshot().head

    def live_windows(self) -> range:
        """Window indices not evicted, oldest first (empty before the first write)."""
        head, oldest = self.snapshot()
        return range(oldest, self.layout.windows_below(head))

    def read_window(self, window: int) -> np.ndarray:
        """All records of a window, unwritten slots included (valid == 0); for tools and tests."""
        # Clients here never set decode_responses, so GET returns bytes; redis types it bytes | str.
        data = cast("bytes | None", self.client.get(self.layout.window_key(window)))
        return self.layout.decode(data or b"")
