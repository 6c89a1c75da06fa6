"""Which (sampler_id, seq) pushes were already stored: the ingest service's idempotency memory.

    dedup = SeqDedup()
    if dedup.seen(batch.sampler_id, batch.seq):
        answer duplicate=True, write nothing
    else:
        write, then dedup.mark(batch.sampler_id, batch.seq)

In memory only: exactly-once across ingest restarts (and across several ingest servers that
a sampler fails over between) is a later issue. A restarted service forgets, so a batch
acked just before the restart and re-pushed after it is stored twice.
"""

from __future__ import annotations

import threading
from collections import deque


class _SamplerSeqs:
    def __init__(self, remember: int) -> None:
        self.recent: set[int] = set()
        self.order: deque[int] = deque()
        self.remember = remember
        self.last_acked = -1

    def add(self, seq: int) -> None:
        if seq in self.recent:
            return
        self.recent.add(seq)
        self.order.append(seq)
        self.last_acked = max(self.last_acked, seq)
        if len(self.order) > self.remember:
            self.recent.discard(self.order.popleft())


class SeqDedup:
    """Remembers the last `remember` acked seqs of every sampler (thread-safe).

    Only remembered seqs count as duplicates; an older seq is taken as new data rather than
    dropped, because a sampler restarted with the same id may legitimately count from 0 again
    (losing data silently is worse than a rare double store). A retry is normally of the
    latest seq, so a small memory suffices.
    """

    def __init__(self, remember: int = 1024) -> None:
        if remember < 1:
            raise ValueError(f"remember ({remember}) must be >= 1: with 0 every retry is stored again")
        self.remember = remember
        self._samplers: dict[int, _SamplerSeqs] = {}
        self._lock = threading.Lock()

    def seen(self, sampler_id: int, seq: int) -> bool:
        with self._lock:
            seqs = self._samplers.get(sampler_id)
            return seqs is not None and seq in seqs.recent

    def mark(self, sampler_id: int, seq: int) -> None:
        with self._lock:
            self._samplers.setdefault(sampler_id, _SamplerSeqs(self.remember)).add(seq)

    def last_acked(self, sampler_id: int) -> int | None:
        """Highest seq acked for the sampler, None if it never pushed."""
        with self._lock:
            seqs = self._samplers.get(sampler_id)
            return None if seqs is None else seqs.last_acked
