"""Reading the run's committed windows from Redis into the learner's local replica.

    cache = WindowCache(redis_client, storage, ring)
    changed = cache.refresh()      # one round trip when nothing changed, two otherwise

Only positions below the committed head are read, each once: they are final (written, or
skipped as stalled and then marked invalid), so nothing is ever re-read. A window evicted from
Redis is dropped from the ring at the next refresh.
"""

from __future__ import annotations

import numpy as np
from redis.cluster import RedisCluster

from buffer.replica import ReplicaRing
from buffer.storage import TemporalStorage


class WindowCache:
    def __init__(self, client: RedisCluster, storage: TemporalStorage, ring: ReplicaRing) -> None:
        self.client = client
        self.storage = storage
        self.layout = storage.layout
        self.ring = ring

    @staticmethod
    def ring_for(storage: TemporalStorage) -> ReplicaRing:
        """A ring of whole windows, enough for every live one plus the one being filled."""
        size = storage.layout.window_size
        windows = -(-storage.capacity // size) + 2
        return ReplicaRing(storage.layout.dtype, windows * size)

    def refresh(self) -> bool:
        """Read the committed head and fetch the records committed since; True if the ring
        changed. Past a stalled writer, the head is advanced (and the stalled range skipped)."""
        snapshot = self.storage.snapshot()
        if snapshot.committed == self.ring.read_upto:
            snapshot = snapshot._replace(committed=self.storage.advance())
        low = snapshot.oldest_window * self.layout.window_size
        changed = low > self.ring.low
        if changed:
            self.ring.drop_below(low)
        start = max(self.ring.read_upto, low)
        if snapshot.committed > start:
            self._read(start, snapshot.committed, snapshot.skipped)
            changed = True
        self.ring.read_upto = max(self.ring.read_upto, snapshot.committed)
        return changed

    def _read(self, start: int, stop: int, skipped: tuple[tuple[int, int], ...]) -> None:
        """Records of positions [start, stop), one GETRANGE per window in one pipeline."""
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
            self.ring.store(position, chunk)
