"""Clients of the aggregator: the only way other roles reach it.

    with AggregatorClient(address) as agg, agg.watch("learner-0") as weights:
        w = weights.wait_newer_than(-1, timeout=30)      # WeightsSnapshot(version, tensors, spec)
        ack = agg.push_gradients(GradientPush(...))     # learners
        agg.report_eval(pb.EvalReport(...))              # evaluator

`WeightsWatcher` (aggregator/watcher.py) keeps one WatchWeights stream open in a daemon thread,
reconnects when the aggregator restarts, and always holds only the newest version (older ones
are conflated). Other roles import it, like the rest, from here.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import numpy as np

from aggregator.watcher import WeightsWatcher
from foundation.proto import fleetrl_pb2 as pb
from foundation.proto import fleetrl_pb2_grpc as pb_grpc
from foundation.shm import SharedWeightsWriter
from foundation.transport import NO_SECURITY, Backoff, Security
from foundation.wire import to_tensor

__all__ = ["AggregatorClient", "GradientPush", "PendingPush", "WeightsWatcher"]

log = logging.getLogger("fleetrl.aggregator.client")

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _never() -> bool:
    return False


def _nothing() -> None:
    return None


@dataclass
class GradientPush:
    learner_id: int
    base_version: int
    grads: dict[str, np.ndarray]
    norm_stats: np.ndarray
    batch_size: int
    metrics: dict[str, float] = field(default_factory=dict)
    wire_dtype: str = "float32"  # the gradients' ("bfloat16": half the bytes); norm_stats is always float32

    def to_proto(self, incarnation: int, seq: int, shared: pb.SharedSegment | None = None) -> pb.Gradients:
        """`shared`: the gradients are in that segment (written by the caller), not in tensors."""
        tensors = [] if shared is not None else [to_tensor(g, v, self.wire_dtype) for g, v in self.grads.items()]
        tensors.append(to_tensor("norm_stats", self.norm_stats))
        return pb.Gradients(
            learner_id=self.learner_id,
            base_version=self.base_version,
            tensors=tensors,
            metrics=self.metrics,
            batch_size=self.batch_size,
            incarnation=incarnation,
            seq=seq,
            shared=shared,
        )


class AggregatorClient:
    def __init__(self, address: str, timeout_sec: float = 30.0, security: Security = NO_SECURITY) -> None:
        self.address = address
        self.timeout_sec = timeout_sec
        self._channel = security.channel(address)
        self._stub = pb_grpc.AggregatorStub(self._channel)
        # Idempotency key of gradient pushes: new per client (per process start), seq per push.
        self.incarnation = secrets.randbits(63) or 1
        self._seq = 0
        self._gradients: SharedWeightsWriter | None = None  # share_gradients(): this client's segment
        self._stream: _PushStream | None = None  # push_gradients_async's open PushGradientsStream

    def __enter__(self) -> AggregatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._drop_stream()
        self._channel.close()
        self._stop_sharing()

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    @property
    def shares_gradients(self) -> bool:
        return self._gradients is not None

    def share_gradients(self, sizes: dict[str, int]) -> bool:
        """Write float32 gradients into a /dev/shm segment of this client's and send only its
        name: for a learner on the aggregator's host (one that maps its weights). Each push's
        gradient is written when it is sent, so at most one push may be in flight (as learners
        do). A push the aggregator cannot read that way is sent again with its bytes, and
        sharing stops. False: no segment could be made (the bytes go over gRPC)."""
        try:
            self._gradients = SharedWeightsWriter(sizes, kind="grads")
        except OSError as err:
            log.warning("gradients stay on gRPC: no shared-memory segment (%s)", err)
            return False
        return True

    def _stop_sharing(self) -> None:
        if self._gradients is not None:
            self._gradients.close()
            self._gradients = None

    def _numbered(self, push: GradientPush) -> pb.Gradients:
        self._seq += 1
        segment = self._gradients
        if segment is None or push.wire_dtype != "float32" or set(push.grads) != set(segment.sizes):
            return push.to_proto(self.incarnation, self._seq)
        segment.write(self._seq, push.grads)  # the segment's version says which push it holds
        return push.to_proto(self.incarnation, self._seq, pb.SharedSegment(path=segment.path, key=segment.key))

    def _with_bytes(self, push: GradientPush, message: pb.Gradients, err: grpc.RpcError) -> pb.Gradients | None:
        """For a push refused because its segment could not be read: the same push (same seq:
        a refused push is not recorded) with its bytes, sharing stopped. None: not that refusal."""
        details = err.details() or ""
        refused = err.code() == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("shared")
        if not refused or not message.HasField("shared"):
            return None
        log.warning("aggregator cannot read this learner's gradient segment (%s): gradients over gRPC", details)
        self._stop_sharing()
        return push.to_proto(message.incarnation, message.seq)

    def push_gradients(self, push: GradientPush) -> pb.GradientAck:
        """Send, retrying the same message while the aggregator is unreachable (it may be
        restarting); the aggregator applies it at most once (acks say `duplicate` on a retry)."""
        message = self._numbered(push)
        try:
            return self.resend(message)
        except grpc.RpcError as err:
            again = self._with_bytes(push, message, err)
            if again is None:
                raise
            return self.resend(again)

    def resend(
        self, message: pb.Gradients, should_stop: Callable[[], bool] = _never, on_wait: Callable[[], object] = _nothing
    ) -> pb.GradientAck:
        call = lambda: self._stub.PushGradients(message, timeout=self.timeout_sec)  # noqa: E731
        return self._retry(call, should_stop=should_stop, on_wait=on_wait)

    def push_gradients_async(self, push: GradientPush) -> PendingPush:
        """Send without waiting: the learner computes the next gradient while this one is
        applied. Pushes share one PushGradientsStream (opened again after it breaks); a push
        whose ack does not come is sent again by PushGradients (PendingPush.result)."""
        message = self._numbered(push)
        if self._stream is None or self._stream.broken:
            self._stream = _PushStream(self._stub)
        return PendingPush(self, push, message, self._stream.send(message))

    def stats(self, timeout_sec: float = 5.0) -> pb.AggregatorStats:
        return self._stub.Stats(pb.AggregatorStatsRequest(), timeout=timeout_sec)

    def report_eval(
        self, report: pb.EvalReport, should_stop: Callable[[], bool] = _never, on_wait: Callable[[], object] = _nothing
    ) -> None:
        """Report a score, retrying while the aggregator is away, until acked or `should_stop()`;
        `on_wait()` runs between attempts (a heartbeat: waiting on a peer is not hanging)."""
        call = lambda: self._stub.ReportEval(report, timeout=self.timeout_sec)  # noqa: E731
        self._retry(call, should_stop=should_stop, on_wait=on_wait)

    def watch(
        self, subscriber: str, groups: tuple[str, ...] = (), min_interval_sec: float = 0.0, shared_memory: bool = False
    ) -> WeightsWatcher:
        """`shared_memory`: read the weights from the aggregator's /dev/shm segment when this
        process can map it (the same host); the stream then carries versions only."""
        return WeightsWatcher(self._stub, subscriber, groups, min_interval_sec, shared_memory)

    def _retry(
        self,
        call,
        deadline_sec: float = 120.0,
        should_stop: Callable[[], bool] = _never,
        on_wait: Callable[[], object] = _nothing,
    ):
        backoff = Backoff(f"aggregator {self.address}")
        while True:
            try:
                return call()
            except grpc.RpcError as err:
                out_of_time = backoff.elapsed_sec + backoff.delay > deadline_sec
                if err.code() not in RETRYABLE or out_of_time or should_stop():
                    raise
                on_wait()
                backoff.wait(err.code().name)


class _StreamEnded(grpc.RpcError):
    """A push stream that closed before acking every push sent on it."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the push stream ended before this push's ack"


