"""The ingest servicer: Push validates a batch and hands it to storage; Stats reports counters.

    servicer = ReplayIngestServicer(storage, task_ids=(0,), schema=schema, run_id=run_id, config=config)
    pb_grpc.add_ReplayIngestServicer_to_server(servicer, server)   # what IngestServer does

`validate_batch` is the pure part (no network, no Redis); buffer/service.py runs the server.
"""

from __future__ import annotations

import re
import threading
from collections import deque
from dataclasses import dataclass, field

import grpc
from redis.exceptions import RedisError, SlotNotCoveredError

from buffer.layout import MAX_UINT32
from buffer.ratelimit import RATE_LIMITED, SampleToInsertRatio
from buffer.storage import PushKey, RunCounters, TemporalStorage
from foundation.config import BufferConfig
from foundation.proto import fleetrl_pb2 as pb
from foundation.proto import fleetrl_pb2_grpc as pb_grpc
from foundation.transport import RefusalCounter
from foundation.wire import Transitions, TransitionSchema, WireError, batch_from_proto, cap

# Redis failures worth a retry: the push is answered UNAVAILABLE and the sampler retries.
REDIS_FAILURES = (RedisError, SlotNotCoveredError)
TRAIN_SUCCESS_EPISODES = 100  # the training-success curve is a moving rate over this many episodes


def validate_batch(
    batch: pb.TransitionBatch,
    *,
    run_id: str,
    task_ids: tuple[int, ...],
    schema: TransitionSchema,
    max_batch_transitions: int,
    n_step: int = 1,
) -> Transitions:
    """The batch's columns, or WireError naming the first field that breaks the contract.

    Each env step yields at least one row, except that with n-step returns (`n_step` > 1) a
    truncated episode's last n - 1 steps yield none (sampler/her.py): a batch may then hold up
    to n - 1 rows fewer than its env steps per episode it carries (or per batch, if it ends none).
    """
    if batch.run_id != run_id:
        raise WireError("run_id", f"{cap(batch.run_id, 200)!r}, but this service stores run {run_id!r}")
    if batch.incarnation == 0:
        raise WireError("incarnation", "0: every sampler process start draws a new nonzero incarnation")
    if batch.seq == 0:
        raise WireError("seq", "0: a sampler incarnation numbers its batches from 1")
    if batch.task_id not in task_ids:
        raise WireError("task_id", f"{batch.task_id}, but this service stores the run's tasks {list(task_ids)} only")
    n = batch.num_transitions
    if not 1 <= n <= max_batch_transitions:
        raise WireError("num_transitions", f"{n} is outside [1, max_batch_transitions={max_batch_transitions}]")
    if batch.policy_version > MAX_UINT32:
        raise WireError("policy_version", f"{batch.policy_version} exceeds {MAX_UINT32} (stored as uint32)")
    rowless = (n_step - 1) * max(batch.episodes, 1)  # a truncated episode's last n - 1 steps
    if batch.env_steps > n + rowless:
        why = f" (n-step {n_step}: at most {rowless} env steps without a row)" if n_step > 1 else ""
        raise WireError("env_steps", f"{batch.env_steps} env steps cannot yield {n} transitions{why}")
    if batch.episodes > n:
        raise WireError("episodes", f"{batch.episodes} episodes cannot end in {n} transitions")
    if batch.successes > batch.episodes:
        raise WireError("successes", f"{batch.successes} exceeds episodes ({batch.episodes})")
    if batch.demonstration and batch.episodes:
        why = "a demonstration ends no training episode (the training-success curve is the policy's)"
        raise WireError("episodes", f"{batch.episodes}: {why}")
    return batch_from_proto(batch, schema)


def rejection_reason(field_name: str) -> str:
    """Counter key of a rejection: the field without its column name ('columns[obs].shape' ->
    'columns.shape'), so the set of reasons stays small."""
    return re.sub(r"\[[^\]]*\]", "", field_name)


@dataclass
class IngestCounters:
    """What one ingest service has done since it started; the head, env steps and batches are
    the run's (kept in Redis with the data, so they hold across restarts and services)."""

    head: int = 0
    env_steps: int = 0  # env steps ever acked, each batch once
    batches: int = 0
    duplicates: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    episodes: int = 0
    train_success: float = 0.0  # over the last TRAIN_SUCCESS_EPISODES episodes
    rate_limited: int = 0  # pushes answered RESOURCE_EXHAUSTED by flow control (retried by the sampler)
    env_steps_by_task: dict[int, int] = field(default_factory=dict)  # registry task id -> env steps
    demo_episodes_by_sampler: dict[int, int] = field(default_factory=dict)  # sampler id -> demonstrations

    @property
    def rejected(self) -> int:
        return sum(self.rejected_by_reason.values())


