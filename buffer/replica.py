"""The learner's local replica of the live buffer: one ring of records indexed by position.

    ring = ReplicaRing(layout.dtype, slots=windows * window_size)
    ring.store(position, records)        # records of positions [position, position + len)
    ring.drop_below(low)                 # an evicted window's rows are no longer drawn
    low, high = ring.live()              # the positions sample() may draw from
    rows = ring.at(positions)            # their records

Position p lives in slot p % slots: a draw is a vectorized lookup with no per-window loop.
Nothing here knows Redis; buffer/window_cache.py fills the ring from the committed windows.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class LiveRange(NamedTuple):
    low: int  # the oldest live position held
    high: int  # one past the newest


class ReplicaRing:
    def __init__(self, dtype: np.dtype, slots: int) -> None:
        self.records = np.zeros(slots, dtype=dtype)  # "valid" 0: unwritten, skipped or evicted
        self.read_upto = 0  # positions below this are in the ring (or evicted)
        self.low = 0  # oldest live position
        self.valid_count = 0

    def slots(self, position: int, count: int) -> np.ndarray:
        """The slots of positions [position, position + count)."""
        return (position + np.arange(count)) % len(self.records)

    def store(self, position: int, chunk: np.ndarray) -> None:
        """Records of positions [position, position + len(chunk)), replacing what the slots held."""
        idx = self.slots(position, len(chunk))
        self.valid_count -= int(np.count_nonzero(self.records["valid"][idx]))
        self.records[idx] = chunk
        self.valid_count += int(np.count_nonzero(chunk["valid"]))
        self.read_upto = max(self.read_upto, position + len(chunk))

    def drop_below(self, low: int) -> None:
        """Positions below `low` are evicted: their rows are no longer valid."""
        start = max(self.low, low - len(self.records), self.read_upto - len(self.records))  # still in a slot
        if low > start:
            idx = self.slots(start, low - start)
            self.valid_count -= int(np.count_nonzero(self.records["valid"][idx]))
            self.records["valid"][idx] = 0
        self.low = max(self.low, low)

    def live(self) -> LiveRange:
        """Positions the ring holds and that are not evicted (some may be invalid)."""
        return LiveRange(max(self.low, self.read_upto - len(self.records)), self.read_upto)

    def at(self, positions: np.ndarray) -> np.ndarray:
        """The records of `positions` (any int array; wrapped onto the ring)."""
        return self.records[np.asarray(positions) % len(self.records)]

    def row(self, position: int) -> np.void:
        """The record of one position."""
        return self.records[position % len(self.records)]

    def newest_valid(self, count: int) -> np.ndarray:
        """Positions of the newest `count` valid rows (fewer when fewer are held), newest first."""
        low, high = self.live()
        positions = np.arange(high - 1, low - 1, -1)
        return positions[self.at(positions)["valid"] != 0][:count]
