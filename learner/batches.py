"""A learner's training batches: flow control, then a sample turned into tensors on the
learner's device, optionally one batch ahead in a thread; the heartbeat while flow control holds
them back.

    batches = Batches(replay, batch_size, device, prefetch=True, tasks=tasks, heartbeat=heartbeat)
    while (batch := batches.next(stop)) is not None:
        grads = compute_gradients(model, batch, hp)
    batches.close()
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import torch

from buffer.api import BatchSource
from foundation.process import Heartbeat
from learner.algorithm import Batch
from sim.tasks import TaskSet

# A wait on flow control whose last poll is older than this is stuck, not waiting: no beat for it.
# Polls come every RATE_LIMITED_POLL_SEC (25 ms) plus a refresh, far inside the watchdog's
# watchdog.heartbeat_timeout_sec (60 s by default).
FLOW_CONTROL_POLL_FRESH_SEC = 1.0


class FlowControlBeat:
    """The learner's heartbeat while it waits on flow control (buffer/ratelimit.py), beaten only
    by the thread that asks Batches.next() for a batch: the learner's loop.

        waiting = FlowControlBeat(heartbeat)
        waiting.begin()                                            # the thread that waits
        source.wait_to_sample(n, stop, on_wait=waiting.polled)     # marks each poll with no room
        waiting.end()
        waiting.beat()                                             # the loop, as it waits for a batch

    beat() sets the heartbeat's `flow_control_wait_sec` to the wait so far while the wait's last
    poll is at most FLOW_CONTROL_POLL_FRESH_SEC old, and to 0 once the wait is over. The beats
    keep the watchdog from restarting a learner that only waits for stalled samplers (a sampler
    restarting, Redis failing over). They cannot hide a hung learner: a poll means the wait is
    alive and re-checking `stop`, and a learner stuck anywhere else (a gradient, a push, a
    prefetch thread stuck in Redis or in sample()) marks no poll or calls no beat(), so its
    heartbeat goes stale and the watchdog restarts it. The waiting thread and the loop share
    only the times below, each set in one assignment: no lock.
    """

    def __init__(self, heartbeat: Heartbeat | None) -> None:
        self.heartbeat = heartbeat
        self._began = 0.0  # when the current wait began (time.monotonic)
        self._polled: float | None = None  # its last poll that found no room; None: no wait is polling
        self._said = False  # the heartbeat says the learner waits

    def begin(self) -> None:
        self._began, self._polled = time.monotonic(), None

    def polled(self) -> None:
        """A poll that found no room (on_wait of the thread that waits)."""
        self._polled = time.monotonic()

    def polled_here(self) -> None:
        """polled(), by the learner's loop itself: it beats at once."""
        self.polled()
        self.beat()

    def end(self) -> None:
        self._polled = None

    def beat(self) -> None:
        if self.heartbeat is None:
            return
        polled, now = self._polled, time.monotonic()
        if polled is not None:
            if now - polled <= FLOW_CONTROL_POLL_FRESH_SEC:
                self.heartbeat.beat(flow_control_wait_sec=now - self._began)
                self._said = True
        elif self._said:
            self.heartbeat.beat(flow_control_wait_sec=0.0)
            self._said = False


class Batches:
    """Training batches from a batch source (buffer.api.BatchSource: the replay sampler),
    optionally prepared one ahead in a thread.

    With prefetch the next batch is sampled (and turned into tensors on the device) while the
    current gradient is computed: torch's kernels release the GIL, so the two overlap.
    Every wait is bounded and re-checks `stop`. While next() waits on flow control it beats
    `heartbeat` (FlowControlBeat), from the caller's thread only.
    """

    def __init__(
        self,
        source: BatchSource,
        batch_size: int,
        device: torch.device,
        prefetch: bool,
        tasks: TaskSet | None = None,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.source, self.batch_size, self.device = source, batch_size, device
        self.tasks = tasks if tasks is not None and tasks.multi else None  # rows' task places, multi-task only
        self.version = 0  # the learner's weights version ('version' sampling bounds the rows' lag by it)
        self.waiting = FlowControlBeat(heartbeat)
        self._queue: queue.Queue[Batch | BaseException] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if prefetch:
            self._thread = threading.Thread(target=self._run, name="prefetch", daemon=True)
            self._thread.start()

    def _make(self) -> Batch:
        sampled = self.source.sample(self.batch_size, self.version)
        t, task = sampled.transitions, None
        if self.tasks is not None:
            task = self.tasks.indices(sampled.task_id)
        return Batch.from_numpy(
            t.obs, t.goal, t.action, t.reward, t.next_obs, t.done, device=self.device, task=task, demo=sampled.demo
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._room(self._stop, self.waiting.polled):  # next() beats for this wait
                return
            try:
                item: Batch | BaseException = self._make()
            except Exception as err:  # surfaced to the learner loop by next()
                item = err
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.5)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return

    def _room(self, stop: threading.Event, on_wait: Callable[[], object]) -> bool:
        """Flow control: True once a batch may be sampled, False once `stop` is set."""
        self.waiting.begin()
        try:
            return self.source.wait_to_sample(self.batch_size, stop, on_wait=on_wait)
        finally:
            self.waiting.end()

    def next(self, stop: threading.Event) -> Batch | None:
        """The next batch; None once `stop` is set. Beats the heartbeat while flow control holds
        the batch back, and only then."""
        if self._thread is None:
            room = self._room(stop, self.waiting.polled_here)
            self.waiting.beat()  # the wait is over: flow_control_wait_sec 0
            return self._make() if room else None
        while not stop.is_set():
            self.waiting.beat()  # for the prefetch thread's wait, while it polls
            try:
                item = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            self.waiting.beat()
            if isinstance(item, BaseException):
                raise RuntimeError("prefetch thread failed") from item
            return item
        return None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