class ReplayIngestServicer(pb_grpc.ReplayIngestServicer):
    """Push: validate, store once per (sampler_id, incarnation, seq), ack. Stats: counters and windows.

    A bad batch is answered INVALID_ARGUMENT with "field: what is wrong", counted per reason,
    and nothing stored is touched. A Redis failure is answered UNAVAILABLE (the sampler
    retries; the batch was not acked). Dedup is in Redis, exactly once: see buffer.storage.
    """

    def __init__(
        self,
        storage: TemporalStorage,
        *,
        task_ids: tuple[int, ...],
        schema: TransitionSchema,
        run_id: str,
        config: BufferConfig,
        limit: SampleToInsertRatio | None = None,
        n_step: int = 1,
    ) -> None:
        self.storage = storage
        self.n_step = n_step  # the run's learner.n_step: rows a batch may hold fewer than env steps
        self.limit = limit  # flow control: inserts wait while learners lag (buffer/ratelimit.py)
        self.task_ids = tuple(task_ids)  # the run's tasks: a multi-task run stores them all
        self.schema = schema
        self.run_id = run_id
        self.config = config
        self._counters = IngestCounters()  # this service's own; the run's figures are in Redis
        self._run = RunCounters(0, 0, {})  # the run's figures last read from Redis
        self.refused = RefusalCounter()  # set by IngestServer: calls refused for their token
        self._outcomes: deque[bool] = deque(maxlen=TRAIN_SUCCESS_EPISODES)  # newest training episodes
        self._lock = threading.Lock()

    def counters(self, run: RunCounters | None = None) -> IngestCounters:
        """A copy of the counters. The run's figures: `run`, else read from Redis now (while
        Redis fails, the last ones read: a heartbeat still beats)."""
        if run is None:
            try:
                run = self.storage.counters()
            except REDIS_FAILURES:
                run = self._run
        with self._lock:
            self._run = run
            c = self._counters
            recent = self._outcomes
            success = sum(recent) / len(recent) if recent else 0.0
            reasons = dict(c.rejected_by_reason)
            if self.refused.total:
                reasons["authorization"] = self.refused.total
            counts = (c.head, run.env_steps, run.batches, c.duplicates, reasons, c.episodes, success, c.rate_limited)
            return IngestCounters(*counts, run.env_steps_by_task, run.demo_episodes_by_sampler)

    def Push(self, request: pb.TransitionBatch, context: grpc.ServicerContext) -> pb.PushAck:
        try:
            transitions = validate_batch(
                request,
                run_id=self.run_id,
                task_ids=self.task_ids,
                schema=self.schema,
                max_batch_transitions=self.config.max_batch_transitions,
                n_step=self.n_step,
            )
        except WireError as e:
            with self._lock:
                reasons = self._counters.rejected_by_reason
                reason = rejection_reason(e.field)
                reasons[reason] = reasons.get(reason, 0) + 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, cap(str(e), 1000))
        # Exactly once: the dedup record lives in Redis, written by the script that reserves the
        # positions (see buffer/storage.py), so it holds across ingest restarts and services.
        key = PushKey(request.sampler_id, request.incarnation, request.seq)
        try:
            if self.limit is not None:
                inserted, sampled = self.storage.flow()
                if not self.limit.insert_ok(inserted, sampled, len(transitions)):
                    with self._lock:
                        self._counters.rate_limited += 1
                    details = f"{RATE_LIMITED}: learners sampled {sampled} rows of {inserted} stored; retry shortly"
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, details)
            result = self.storage.write(  # counts the batch and its env steps in Redis, once
                transitions,
                task_id=request.task_id,
                policy_version=request.policy_version,
                key=key,
                env_steps=request.env_steps,
                demonstration=request.demonstration,
            )
        except REDIS_FAILURES as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"redis write failed, batch not acked: {cap(str(e), 200)}")
        head = result.committed
        if result.duplicate:
            with self._lock:
                self._counters.duplicates += 1
                self._counters.head = max(self._counters.head, head)
            return pb.PushAck(seq=request.seq, stored=0, duplicate=True, head=head)
        with self._lock:
            self._counters.head = max(self._counters.head, head)
            self._counters.episodes += request.episodes
            failures = request.episodes - request.successes
            self._outcomes.extend([True] * request.successes + [False] * failures)
        return pb.PushAck(seq=request.seq, stored=result.stored, duplicate=False, head=head)

    def Stats(self, request: pb.BufferStatsRequest, context: grpc.ServicerContext) -> pb.BufferStats:
        try:
            head, oldest, _ = self.storage.snapshot()
            c = self.counters(self.storage.counters())
        except REDIS_FAILURES as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"redis read failed: {e}")
        return pb.BufferStats(
            head=head,
            env_steps=c.env_steps,
            batches=c.batches,
            rejected=c.rejected,
            duplicates=c.duplicates,
            oldest_window=oldest,
            newest_window=max(0, self.storage.layout.windows_below(head) - 1),
            episodes=c.episodes,
            train_success=c.train_success,
            env_steps_by_task=c.env_steps_by_task,
            demo_episodes_by_sampler=c.demo_episodes_by_sampler,
        )
