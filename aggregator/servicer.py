"""The Aggregator gRPC service's handlers: decode, validate, lock, apply, notify.

    servicer = AggregatorServicer(core, config, run_dir, restored)
    servicer.attach(loop)            # weight streams and the K-of-M deadline run on `loop`
    ...                              # grpc calls PushGradients, WatchWeights, Stats, ReportEval
    servicer.detach()                # the deadline task, for the server to cancel on its loop
    servicer.close()

The math lives in core.py, the serialized weights and shared memory in segments.py, the
server and its event loop in service.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import numpy as np

from aggregator.core import AggregatorCore, GradientError
from aggregator.dedup import PushDedup
from aggregator.evals import check_eval_report, eval_row, feed_swa, newest_reports
from aggregator.persistence import Checkpointer
from aggregator.segments import GradientSegments, WeightsCache
from foundation.checkpoint import VersionLease, save_checkpoint
from foundation.config import AggregatorConfig
from foundation.policy import GROUPS, SWA_GROUP
from foundation.proto import fleetrl_pb2 as pb
from foundation.proto import fleetrl_pb2_grpc as pb_grpc
from foundation.wire import WIRE_DTYPES, WireError, cap, from_tensor

WATCH_HEARTBEAT_SEC = 1.0  # a watcher re-checks its connection at least this often


class AggregatorServicer(pb_grpc.AggregatorServicer):
    """The Aggregator service's handlers over one AggregatorCore; every step under one lock."""

    def __init__(
        self,
        core: AggregatorCore,
        config: AggregatorConfig,
        run_dir: pathlib.Path | None,
        restored: dict | None = None,
    ) -> None:
        self.core = core
        self.config = config
        self.run_dir = run_dir
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's event loop (attach())
        self._version_event: asyncio.Event | None = None  # set (and replaced) on every new version
        self._waiters = 0  # streams waiting for a version (changed on the loop, read by any thread)
        self._deadline_task: asyncio.Task | None = None  # closes K-of-M steps at their deadline
        self._cache = WeightsCache()
        self._segments = GradientSegments()
        self.counts: Counter[str] = Counter()
        self.rejected_by_field: Counter[str] = Counter()
        self.subscribers = 0
        # "curve" and "full": the newest of each, the run's earlier ones after a restart or resume
        self.last_by_kind: dict[str, pb.EvalReport] = newest_reports(run_dir / "evals.jsonl") if run_dir else {}
        self.last_eval = max(self.last_by_kind.values(), key=lambda r: r.version, default=pb.EvalReport())
        self.metrics: dict[str, float] = {}
        self.rejected_by_learner: Counter[str] = Counter()
        self.dedup: PushDedup[pb.GradientAck] = PushDedup()
        # Gradients applied per (learner_id, incarnation) in the history of the current weights:
        # checkpointed with them ("pushes"), so an audit can count sent against applied.
        self.applied_by_sender: Counter[tuple[int, int]] = Counter()
        self._restore_pushes((restored or {}).get("pushes", {}))
        self.lease: VersionLease | None = None
        if run_dir is not None:
            self.lease = VersionLease(run_dir / "version_lease", ahead=config.checkpoint_every_versions)
            self.lease.ensure(core.version)
        self._checkpointer = Checkpointer(run_dir, config.keep_checkpoints)
        self._last_checkpoint_version = core.version

    # --- gradients -------------------------------------------------------------------
    async def PushGradients(self, request: pb.Gradients, context: grpc.aio.ServicerContext) -> pb.GradientAck:
        """On the event loop, not the unary thread pool: a push is ~1 ms of work under the lock,
        and the hop to a pool thread and back cost more than that in a Push fleet."""
        try:
            return self._push(request)
        except (GradientError, WireError) as err:
            with self._lock:
                self.counts["rejected"] += 1
                self.rejected_by_field[err.field] += 1
                self.rejected_by_learner[f"learner-{request.learner_id}"] += 1
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, cap(str(err), 512))
            raise  # abort raises; this line only tells type checkers so

    async def PushGradientsStream(
        self, requests: AsyncIterator[pb.Gradients], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GradientAck]:
        """PushGradients for each push of one long-lived call, acked in order; a refused push
        ends the call with PushGradients' status (INVALID_ARGUMENT naming the field)."""
        async for request in requests:
            yield await self.PushGradients(request, context)

    def _push(self, request: pb.Gradients) -> pb.GradientAck:
        key = (request.learner_id, request.incarnation, request.seq)
        tensors = decode_gradients(request)
        norm = tensors.pop("norm_stats")
        with self._lock:
            earlier = self.dedup.answer(key)
            if earlier is not None:  # a retry of a push already handled: the same answer, nothing applied
                self.counts["duplicate"] += 1
                return pb.GradientAck(
                    applied=earlier.applied, version=earlier.version, reason=earlier.reason, duplicate=True
                )
            if request.HasField("shared"):
                tensors.update(self._segments.gradients(request, tensors, self.core.sizes))
                self.counts["gradients_shared"] += 1
            learner = f"learner-{request.learner_id}"
            result = self.core.submit(request.base_version, tensors, norm, learner, request.batch_size)
            self.counts["applied" if result.applied else "stale" if result.stale else "refused"] += 1
            if result.applied:
                self.applied_by_sender[key[:2]] += 1
                self.metrics = dict(request.metrics)
                self._stepped()
            ack = pb.GradientAck(applied=result.applied, version=result.version, reason=result.reason)
            self.dedup.record(key, ack)
            self._maybe_checkpoint()
        return ack

    def _stepped(self) -> None:
        """After a step may have made a version (lock held): lease it, write it to the segments
        same-host readers map, then announce it to the streams."""
        if self.lease is not None:
            self.lease.ensure(self.core.version)  # persisted before anyone can see it
        for groups, readers in self._cache.readers.items():
            if readers and self._cache.write(self.core, groups):
                self.counts["weights_shared"] += 1
        self._announce()

    async def _close_due_steps(self) -> None:
        """K-of-M's deadline: a step still short of K gradients closes once its first is
        step_deadline_ms old, whether or not another push ever comes (a learner that left)."""
        period = max(self.config.step_deadline_ms / 4000.0, 0.002)
        while True:
            await asyncio.sleep(period)
            with self._lock:
                if self.core.close_due():
                    self._stepped()
                    self._maybe_checkpoint()

    def responsive(self, timeout_sec: float) -> bool:
        """True if the step lock can be taken within `timeout_sec` (no step is wedged)."""
        if not self._lock.acquire(timeout=timeout_sec):
            return False
        self._lock.release()
        return True

    def _maybe_checkpoint(self) -> None:
        """Hand a due checkpoint to the writer thread (call with the lock held): acks never
        wait on a disk write."""
        due = self.core.version - self._last_checkpoint_version >= self.config.checkpoint_every_versions
        if self.run_dir is not None and due:
            self._last_checkpoint_version = self.core.version
            self._checkpointer.submit(self._state())

    def _state(self) -> dict:
        """The core's state and the pushes that led to it, taken together (with the lock held)."""
        state = self.core.state()
        state["pushes"] = {
            f"{learner_id}:{incarnation}": {
                "seq": seq,
                "applied": self.applied_by_sender[(learner_id, incarnation)],
                "ack": {"applied": ack.applied, "version": ack.version, "reason": ack.reason},
            }
            for (learner_id, incarnation), (seq, ack) in self.dedup.newest().items()
        }
        return state

    def _restore_pushes(self, pushes: dict) -> None:
        for sender, record in pushes.items():
            learner_id, incarnation = (int(x) for x in sender.split(":"))
            ack = pb.GradientAck(**record["ack"])
            self.dedup.record((learner_id, incarnation, int(record["seq"])), ack)
            self.applied_by_sender[(learner_id, incarnation)] = int(record["applied"])

    def checkpoint_now(self, clean_shutdown: bool = False) -> pathlib.Path | None:
        """Write a checkpoint of the current state now (after any queued one)."""
        if self.run_dir is None:
            return None
        with self._lock:
            state = self._state()
            state["clean_shutdown"] = clean_shutdown
            self._last_checkpoint_version = self.core.version
        self._checkpointer.flush()
        return save_checkpoint(self.run_dir / "checkpoints", state, keep=self.config.keep_checkpoints)

    def flush_checkpoints(self) -> None:
        """Wait until every checkpoint handed to the writer thread is on disk."""
        self._checkpointer.flush()

    def close(self) -> None:
        self._checkpointer.close()
        with self._lock:
            self._cache.close()
            self._segments.close()

    # --- weights -----------------------------------------------------------------------
    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve weight streams on `loop` (the asyncio server's)."""
        self._loop = loop
        self._version_event = asyncio.Event()
        if self.core.grads_per_step > 1 and self.config.step_deadline_ms > 0:
            self._deadline_task = loop.create_task(self._close_due_steps())

    @property
    def deadline_task(self) -> asyncio.Task | None:
        """The task closing K-of-M steps at their deadline; None before attach() and after detach()."""
        return self._deadline_task

    def detach(self) -> asyncio.Task | None:
        """Stop closing K-of-M steps by deadline: the deadline task, for the caller to cancel on
        the loop that runs it (None when there is none). No step closes after this."""
        task, self._deadline_task = self._deadline_task, None
        return task

    def _announce(self) -> None:
        """A new version (called from any thread, after it was made): wake the streams waiting
        for one. None waiting (same-host learners read shared memory; rate-limited streams
        sleep), no wake-up: waking the loop cost ~9% of the aggregator's CPU in a Push fleet.
        A stream counts itself waiting before it reads the version, and this reads the count
        after the version moved, so one of the two sees the other."""
        if self._loop is not None and self._waiters:
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        event, self._version_event = self._version_event, asyncio.Event()
        if event is not None:
            event.set()

    async def WatchWeights(self, request: pb.WatchRequest, context: grpc.aio.ServicerContext):
        groups = tuple(request.groups) or GROUPS
        unknown = [g for g in groups if g not in (*GROUPS, SWA_GROUP)]
        if unknown:
            known = [*GROUPS, SWA_GROUP]
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"groups: unknown {unknown}; known {known}")
        if request.min_interval_sec < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"min_interval_sec: {request.min_interval_sec} < 0")
        with self._lock:
            self.subscribers += 1
            segment = self._cache.segment(self.core, groups) if request.shared_memory else None
            shared = segment is not None and request.shared_memory_key == segment.key  # mapped and checked
            if shared:  # from now on every version is written there (_stepped), and nothing is sent
                self._cache.readers[groups] += 1
                if self._cache.write(self.core, groups):
                    self.counts["weights_shared"] += 1
        try:
            if shared:
                while True:  # open until the client goes or the server stops: that is all it tells
                    await asyncio.sleep(WATCH_HEARTBEAT_SEC)
            sent = request.after_version if request.HasField("after_version") else -1
            next_send = 0.0
            while True:  # until the client goes (the stream is cancelled) or the server stops
                delay = next_send - time.monotonic()
                if delay > 0:  # min_interval_sec: newer versions wait (conflated) until then
                    await asyncio.sleep(delay)
                    continue
                event = self._version_event
                self._waiters += 1
                try:
                    if self.core.version <= sent and event is not None:
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(event.wait(), WATCH_HEARTBEAT_SEC)
                        continue
                finally:
                    self._waiters -= 1
                with self._lock:  # a step is at most ~1 ms: the loop waits that long at worst
                    msg = self._cache.get(self.core, groups, segment)
                    self.counts["weights_sent"] += 1
                sent = msg.version
                next_send = time.monotonic() + request.min_interval_sec
                yield msg
        finally:
            with self._lock:
                self.subscribers -= 1
                if shared:
                    self._cache.readers[groups] -= 1

    # --- stats and evaluation ------------------------------------------------------------
    def Stats(self, request: pb.AggregatorStatsRequest, context: grpc.ServicerContext) -> pb.AggregatorStats:
        with self._lock:
            return pb.AggregatorStats(
                version=self.core.version,
                gradients_applied=self.counts["applied"],
                gradients_stale=self.counts["stale"],
                gradients_rejected=self.counts["rejected"],
                subscribers=self.subscribers,
                last_eval=self.last_eval,
                env_steps=self.last_eval.env_steps,
                last_curve=self.last_by_kind.get("curve"),
                last_full=self.last_by_kind.get("full"),
                rejected_by_learner=dict(self.rejected_by_learner),
                steps_skipped=self.core.steps_skipped,
                gradients_clipped=self.core.clipped,
                gradients_duplicate=self.counts["duplicate"],
            )

    def ReportEval(self, request: pb.EvalReport, context: grpc.ServicerContext) -> pb.EvalAck:
        problem, actor = check_eval_report(request, self.core)
        if problem is not None:
            self.counts["eval_rejected"] += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        with self._lock:
            feed_swa(self.core, request, actor, self.metrics)
            if request.kind != "swa_curve":  # the average's score is kept apart from the live scores
                if request.version >= self.last_eval.version:
                    self.last_eval = request
            newest = self.last_by_kind.get(request.kind)
            if newest is None or request.version >= newest.version:
                self.last_by_kind[request.kind] = request
            row = eval_row(request, self.core.swa)
        if self.run_dir is not None:
            with open(self.run_dir / "evals.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
        return pb.EvalAck()


def decode_gradients(request: pb.Gradients) -> dict[str, np.ndarray]:
    """The push's tensors by name, norm_stats included; GradientError or WireError naming the field."""
    if request.incarnation == 0:
        raise GradientError("incarnation", "0: every learner process start draws a new nonzero incarnation")
    if request.seq == 0:
        raise GradientError("seq", "0: a learner's pushes are numbered from 1")
    if request.batch_size == 0:
        raise GradientError("batch_size", "0: a gradient comes from at least one transition")
    tensors: dict[str, np.ndarray] = {}
    for i, t in enumerate(request.tensors):
        if t.name in tensors:
            raise WireError(f"tensors[{i}].name", f"duplicate tensor {cap(t.name)!r}")
        if t.name == "norm_stats" and t.dtype != "float32":
            raise WireError("tensors[norm_stats].dtype", f"{cap(t.dtype)!r} is not 'float32' (sums of squares need it)")
        tensors[t.name] = from_tensor(t, "tensors", WIRE_DTYPES)
    if "norm_stats" not in tensors:
        raise GradientError("tensors", "missing norm_stats")
    return tensors
