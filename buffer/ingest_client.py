"""The sampler's side of the buffer: pushes over gRPC to an ingest service, at least once.

    with IngestClient(address, sampler_id=3, run_id=run_id, push_timeout_sec=10.0) as ingest:
        ack = ingest.push(transitions, seq=seq, policy_version=v, task_id=t, env_steps=n)

The learner's side (it reads Redis directly, no gRPC hop) is `buffer.client.ReplaySampler`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import cast

import grpc

from buffer.ratelimit import RATE_LIMITED, RATE_LIMITED_MAX_SEC, RATE_LIMITED_POLL_SEC
from foundation.errors import FleetrlError, RunFailed
from foundation.proto import fleetrl_pb2 as pb
from foundation.proto import fleetrl_pb2_grpc as pb_grpc
from foundation.transport import NO_SECURITY, Backoff, Security
from foundation.wire import Transitions, batch_to_proto

MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # a TransitionBatch; gRPC's own limit (transport.py) is larger


class PushRejected(FleetrlError, ValueError):
    """The ingest service refused a batch as invalid (INVALID_ARGUMENT); retrying cannot help."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"push rejected ({code.name}): {details}")
        self.code = code
        self.details = details


class IngestUnavailable(RunFailed, ConnectionError):
    """Push was retried for max_retry_sec without an ack."""


class IngestClient:
    """A sampler's connection to one ingest service: at-least-once pushes.

    push() retries UNAVAILABLE, DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED with capped
    exponential backoff until acked (flow control's RESOURCE_EXHAUSTED, "rate limited": from
    RATE_LIMITED_POLL_SEC up to RATE_LIMITED_MAX_SEC, counted in `rate_limited_sec`, never
    logged as a fault). The service
    stores each (sampler_id, incarnation, seq) once, so a retry of a batch that was in fact
    stored is answered `duplicate=True`. INVALID_ARGUMENT raises PushRejected at once; any
    other status propagates as grpc.RpcError.
    """

    RETRYABLE = (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    BACKOFF_FIRST_SEC = 0.05
    BACKOFF_MAX_SEC = 2.0

    def __init__(
        self,
        address: str,
        *,
        sampler_id: int,
        run_id: str,
        push_timeout_sec: float = 10.0,
        security: Security = NO_SECURITY,
    ) -> None:
        if push_timeout_sec <= 0:
            raise ValueError(f"push_timeout_sec ({push_timeout_sec}) must be > 0")
        self.address = address
        self.sampler_id = sampler_id
        self.run_id = run_id
        self.push_timeout_sec = push_timeout_sec
        self._channel = security.channel(address)
        self._stub = pb_grpc.ReplayIngestStub(self._channel)
        self._backoff = Backoff(f"ingest service {address}", self.BACKOFF_FIRST_SEC, self.BACKOFF_MAX_SEC, sampler_id)
        # New for every client, i.e. every sampler process start: with seq, the idempotency key.
        self.incarnation = secrets.randbits(63) or 1
        self.rate_limited_sec = 0.0  # waited on flow control (buffer/ratelimit.py): learners behind

    def __enter__(self) -> IngestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

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
        """Push one batch until acked (an ack means it is in Redis); returns the PushAck.

        `seq` must grow by one per new batch of this sampler and stay the same on a re-push.
        `episodes` and `successes` count the training episodes that ended in this batch (the
        buffer's Stats report training success over the last 100 episodes from them);
        `demonstration`: one expert episode (sampler.demo_episodes), its rows marked.
        With `max_retry_sec`, gives up with IngestUnavailable after that long; by default it
        retries until `should_stop()` (then IngestUnavailable too): the caller's stop flag, so a
        sampler whose buffer is gone still stops promptly. While retrying it logs the
        unreachable service once a minute.
        """
        tags = dict(seq=seq, policy_version=policy_version, task_id=task_id, env_steps=env_steps)
        batch = self._batch(transitions, demonstration, episodes=episodes, successes=successes, **tags)
        self._backoff.reset()  # one per client: the once-a-minute log spans its pushes
        held = RATE_LIMITED_POLL_SEC
        while True:
            try:
                return self._stub.Push(batch, timeout=self.push_timeout_sec)
            except grpc.RpcError as e:
                call = cast(grpc.Call, e)  # every RpcError raised by a unary call is also a Call
                code = call.code()
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise PushRejected(code, call.details()) from e
                if code not in self.RETRYABLE:
                    raise
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED and (call.details() or "").startswith(RATE_LIMITED):
                    held = self._hold(held, seq, should_stop, e)
                else:
                    self._back_off(call, seq, max_retry_sec, should_stop, e)

    def _batch(self, transitions: Transitions, demonstration: bool, **tags: int) -> pb.TransitionBatch:
        """The TransitionBatch of one push (`tags`: seq, policy_version, task_id and counts);
        ValueError when it is over the message limit."""
        batch = batch_to_proto(
            transitions,
            run_id=self.run_id,
            sampler_id=self.sampler_id,
            incarnation=self.incarnation,
            demonstration=demonstration,
            **tags,
        )
        if batch.ByteSize() > MAX_MESSAGE_BYTES:
            # gRPC would refuse it with RESOURCE_EXHAUSTED, which is retried: fail here instead.
            raise ValueError(
                f"batch of {len(transitions)} transitions is {batch.ByteSize()} bytes, over the "
                f"{MAX_MESSAGE_BYTES}-byte message limit: push it in smaller batches"
            )
        return batch

    def _hold(self, held: float, seq: int, should_stop: Callable[[], bool], err: grpc.RpcError) -> float:
        """Flow control refused the push (learners are behind): wait `held` seconds, not past a
        stop, and return the next wait (each refusal re-sends the batch: ask less often)."""
        if should_stop():
            raise IngestUnavailable(f"push of seq {seq} still rate limited when stopping") from err
        time.sleep(held)
        self.rate_limited_sec += held
        return min(2 * held, RATE_LIMITED_MAX_SEC)

    def _back_off(
        self,
        call: grpc.Call,
        seq: int,
        max_retry_sec: float | None,
        should_stop: Callable[[], bool],
        err: grpc.RpcError,
    ) -> None:
        """The service is away (or slow): wait before the next try, or raise IngestUnavailable
        once `max_retry_sec` has passed or `should_stop()`."""
        backoff, code = self._backoff, call.code()
        out_of_time = max_retry_sec is not None and backoff.elapsed_sec + backoff.delay > max_retry_sec
        if out_of_time or should_stop():
            why = f"after {max_retry_sec}s" if out_of_time else "before stopping"
            raise IngestUnavailable(
                f"push of seq {seq} to {self.address} not acked {why}: last status {code.name}: {call.details()}"
            ) from err
        backoff.wait(code.name, f"; still retrying seq {seq}")

    def stats(self, wait_for_ready: bool = False, timeout_sec: float | None = None) -> pb.BufferStats:
        """The service's counters (one call, no retry; `wait_for_ready` waits out a (re)start,
        for at most `timeout_sec`, default push_timeout_sec)."""
        timeout = self.push_timeout_sec if timeout_sec is None else timeout_sec
        return self._stub.Stats(pb.BufferStatsRequest(), timeout=timeout, wait_for_ready=wait_for_ready)
