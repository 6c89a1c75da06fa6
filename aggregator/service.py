"""gRPC adapter over AggregatorCore: gradients in, versioned weights out.

    with AggregatorServer(core, run_dir=..., config=...) as server:   # restores checkpoint; with: binds
        print(server.address)                                         # learners push here

The server runs the servicer (servicer.py: decodes, validates, locks and notifies) on an
asyncio event loop of its own; the math lives in core.py, weights ready to send and shared
memory in segments.py, TensorBoard output in outputs.py.

The server is grpc's asyncio server: weight streams are coroutines on one event loop, so a
fleet's hundreds of subscribers hold no thread each. PushGradients is a coroutine on that
loop too (about a millisecond under the servicer's lock: cheaper than a hop to a thread and
back); Stats and ReportEval run as plain functions in a small thread pool, under the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pathlib
import threading
import traceback
from concurrent import futures
from dataclasses import dataclass

import grpc
import grpc.aio
import torch

from aggregator.core import AggregatorCore
from aggregator.outputs import summary_writer, write_version_scalars
from aggregator.persistence import restore
from aggregator.servicer import AggregatorServicer
from foundation.config import AggregatorConfig, RunConfig
from foundation.policy import model_spec
from foundation.process import Heartbeat, write_ready_file
from foundation.proto import fleetrl_pb2 as pb
from foundation.proto import fleetrl_pb2_grpc as pb_grpc
from foundation.tb import ScalarWriter
from foundation.transport import GRPC_OPTIONS, NO_SECURITY, RefusalCounter, Security, StandardServices, parse_hostport
from sim.tasks import TaskSet

log = logging.getLogger("fleetrl.aggregator")


class AggregatorServer:
    """The aggregator gRPC server (asyncio, on a thread of its own) as a context manager.
    Made, it has restored the newest checkpoint; `start()` (or `with`) binds and serves, as
    the ingest service's IngestServer does."""

    def __init__(
        self,
        core: AggregatorCore,
        config: AggregatorConfig,
        run_dir: str | pathlib.Path | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        security: Security = NO_SECURITY,
        rpc_threads: int = 8,
    ) -> None:
        self.run_dir = pathlib.Path(run_dir) if run_dir is not None else None
        self.refused = RefusalCounter()  # calls without the fleet token, ReportEval included
        restored = restore(core, self.run_dir / "checkpoints", config) if self.run_dir is not None else None
        self.servicer = AggregatorServicer(core, config, self.run_dir, restored)
        self.host, self._requested_port, self._security, self._rpc_threads = host, port, security, rpc_threads
        self._port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("AggregatorServer is not started: call start() or use `with`")
        return self._port

    @property
    def address(self) -> str:
        """ "host:port" for AggregatorClient."""
        return f"{self.host}:{self.port}"

    def start(self) -> AggregatorServer:
        """Bind and serve; on a failure (a taken port) nothing is left running."""
        if self._thread is not None:
            raise RuntimeError("AggregatorServer.start() called twice")
        self._loop = asyncio.new_event_loop()
        _quiet_poller_errors()
        self._thread = threading.Thread(target=self._loop.run_forever, name="aggregator-grpc", daemon=True)
        self._thread.start()
        self._pool = futures.ThreadPoolExecutor(max_workers=self._rpc_threads, thread_name_prefix="aggregator-rpc")
        try:
            self._port = self._run(self._start(f"{self.host}:{self._requested_port}", self._security))
        except BaseException:
            self._pool.shutdown(wait=True)
            self._stop_loop()
            raise
        return self

    def _run(self, coroutine, timeout: float | None = 30.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _start(self, address: str, security: Security) -> int:
        self.servicer.attach(self._loop)
        server = grpc.aio.server(
            migration_thread_pool=self._pool,  # the unary calls: plain functions, run in this pool
            options=GRPC_OPTIONS,
            interceptors=security.aio_server_interceptors(self.refused),
        )
        pb_grpc.add_AggregatorServicer_to_server(self.servicer, server)
        names = [pb.DESCRIPTOR.services_by_name["Aggregator"].full_name]
        self.standard = StandardServices(server, names, loop=self._loop)
        await self.standard.set_serving_async(True)
        port = security.add_port(server, address)
        if port == 0:
            raise OSError(f"aggregator could not bind {address}")
        await server.start()
        self._server = server
        return port

    def __enter__(self) -> AggregatorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, grace: float = 1.0) -> None:
        if self._server is not None:
            self._run(self._server.stop(grace), timeout=grace + 10)  # no step can land after the final checkpoint
            self._server = None
        if self._thread is not None:
            self._pool.shutdown(wait=True)
            self._stop_loop()
        self.servicer.checkpoint_now(clean_shutdown=True)
        self.servicer.close()

    def abandon(self) -> None:
        """Stop serving at once without the exit checkpoint: what a SIGKILL leaves (fault drills)."""
        if self._server is not None:
            self._run(self._server.stop(0))
            self._server = None
        if self._thread is not None:
            self._pool.shutdown(wait=True)
            self._stop_loop()
        self.servicer.close()

    def _stop_loop(self) -> None:
        task = self.servicer.detach()
        if task is not None:  # no step closes after this (nor after the final checkpoint)
            self._run(_cancelled(task), timeout=10)  # finished, not left pending in a stopped loop
        # Stopped, never closed: grpc's asyncio poller keeps a reader on the loop for the life
        # of the process, and a closed loop turns its next wake-up into a logged EBADF.
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None


