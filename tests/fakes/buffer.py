"""The buffer's fakes: the learner's batch source and the sampler's ingest client (see
tests/fakes/__init__.py for how fakes check their calls)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import numpy as np

from buffer.api import BatchSource, SampledBatch
from buffer.ingest_client import IngestUnavailable, PushRejected
from buffer.ratelimit import RATE_LIMITED_MAX_SEC, RATE_LIMITED_POLL_SEC
from buffer.servicer import validate_batch
from foundation.proto import fleetrl_pb2 as pb
from foundation.wire import Transitions, TransitionSchema, WireError, batch_to_proto


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class Call:
    method: str  # "wait_to_sample" or "sample"
    batch_size: int
    version: int | None = None  # sample()'s weights version; None for wait_to_sample


def _room() -> threading.Event:
    room = threading.Event()
    room.set()
    return room


@dataclass
class FakeBatchSource(BatchSource):
    """A BatchSource whose k-th sampled batch has reward k in every row (obs 3, goal 2, act 2).

    `fail_after`: sample() raises ConnectionError once it has served that many batches.
    `demo_every`: every that many-th row of a batch is marked an expert demonstration's (0: none).
    `room`: while cleared, flow control holds every batch back (stalled samplers):
    wait_to_sample() polls every POLL_SEC and calls its `on_wait` at each poll, as the real
    limiter does, until `room` is set again or its `stop` is.
    `calls`: every call, in order. Thread-safe: a prefetch thread calls it too.
    """

    POLL_SEC = 0.01

    fail_after: int | None = None
    demo_every: int = 0
    room: threading.Event = field(default_factory=_room)
    calls: list[Call] = field(default_factory=list)
    _granted: int = 0  # wait_to_sample() answers not yet used by a sample()
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def samples(self) -> int:
        return sum(1 for c in self.calls if c.method == "sample")

    def wait_to_sample(self, batch_size: int, stop: threading.Event, on_wait: Callable[[], object] = _nothing) -> bool:
        assert batch_size > 0, f"wait_to_sample({batch_size}): a batch has at least one row"
        assert callable(on_wait), f"wait_to_sample(on_wait={on_wait!r}): a callable, run at every poll"
        with self._lock:
            self.calls.append(Call("wait_to_sample", batch_size))
        while not self.room.is_set():
            on_wait()
            if stop.wait(self.POLL_SEC):
                return False
        with self._lock:
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
        demo = np.arange(n) % self.demo_every == 0 if self.demo_every else np.zeros(n, bool)
        return SampledBatch(rows, np.full(n, version, np.int64), np.zeros(n, np.int64), demo)

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


@dataclass(frozen=True)
class Pushed:
    """One push() the fake answered: the batch as it went on the wire, and what became of it."""

    batch: pb.TransitionBatch
    outcome: str  # "stored", "duplicate" (a re-push of a stored seq), "rejected" or "unacked"


class FakeIngestClient:
    """An IngestClient as the sampler's Pusher uses it: push() until acked, for one incarnation.

        ingest = FakeIngestClient(schema, task_ids=(task.task_id,))
        pusher = Pusher(ingest, task)                  # the code under test
        ingest.assert_stored(3)                        # seqs 1..3, each once, in order

    Each push is checked where it is made, as the ingest service checks it
    (buffer.servicer.validate_batch: run, task, shapes against `schema`, finite values, counts),
    and its seq as the client's contract says: a new batch takes the next seq (from 1), a
    re-push repeats a seq with the very same batch (acked `duplicate`). A broken contract
    raises AssertionError and is kept in `violations` (assert_stored fails on it, so a pusher
    thread cannot swallow it). `reject`: seqs the service refuses (PushRejected, as for a bad
    batch). `away_from`: from that seq on, the service is unreachable: push() waits, as the
    real client retries, until back() or should_stop() (then IngestUnavailable). `held_from`:
    from that seq on, flow control holds pushes back: push() waits as the real client does
    (RATE_LIMITED_POLL_SEC doubling up to RATE_LIMITED_MAX_SEC, each wait added to
    `rate_limited_sec`), until back() or should_stop() (then IngestUnavailable).
    """

    def __init__(
        self,
        schema: TransitionSchema,
        task_ids: tuple[int, ...],
        *,
        reject: frozenset[int] = frozenset(),
        away_from: int | None = None,
        held_from: int | None = None,
        n_step: int = 1,
    ) -> None:
        self.schema, self.task_ids, self.reject, self.n_step = schema, task_ids, reject, n_step
        self.run_id, self.sampler_id, self.incarnation = "fake-run", 0, 1
        self.earlier_demos = 0  # demonstrations of this sampler stored before this incarnation (stats())
        self.rate_limited_sec = 0.0
        self.closed = False
        self.pushes: list[Pushed] = []
        self.violations: list[str] = []
        self._away_from, self._held_from = away_from, held_from
        self._back = threading.Event()
        self._lock = threading.RLock()

    def __enter__(self) -> FakeIngestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.closed = True

    def back(self) -> None:
        """The service is reachable again, its flow control has room: a waiting push goes through."""
        self._back.set()

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
        demonstration: bool = False,
        max_retry_sec: float | None = None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> pb.PushAck:
        tags = dict(seq=seq, policy_version=policy_version, task_id=task_id, env_steps=env_steps)
        batch = batch_to_proto(
            transitions,
            run_id=self.run_id,
            sampler_id=self.sampler_id,
            incarnation=self.incarnation,
            episodes=episodes,
            successes=successes,
            demonstration=demonstration,
            **tags,
        )
        try:
            limits = dict(task_ids=self.task_ids, schema=self.schema, max_batch_transitions=1 << 20)
            validate_batch(batch, run_id=self.run_id, n_step=self.n_step, **limits)
        except WireError as err:
            self._violated(f"seq {seq}: the ingest service refuses this batch: {err}")
        if self._away_from is not None and seq >= self._away_from:
            self._wait_until_back(batch, max_retry_sec, should_stop)
        if self._held_from is not None and seq >= self._held_from:
            self._hold_until_back(batch, should_stop)
        return self._answer(batch)

    def _wait_until_back(self, batch: pb.TransitionBatch, max_retry_sec: float | None, should_stop) -> None:
        give_up = None if max_retry_sec is None else time.monotonic() + max_retry_sec
        while not self._back.wait(0.01):
            if should_stop() or (give_up is not None and time.monotonic() >= give_up):
                with self._lock:
                    self.pushes.append(Pushed(batch, "unacked"))
                raise IngestUnavailable(f"push of seq {batch.seq} not acked: the fake service is away")

    def _hold_until_back(self, batch: pb.TransitionBatch, should_stop) -> None:
        held = RATE_LIMITED_POLL_SEC
        while not self._back.is_set():
            if should_stop():
                with self._lock:
                    self.pushes.append(Pushed(batch, "unacked"))
                raise IngestUnavailable(f"push of seq {batch.seq} still rate limited when stopping")
            time.sleep(held)
            self.rate_limited_sec += held
            held = min(2 * held, RATE_LIMITED_MAX_SEC)

    def _answer(self, batch: pb.TransitionBatch) -> pb.PushAck:
        with self._lock:
            earlier = {p.batch.seq: p for p in self.pushes if p.outcome != "unacked"}
            last = max(earlier, default=0)
            if batch.seq in earlier:
                if earlier[batch.seq].batch != batch:
                    self._violated(f"seq {batch.seq} again with a different batch: a new batch takes seq {last + 1}")
                outcome = "duplicate" if earlier[batch.seq].outcome != "rejected" else "rejected"
            elif batch.seq != last + 1:
                self._violated(f"seq {batch.seq} after seq {last}: a new batch takes seq {last + 1}")
            else:
                outcome = "rejected" if batch.seq in self.reject else "stored"
            self.pushes.append(Pushed(batch, outcome))
        if outcome == "rejected":
            raise PushRejected(grpc.StatusCode.INVALID_ARGUMENT, "columns[obs].data: contains NaN or inf")
        stored = 0 if outcome == "duplicate" else batch.num_transitions
        return pb.PushAck(seq=batch.seq, stored=stored, duplicate=outcome == "duplicate")

    def _violated(self, message: str) -> None:
        with self._lock:
            self.violations.append(message)
        raise AssertionError(message)

    def stats(self, wait_for_ready: bool = False, timeout_sec: float | None = None) -> pb.BufferStats:
        """The run's counters as the service reports them, from the batches stored here and
        `earlier_demos` (demonstrations a previous incarnation of this sampler stored)."""
        stored = self.stored()
        demos = self.earlier_demos + sum(b.demonstration for b in stored)
        return pb.BufferStats(
            head=sum(b.num_transitions for b in stored),
            env_steps=sum(b.env_steps for b in stored),
            batches=len(stored),
            demo_episodes_by_sampler={self.sampler_id: demos} if demos else {},
        )

    def stored(self) -> list[pb.TransitionBatch]:
        """The batches stored (each seq once), in seq order."""
        with self._lock:
            return sorted((p.batch for p in self.pushes if p.outcome == "stored"), key=lambda b: b.seq)

    def assert_stored(self, batches: int) -> None:
        """No broken contract, and exactly seqs 1..`batches` stored, each once."""
        assert not self.violations, self.violations
        seqs = [b.seq for b in self.stored()]
        assert seqs == list(range(1, batches + 1)), f"stored seqs {seqs}, expected 1..{batches}"
