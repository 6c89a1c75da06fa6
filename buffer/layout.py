"""Pure layout of the temporally sharded buffer: key names, record format, position math.

No Redis here, so the writer (storage.py) and the reader (client.py) share one definition
and it can be tested without a server.

A *position* is a transition's index in the run's global append order (0, 1, 2, ...).
Window `w` holds positions [w * window_size_transitions, (w + 1) * window_size_transitions);
a position's *slot* is its index inside its window. A window's data is one Redis string of
fixed-size records, record `slot` at byte offset `slot * record_bytes`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from foundation.config import BufferConfig
from foundation.wire import Transitions, TransitionSchema

MAX_UINT32 = 2**32 - 1


class Segment(NamedTuple):
    """The part of a reserved position range that falls into one window."""

    window: int
    first_slot: int  # slot of the segment's first record inside the window
    start: int  # index of the segment's first row in the written batch
    stop: int  # one past its last row


class RecordLayout:
    """Key names and the fixed-size record format of one run's buffer.

    >>> layout = RecordLayout("run1", TransitionSchema(10, 3, 4), BufferConfig())
    >>> layout.window_key(7)
    'fleetrl:{run1:w7}:data'
    """

    def __init__(self, run_id: str, schema: TransitionSchema, config: BufferConfig) -> None:
        for name, value in (("run_id", run_id), ("buffer.key_prefix", config.key_prefix)):
            if not value or "{" in value or "}" in value:
                raise ValueError(f"{name} ({value!r}) must be non-empty without braces: braces are hash tags")
        if config.window_size_transitions < 1:
            raise ValueError(f"buffer.window_size_transitions ({config.window_size_transitions}) must be >= 1")
        self.run_id = run_id
        self.schema = schema
        self.window_size = config.window_size_transitions
        self.prefix = config.key_prefix
        # `valid` and `demo` share the four bytes `valid` once held alone (a uint32 1 reads as
        # valid 1, demo 0), so records keep their size and a buffer stored before the mark reads
        # back unchanged.
        self.dtype = np.dtype(
            [
                ("row", "<f4", (schema.row_floats,)),
                ("task_id", "<u4"),
                ("policy_version", "<u4"),
                ("valid", "<u2"),
                ("demo", "<u2"),  # 1: an expert demonstration's row (sampler.demo_episodes)
            ]
        )

    @property
    def record_bytes(self) -> int:
        return self.dtype.itemsize

    # Keys. The head and the oldest-window marker share the run's hash tag, so one Lua
    # script can update both; each window gets its own tag, so windows spread over nodes.

    @property
    def head_key(self) -> str:
        return f"{self.prefix}:{{{self.run_id}}}:head"

    @property
    def oldest_key(self) -> str:
        return f"{self.prefix}:{{{self.run_id}}}:oldest"

    @property
    def committed_key(self) -> str:
        """Positions below this are final: readers never look past it."""
        return f"{self.prefix}:{{{self.run_id}}}:committed"

    @property
    def pending_key(self) -> str:
        """Sorted set of reservations not yet committed ("start:n:reserved_ms:done")."""
        return f"{self.prefix}:{{{self.run_id}}}:pending"

    @property
    def skipped_key(self) -> str:
        """Sorted set of reservations skipped as stalled ("start:n"): invalid for readers."""
        return f"{self.prefix}:{{{self.run_id}}}:skipped"

    @property
    def sampled_key(self) -> str:
        """Rows sampled by every learner of the run (flow control, buffer/ratelimit.py)."""
        return f"{self.prefix}:{{{self.run_id}}}:sampled"

    @property
    def evict_key(self) -> str:
        """Set of evicted windows whose keys are still to be UNLINKed."""
        return f"{self.prefix}:{{{self.run_id}}}:evict"

    @property
    def counters_key(self) -> str:
        """Hash of the run's acked figures: env steps, batches, env steps per task."""
        return f"{self.prefix}:{{{self.run_id}}}:counters"

    def dedup_key(self, sampler_id: int, incarnation: int) -> str:
        """The dedup record of one sampler process: its newest seq, where it went, its state."""
        return f"{self.prefix}:{{{self.run_id}}}:dedup:{sampler_id}:{incarnation}"

    def window_key(self, window: int, stripe: int | None = None) -> str:
        """Key of a window's records; `stripe` is the seam for striping a window over sub-shards."""
        tag = f"{self.run_id}:w{window}" if stripe is None else f"{self.run_id}:w{window}.s{stripe}"
        return f"{self.prefix}:{{{tag}}}:data"

    # Positions.

    def window_of(self, position: int) -> int:
        return position // self.window_size

    def windows_below(self, head: int) -> int:
        """Number of windows that hold any position < head (the newest is windows_below - 1)."""
        return -(-head // self.window_size)

    def reserved_in(self, window: int, head: int) -> int:
        """Slots of `window` reserved by writers once the head is at `head` (0..window_size)."""
        return max(0, min(self.window_size, head - window * self.window_size))

    def segments(self, start: int, count: int) -> Iterator[Segment]:
        """Split positions [start, start + count) at window boundaries."""
        done = 0
        while done < count:
            position = start + done
            window, slot = divmod(position, self.window_size)
            take = min(count - done, self.window_size - slot)
            yield Segment(window, slot, done, done + take)
            done += take

    # Records.

    def encode(
        self, transitions: Transitions, *, task_id: int, policy_version: int, demonstration: bool = False
    ) -> np.ndarray:
        """Records (valid = 1; demo = 1 for a demonstration) for a batch; ValueError when it does
        not fit the schema."""
        for name, value in (("task_id", task_id), ("policy_version", policy_version)):
            if not 0 <= value <= MAX_UINT32:
                raise ValueError(f"{name} ({value}) must be in [0, {MAX_UINT32}]: records store it as uint32")
        rows = transitions.pack()
        if rows.shape[1] != self.schema.row_floats:
            raise ValueError(
                f"transitions pack to {rows.shape[1]} floats per row, schema {self.schema} needs "
                f"{self.schema.row_floats}"
            )
        records = np.zeros(len(rows), dtype=self.dtype)
        records["row"] = rows
        records["task_id"] = task_id
        records["policy_version"] = policy_version
        records["valid"] = 1
        records["demo"] = int(demonstration)
        return records

    def decode(self, data: bytes) -> np.ndarray:
        """Records from bytes read back from Redis (a whole number of records; may be invalid)."""
        usable = len(data) - len(data) % self.record_bytes
        return np.frombuffer(data[:usable], dtype=self.dtype)

    def transitions(self, records: np.ndarray) -> Transitions:
        """Transitions of the given records (the caller has already dropped invalid ones)."""
        return Transitions.unpack(records["row"], self.schema)
