"""The ingest service: a thin gRPC adapter that validates pushes and hands them to storage.

    storage = TemporalStorage(redis_client, run_id, schema, config)
    with IngestServer(storage, task_ids=(0,), schema=schema, run_id=run_id, config=config) as server:
        ...  # samplers: IngestClient(server.address, ...)

`run_ingest_service(...)` is the buffer role (foundation/role.py): the same, blocking, until stopped.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import deque
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from redis.exceptions import RedisError, SlotNotCoveredError

from buffer.layout import MAX_UINT32
from buffer.ratelimit import RATE_LIMITED, SampleToInsertRatio, rate_limit
from buffer.storage import PushKey, RunCounters, TemporalStorage
from foundation.config import BufferConfig, RunConfig
from foundation.process import Heartbeat, write_ready_file
from foundation.proto import fleetrl_pb2 as pb
from foundation.proto import fleetrl_pb2_grpc as pb_grpc
from foundation.transport import (
    GRPC_OPTIONS,
    NO_SECURITY,
    RefusalCounter,
    Security,
    StandardServices,
    connect,
    parse_hostport,
)
from foundation.wire import Transitions, TransitionSchema, WireError, batch_from_proto, cap
from sim.tasks import TaskSet

# Redis failures worth a retry: the push is answered UNAVAILABLE and the sampler retries.
log = logging.getLogger("fleetrl.buffer")
REDIS_FAILURES = (RedisError, SlotNotCoveredError)
TRAIN_SUCCESS_EPISODES = 100  # the training-success curve is a moving rate over this many episodes


def validate_batch(
    batch: pb.TransitionBatch,
    *,
    run_id: str,
    task_ids: tuple[int, ...],
    schema: TransitionSchema,
    max_batch_transitions: int,
) -> Transitions:
    """The batch's columns, or WireError naming the first field that breaks the contract."""
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
    if batch.env_steps > n:
        raise WireError("env_steps", f"{batch.env_steps} env steps cannot yield {n} transitions")
    if batch.episodes > n:
        raise WireError("episodes", f"{batch.episodes} episodes cannot end in {n} transitions")
    if batch.successes > batch.episodes:
        raise WireError("successes", f"{batch.successes} exceeds episodes ({batch.episodes})")
    return batch_from_proto(batch, schema)


def _redis_answers(client) -> bool:
    try:
        return bool(client.ping())
    except REDIS_FAILURES:
        return False


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
    ) -> None:
        self.storage = storage
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
            return IngestCounters(*counts, run.env_steps_by_task)

    def Push(self, request: pb.TransitionBatch, context: grpc.ServicerContext) -> pb.PushAck:
        try:
            transitions = validate_batch(
                request,
                run_id=self.run_id,
                task_ids=self.task_ids,
                schema=self.schema,
                max_batch_transitions=self.config.max_batch_transitions,
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
        )