async def _cancelled(task: asyncio.Task) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class _PollerNoise(logging.Filter):
    """Drops grpc's known-spurious poller wake-up errors (EBADF/EAGAIN raised in
    PollerCompletionQueue._handle_events as grpc's asyncio stack shuts down, grpc/grpc#25364)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, OSError) and error.__traceback__ is not None:
            frames = traceback.extract_tb(error.__traceback__)
            return not (frames and frames[-1].name.endswith("_handle_events"))
        return True


def _quiet_poller_errors() -> None:
    logger = logging.getLogger("asyncio")  # where every event loop reports a callback's exception
    if not any(isinstance(f, _PollerNoise) for f in logger.filters):
        logger.addFilter(_PollerNoise())


@dataclass(frozen=True)
class AggregatorEndpoints:
    listen: str  # HOST:PORT to serve on
    advertise: str | None = None  # HOST:PORT others reach it at (default: the bound address)
    ready_file: str | None = None  # where to write the reachable address once serving
    run_dir: str | None = None  # checkpoints and TensorBoard; None: neither


def run_aggregator(
    config: RunConfig,
    identity: int,
    endpoints: AggregatorEndpoints,
    security: Security,
    stop: threading.Event,
    heartbeat: Heartbeat,
) -> int:
    """The aggregator role (foundation/role.py): serve until `stop`, checkpoint on the way out.
    Returns the version.

    It beats every second while its step lock can be taken: a stopped (SIGSTOP) or wedged
    aggregator goes silent, and the watchdog replaces it."""
    listen, advertise, run_dir = endpoints.listen, endpoints.advertise, endpoints.run_dir
    torch.set_num_threads(1)  # small vectors: one thread; spare cores belong to learners and samplers
    tasks = TaskSet.for_run(config)
    spec = model_spec(config, tasks)
    grads_per_step = config.grads_per_step()
    core = AggregatorCore(spec, config.aggregator, grads_per_step, config.learner.max_grad_staleness, tasks.label)
    host, port = parse_hostport(listen, "--listen")
    writer = summary_writer(run_dir, "aggregator")
    try:
        with AggregatorServer(core, config.aggregator, run_dir, host=host, port=port, security=security) as server:
            log.info("aggregator listening on %s, reachable at %s", server.address, advertise or server.address)
            write_ready_file(endpoints.ready_file, advertise or server.address)
            log.info(
                "aggregator at %s, version %d, %d gradients per step", server.address, core.version, grads_per_step
            )
            _serve(server, stop, heartbeat, writer, run_dir)
    finally:  # on error too: the TensorBoard writer's file is closed, its events flushed
        if writer is not None:
            writer.close()
    return core.version


def _serve(
    server: AggregatorServer,
    stop: threading.Event,
    heartbeat: Heartbeat,
    writer: ScalarWriter | None,
    run_dir: str | None,
) -> None:
    """Beat every second while the step lock can be taken; write the scalars of each new version."""
    core, logged = server.servicer.core, -1
    while not stop.wait(1.0):
        counts = server.servicer.counts
        if not server.servicer.responsive(timeout_sec=5.0):
            log.warning("aggregator: the step lock was held for 5 s; no heartbeat")
            continue
        heartbeat.beat(
            version=core.version,
            gradients_applied=counts["applied"],
            gradients_stale=counts["stale"],
            gradients_rejected=counts["rejected"],
            gradients_duplicate=counts["duplicate"],
            subscribers=server.servicer.subscribers,
            steps_skipped=core.steps_skipped,
            weights_shared=counts["weights_shared"],  # versions announced to /dev/shm readers
            gradients_shared=counts["gradients_shared"],  # pushes read from a learner's segment
        )
        if writer is not None and core.version != logged:
            logged = write_version_scalars(writer, server.servicer, run_dir)
