"""Fakes of the role interfaces (buffer/api.py) that record every call and check its contract.

    source = FakeBatchSource()
    batches = Batches(source, 8, torch.device("cpu"), prefetch=False)   # the code under test
    ...
    source.assert_calls(samples=3, batch_size=8)                        # what it asked, and how

A fake fails the test at the wrong call, not later: sample() before wait_to_sample() said
yes is a broken flow-control contract, and raises AssertionError where it happens (a
prefetch thread passes it on to the loop that reads its batches).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from buffer.api import BatchSource, SampledBatch
from foundation.wire import Transitions


@dataclass(frozen=True)
class Call:
    method: str  # "wait_to_sample" or "sample"
    batch_size: int
    version: int | None = None  # sample()'s weights version; None for wait_to_sample


@dataclass
class FakeBatchSource(BatchSource):
    """A BatchSource whose k-th sampled batch has reward k in every row (obs 3, goal 2, act 2).

    `fail_after`: sample() raises ConnectionError once it has served that many batches.
    `calls`: every call, in order. Thread-safe: a prefetch thread calls it too.
    """

    fail_after: int | None = None
    calls: list[Call] = field(default_factory=list)
    _granted: int = 0  # wait_to_sample() answers not yet used by a sample()
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def samples(self) -> int:
        return sum(1 for c in self.calls if c.method == "sample")

    def wait_to_sample(self, batch_size: int, stop: threading.Event) -> bool:
        assert batch_size > 0, f"wait_to_sample({batch_size}): a batch has at least one row"
        with self._lock:
            self.calls.append(Call("wait_to_sample", batch_size))
            if stop.is_set():
                return False
            self._granted += 1
        return True

    def sample(self, batch_size: int, version: int = 0) -> SampledBatch:
        with self._lock:
            assert self._granted > 0, "sample() without a wait_to_sample() that said yes: flow control bypassed"
            self._granted -= 1
            served = self.samples
            self.calls.append(Call("sample", batch_size, version))
        if self.fail_after is not None and served >= self.fail_after:
            raise ConnectionError("redis went away")
        n, k = batch_size, float(served + 1)
        rows = Transitions(
            obs=np.full((n, 3), 0.5, np.float32),
            goal=np.full((n, 2), 0.25, np.float32),
            action=np.full((n, 2), 0.1, np.float32),
            reward=np.full(n, k, np.float32),
            next_obs=np.full((n, 3), 0.75, np.float32),
            done=np.zeros(n, np.float32),
        )
        return SampledBatch(rows, np.full(n, version, np.int64), np.zeros(n, np.int64))

    def assert_calls(self, *, samples: int, batch_size: int, version: int = 0) -> None:
        """At least `samples` batches were sampled, every call of `batch_size` rows, every sample
        at weights `version`, and each one after a wait_to_sample() of its own."""
        with self._lock:
            calls = list(self.calls)
        sampled = [c for c in calls if c.method == "sample"]
        assert len(sampled) >= samples, f"{len(sampled)} samples, expected at least {samples}: {calls}"
        assert {c.batch_size for c in calls} == {batch_size}, f"batch sizes {calls}, expected {batch_size}"
        assert {c.version for c in sampled} == {version}, f"versions {sampled}, expected {version}"
        waits = [c for c in calls if c.method == "wait_to_sample"]
        assert len(waits) >= len(sampled), f"{len(waits)} waits for {len(sampled)} samples: {calls}"