class IngestServer:
    """A gRPC server running ReplayIngestServicer; `with` starts it, close() stops it.

    `storage` may be a factory, called once in start(). The caller owns the storage's Redis
    client and closes it after this server.
    """

    def __init__(
        self,
        storage: TemporalStorage | Callable[[], TemporalStorage],
        *,
        task_ids: tuple[int, ...],
        schema: TransitionSchema,
        run_id: str,
        config: BufferConfig,
        port: int = 0,
        host: str = "127.0.0.1",
        security: Security = NO_SECURITY,
        limit: SampleToInsertRatio | None = None,
    ) -> None:
        self._storage = storage
        self.limit = limit
        self.security = security
        self.refused = RefusalCounter()  # calls without the fleet token
        self.task_ids = tuple(task_ids)  # the run's tasks: a multi-task run stores them all
        self.schema = schema
        self.run_id = run_id
        self.config = config
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self._server: grpc.Server | None = None
        self.servicer: ReplayIngestServicer | None = None

    def __enter__(self) -> IngestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("IngestServer is not started: call start() or use `with`")
        return self._port

    @property
    def address(self) -> str:
        """ "host:port" for IngestClient."""
        return f"{self.host}:{self.port}"

    def start(self) -> IngestServer:
        if self._server is not None:
            raise RuntimeError("IngestServer.start() called twice")
        storage = self._storage if isinstance(self._storage, TemporalStorage) else self._storage()
        self.servicer = ReplayIngestServicer(
            storage,
            task_ids=self.task_ids,
            schema=self.schema,
            run_id=self.run_id,
            config=self.config,
            limit=self.limit,
        )
        pool = futures.ThreadPoolExecutor(max_workers=self.config.grpc_workers)
        self.servicer.refused = self.refused
        interceptors = self.security.server_interceptors(self.refused)
        server = grpc.server(pool, options=GRPC_OPTIONS, interceptors=interceptors)
        pb_grpc.add_ReplayIngestServicer_to_server(self.servicer, server)
        self.standard = StandardServices(server, [pb.DESCRIPTOR.services_by_name["ReplayIngest"].full_name])
        target = f"{self.host}:{self._requested_port}"
        try:
            port = self.security.add_port(server, target)
        except RuntimeError as e:
            raise OSError(f"ingest service cannot bind {target}: {e}") from e
        if port == 0:
            raise OSError(f"ingest service cannot bind {target}: port in use?")
        server.start()
        self._server, self._port = server, port
        return self

    def close(self, grace: float | None = 1.0) -> None:
        """Stop taking pushes; in-flight ones get `grace` seconds to finish. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait()


@dataclass(frozen=True)
class IngestService:
    """What one ingest service process serves, and where."""

    config: BufferConfig
    run_id: str
    task_ids: tuple[int, ...]
    schema: TransitionSchema
    listen: str = "127.0.0.1:0"  # HOST:PORT to bind
    advertise: str | None = None  # HOST:PORT others reach it at (default: the bound address)
    limit: SampleToInsertRatio | None = None  # flow control: buffer.ratelimit.rate_limit(config)


@dataclass(frozen=True)
class IngestEndpoints:
    listen: str  # HOST:PORT to serve on
    redis: str  # host:port[,host:port...] of Redis Cluster nodes
    advertise: str | None = None  # HOST:PORT others reach it at (default: the bound address)
    ready_file: str | None = None  # where to write the reachable address once serving


def run_ingest_service(
    config: RunConfig,
    identity: int,
    endpoints: IngestEndpoints,
    security: Security,
    stop: threading.Event,
    heartbeat: Heartbeat,
) -> int:
    """The buffer role (foundation/role.py): serve the run's tasks until `stop` is set, then
    stop gracefully; returns the batches stored."""
    tasks = TaskSet.for_run(config)
    service = IngestService(
        config.buffer,
        config.run_id,
        tasks.ids,
        tasks.schema(),
        endpoints.listen,
        endpoints.advertise,
        rate_limit(config),
    )
    return serve_ingest(service, endpoints.redis, endpoints.ready_file, security, stop, heartbeat)


def serve_ingest(
    service: IngestService,
    redis_addresses: str,
    ready_file: str | None,
    security: Security,
    stop: threading.Event,
    heartbeat: Heartbeat,
) -> int:
    """Serve `service` until `stop` is set; returns the batches stored.

    Once listening, writes its "host:port" to `ready_file` (atomically, for launchers to wait
    on). It beats every second while serving: a stopped one goes silent and the watchdog
    replaces it. The Redis client and the server are closed on the way out, on an error too.
    """
    s = service
    host, port = parse_hostport(s.listen, "--listen")
    client = connect(redis_addresses, security)
    try:
        storage = TemporalStorage(client, s.run_id, s.schema, s.config)
        with IngestServer(
            storage,
            task_ids=s.task_ids,
            schema=s.schema,
            run_id=s.run_id,
            config=s.config,
            port=port,
            host=host,
            security=security,
            limit=s.limit,
        ) as server:
            address = s.advertise or server.address
            log.info("ingest service listening on %s, reachable at %s", server.address, address)
            write_ready_file(ready_file, address)
            while not stop.wait(1.0):  # health: SERVING only while its Redis answers
                server.standard.set_serving(_redis_answers(client))
                c = server.servicer.counters() if server.servicer is not None else None
                if c is not None:
                    heartbeat.beat(
                        env_steps=c.env_steps,
                        batches=c.batches,
                        duplicates=c.duplicates,
                        rejected=c.rejected,
                        head=c.head,
                        rate_limited=c.rate_limited,
                        serving=float(bool(server.standard.serving)),
                    )
            return server.servicer.counters().batches if server.servicer is not None else 0
    finally:
        client.close()
