"""A learner's training batches: flow control, then a sample turned into tensors on the
learner's device, optionally one batch ahead in a thread.

    batches = Batches(replay, batch_size, device, prefetch=True, tasks=tasks)
    while (batch := batches.next(stop)) is not None:
        grads = compute_gradients(model, batch, hp)
    batches.close()
"""

from __future__ import annotations

import queue
import threading

import torch

from buffer.api import BatchSource
from learner.algorithm import Batch
from sim.tasks import TaskSet


class Batches:
    """Training batches from a batch source (buffer.api.BatchSource: the replay sampler),
    optionally prepared one ahead in a thread.

    With prefetch the next batch is sampled (and turned into tensors on the device) while the
    current gradient is computed: torch's kernels release the GIL, so the two overlap.
    Every wait is bounded and re-checks `stop`.
    """

    def __init__(
        self, source: BatchSource, batch_size: int, device: torch.device, prefetch: bool, tasks: TaskSet | None = None
    ) -> None:
        self.source, self.batch_size, self.device = source, batch_size, device
        self.tasks = tasks if tasks is not None and tasks.multi else None  # rows' task places, multi-task only
        self.version = 0  # the learner's weights version ('version' sampling bounds the rows' lag by it)
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
            if not self.source.wait_to_sample(self.batch_size, self._stop):  # flow control
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

    def next(self, stop: threading.Event) -> Batch | None:
        """The next batch; None once `stop` is set."""
        if self._thread is None:
            return self._make() if self.source.wait_to_sample(self.batch_size, stop) else None
        while not stop.is_set():
            try:
                item = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                raise RuntimeError("prefetch thread failed") from item
            return item
        return None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
