"""The ingest service: a gRPC server of the ReplayIngestServicer (buffer/servicer.py), which
validates pushes and hands them to storage.

    storage = TemporalStorage(redis_client, run_id, schema, config)
    with IngestServer(storage, task_ids=(0,), schema=schema, run_id=run_id, config=config) as server:
        ...  # samplers: IngestClient(server.address, ...)

`run_ingest_service(...)` is the buffer role (foundation/role.py): the same, blocking, until stopped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass

import grpc

from buffer.ratelimit import SampleToInsertRatio, rate_limit
from buffer.servicer import REDIS_FAILURES, ReplayIngestServicer
from buffer.storage import TemporalStorage
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
from foundation.wire import TransitionSchema
from sim.tasks import TaskSet

log = logging.getLogger("fleetrl.buffer")


def _redis_answers(client) -> bool:
    try:
        return bool(client.ping())
    except REDIS_FAILURES:
        return False


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
        n_step: int = 1,
    ) -> None:
        self._storage = storage
        self.limit = limit
        self.n_step = n_step  # the run's learner.n_step (validate_batch)
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
            n_step=self.n_step,
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
    n_step: int = 1  # the run's learner.n_step: a truncated episode's last n - 1 steps store no row


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
        config.learner.n_step,
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
            n_step=s.n_step,
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
