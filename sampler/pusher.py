"""The sampler's pushes to the buffer, on a background thread so acting never waits on the network.

    pusher = Pusher(ingest, task, max_pending=2, ledger=ledger, halt=stop)
    pusher.put(batch, policy_version, env_steps=n, on_held=beat)   # waits only while the queue is full
    pusher.close(timeout=3.0)                                      # what is not acked by then is dropped
    pusher.acked_env_steps, pusher.dropped

One push is in flight at a time, each batch with the next seq (the ingest service's dedup key:
a re-push after a lost ack is stored once). The bounded queue is the
sampler's backpressure: while the buffer's flow control holds the push in flight back, the
queue fills and put() waits, calling `on_held` so the sampler keeps beating its heartbeat. Each
acked batch is written to the sampler's AckLedger with the `row_fingerprint` of its first row,
by which an auditor finds it in the buffer.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from buffer.ingest_client import IngestClient, IngestUnavailable
from foundation.ledger import AckLedger
from sim.registry import TaskSpec


def row_fingerprint(row: np.ndarray) -> str:
    """The SHA-1 of one packed row as float32: how an auditor finds an acked batch in the buffer."""
    return hashlib.sha1(np.ascontiguousarray(row, np.float32).tobytes()).hexdigest()


class Pusher:
    """Background pushes, so acting never waits on the network; a bounded queue gives backpressure."""

    def __init__(
        self,
        ingest: IngestClient,
        task: TaskSpec,
        max_pending: int = 8,
        ledger: AckLedger | None = None,
        halt: threading.Event | None = None,
    ) -> None:
        self.ingest = ingest
        self.task = task
        self.ledger = ledger
        self.queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self.acked_env_steps = 0
        self.acked_transitions = 0
        self.error: BaseException | None = None
        self.dropped = 0  # batches never acked because the sampler stopped first
        self._stopping = threading.Event()
        self._halt = halt or threading.Event()  # the role's stop flag: a full queue never outwaits it
        self._seq = 0
        self._thread = threading.Thread(target=self._run, name="pusher", daemon=True)
        self._thread.start()

    def put(
        self,
        transitions,
        policy_version: int,
        env_steps: int,
        successes: int | None = None,
        task_id: int | None = None,
        demonstration: bool = False,
        on_held: Callable[[], None] | None = None,
    ) -> None:
        """Queue one batch; `successes` (0 or 1 for one whole episode, None for no episode end)
        feeds the buffer's training-success curve; `task_id` (default: the pusher's task) is the
        registry id of the task the batch came from; `demonstration`: one expert episode.

        While the queue is full, `on_held()` is called every half second in which flow control
        held the push in flight back (rate_limited_sec grew): the caller beats its heartbeat.
        A wait with no such news (the buffer away, the push in flight stuck) calls nothing, so the
        heartbeat goes stale and the watchdog restarts the sampler. A pusher thread that failed
        (its error in `self.error`) fails put() at once, on entry or while it waits."""
        self._raise_if_failed()
        self._seq += 1
        task_id = self.task.task_id if task_id is None else task_id
        item = (transitions, self._seq, policy_version, env_steps, successes, task_id, demonstration)
        held = self.rate_limited_sec
        while not (self._stopping.is_set() or self._halt.is_set()):  # a full queue waits, never past a stop
            try:
                self.queue.put(item, timeout=0.5)
                return
            except queue.Full:
                self._raise_if_failed()  # a dead thread never drains the queue: waiting would go silent
                if on_held is not None and self.rate_limited_sec > held:
                    held = self.rate_limited_sec
                    on_held()
        self.dropped += 1

    @property
    def incarnation(self) -> int:
        """The ingest client's incarnation: new for every process start."""
        return self.ingest.incarnation

    @property
    def rate_limited_sec(self) -> float:
        """Seconds the ingest service has held this sampler's pushes back (flow control)."""
        return self.ingest.rate_limited_sec

    def stop_soon(self) -> None:
        """Stop retrying: what is not acked by now is dropped (counted), never waited for."""
        self._stopping.set()

    def close(self, timeout: float = 5.0) -> None:
        """Give queued batches up to `timeout` seconds to be acked, then stop whatever is left."""
        deadline = time.monotonic() + timeout
        while not self.queue.empty() and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stopping.set()
        self._thread.join(max(0.0, deadline - time.monotonic()) + 1.0)
        while True:  # count what never left the queue
            try:
                self.dropped += self.queue.get_nowait() is not None
            except queue.Empty:
                break

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise RuntimeError("pusher thread failed") from self.error

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                item = self.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if item is None:
                return
            transitions, seq, version, env_steps, successes, task_id, demonstration = item
            try:
                ack = self.ingest.push(
                    transitions,
                    seq=seq,
                    policy_version=version,
                    task_id=task_id,
                    env_steps=env_steps,
                    episodes=0 if successes is None else 1,
                    successes=successes or 0,
                    demonstration=demonstration,
                    should_stop=self._stopping.is_set,
                )
            except IngestUnavailable:
                self.dropped += 1  # stopping while the service was away: never acked, not stored
                return
            except BaseException as err:  # surfaced to the acting thread by put(), waiting or not
                self.error = err
                return
            self.acked_env_steps += env_steps
            self.acked_transitions += len(transitions)
            if self.ledger is not None:
                self.ledger.record(
                    seq=seq,
                    transitions=len(transitions),
                    env_steps=env_steps,
                    duplicate=ack.duplicate,
                    # a hash of the batch's first packed row: an auditor finds the batch in Redis by it
                    fingerprint=row_fingerprint(transitions.pack()[0]),
                )