class _PushStream:
    """One PushGradientsStream call. Pushes go in through a queue (gRPC's own thread sends
    them); a reader thread hands each ack to the oldest push still waiting, in order. When the
    call ends, every push still waiting gets its error (`broken`: open a new stream)."""

    def __init__(self, stub: pb_grpc.AggregatorStub) -> None:
        self._requests: queue.SimpleQueue[pb.Gradients | None] = queue.SimpleQueue()
        self._call = stub.PushGradientsStream(iter(self._requests.get, None))
        self._waiting: deque[futures.Future] = deque()
        self._error: grpc.RpcError | None = None
        self._lock = threading.Lock()
        threading.Thread(target=self._read_acks, name="push-acks", daemon=True).start()

    @property
    def broken(self) -> bool:
        return self._error is not None

    def send(self, message: pb.Gradients) -> futures.Future:
        future: futures.Future = futures.Future()
        with self._lock:
            if self._error is not None:
                future.set_exception(self._error)
                return future
            self._waiting.append(future)
        self._requests.put(message)
        return future

    def _read_acks(self) -> None:
        error: grpc.RpcError = _StreamEnded()
        try:
            for ack in self._call:
                with self._lock:
                    self._waiting.popleft().set_result(ack)
        except grpc.RpcError as err:  # the call itself: aggregator gone, a refused push, cancel()
            error = err
        with self._lock:
            self._error = error
            waiting, self._waiting = self._waiting, deque()
        for future in waiting:
            future.set_exception(error)

    def close(self) -> None:
        self._requests.put(None)  # ends the request iterator
        self._call.cancel()


class PendingPush:
    """An in-flight push; result() waits for the ack, re-sending if the aggregator was away."""

    def __init__(
        self, client: AggregatorClient, push: GradientPush, message: pb.Gradients, future: futures.Future
    ) -> None:
        self._client, self._push, self._message, self._future = client, push, message, future

    @property
    def seq(self) -> int:
        return self._message.seq

    @property
    def base_version(self) -> int:
        return self._message.base_version

    def result(
        self, retry: bool = True, should_stop: Callable[[], bool] = _never, on_wait: Callable[[], object] = _nothing
    ) -> pb.GradientAck:
        """The ack. With `retry`, a push the aggregator never took (it was unreachable, or
        stopping and cancelled the call) is sent again until acked; without, the error is raised.
        `on_wait()` runs every second of waiting (a heartbeat: a hung aggregator must not make
        its learners look hung). An ack that has not come within the client's timeout ends the
        stream (cancelled), and the push is sent again by PushGradients."""
        give_up = time.monotonic() + self._client.timeout_sec
        try:
            while True:
                try:
                    return self._future.result(timeout=1.0)
                except futures.TimeoutError:
                    on_wait()
                    if time.monotonic() >= give_up:
                        self._client._drop_stream()  # fails this future with CANCELLED
        except grpc.RpcError as err:
            again = self._client._with_bytes(self._push, self._message, err)
            if again is not None:
                self._message = again
                return self._client.resend(again, should_stop, on_wait)
            if not retry or err.code() not in (*RETRYABLE, grpc.StatusCode.CANCELLED):
                raise
            return self._client.resend(self._message, should_stop, on_wait)
