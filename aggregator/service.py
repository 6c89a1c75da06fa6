"""gRPC adapter over AggregatorCore: gradients in, versioned weights out.

    with AggregatorServer(core, run_dir=..., config=...) as server:   # binds, restores checkpoint
        print(server.address)                                         # learners push here

The servicer only decodes, validates, locks and notifies; the math lives in core.py.

The server is grpc's asyncio server: weight streams are coroutines on one event loop, so a
fleet's hundreds of subscribers hold no thread each. PushGradients is a coroutine on that
loop too (about a millisecond under the servicer's lock: cheaper than a hop to a thread and
back); Stats and ReportEval run as plain functions in a small thread pool, under the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import pathlib
import threading
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator
from concurrent import futures

import grpc
import grpc.aio
import numpy as np
import torch

from aggregator.core import AggregatorCore, GradientError
from aggregator.dedup import PushDedup
from aggregator.evals import check_eval_report, eval_row, feed_swa
from aggregator.persistence import Checkpointer, restore
from foundation.checkpoint import VersionLease, save_checkpoint
from foundation.config import AggregatorConfig, RunConfig
from foundation.policy import GRADIENT_GROUPS, GROUPS, SWA_GROUP, ModelSpec, model_spec
from foundation.process import Heartbeat, write_ready_file
from foundation.proto import fleetrl_pb2 as pb
from foundation.proto import fleetrl_pb2_grpc as pb_grpc
from foundation.shm import SharedWeightsReader, SharedWeightsWriter
from foundation.tb import ScalarWriter
from foundation.transport import GRPC_OPTIONS, NO_SECURITY, RefusalCounter, Security, StandardServices, parse_hostport
from foundation.wire import WIRE_DTYPES, WireError, cap, from_tensor, to_tensor
from sim.tasks import TaskSet

log = logging.getLogger("fleetrl.aggregator")

WATCH_HEARTBEAT_SEC = 1.0  # a watcher re-checks its connection at least this often


class _WeightsCache:
    """Serialized Weights per group selection, rebuilt once per version, shared by subscribers;
    and, for same-host subscribers, the shared-memory segment per group selection, written on
    every version while a stream reads it."""

    def __init__(self) -> None:
        self._cache: dict[tuple[tuple[str, ...], str], pb.Weights] = {}  # (groups, "plain"|"offer")
        self.segments: dict[tuple[str, ...], SharedWeightsWriter] = {}
        self.readers: Counter[tuple[str, ...]] = Counter()  # streams reading each segment

    def get(
        self, core: AggregatorCore, groups: tuple[str, ...], offer: SharedWeightsWriter | None = None
    ) -> pb.Weights:
        """The weights themselves; with `offer`, naming the segment that holds them too."""
        key = (groups, "plain" if offer is None else "offer")
        cached = self._cache.get(key)
        if cached is not None and cached.version == core.version:
            return cached
        flat = core.views(groups)  # no copy: to_tensor copies once, under the caller's lock
        msg = pb.Weights(
            version=core.version,
            tensors=[to_tensor(g, flat[g]) for g in groups],
            layout=_layout(core.spec),
            shared=_shared(offer),
        )
        self._cache[key] = msg
        return msg

    def write(self, core: AggregatorCore, groups: tuple[str, ...]) -> bool:
        """The current version into this selection's segment, once; True if written."""
        segment = self.segments[groups]
        if segment.version == core.version:
            return False
        segment.write(core.version, core.views(groups))
        return True

    def segment(self, core: AggregatorCore, groups: tuple[str, ...]) -> SharedWeightsWriter | None:
        """This selection's segment, made on first use; None where /dev/shm cannot be used."""
        if groups not in self.segments:
            try:  # no /dev/shm (not Linux, or not writable) is an OSError too
                self.segments[groups] = SharedWeightsWriter({g: v.size for g, v in core.views(groups).items()})
            except OSError as err:
                log.warning("weights stay on gRPC: no shared-memory segment (%s)", err)
                return None
        return self.segments[groups]

    def close(self) -> None:
        for segment in self.segments.values():
            segment.close()
        self.segments.clear()


class _GradientSegments:
    """Same-host learners' gradient segments, mapped on first use (a bounded few)."""

    LIMIT = 64

    def __init__(self) -> None:
        self._readers: dict[tuple[str, int], SharedWeightsReader] = {}

    def gradients(
        self, request: pb.Gradients, tensors: dict[str, np.ndarray], sizes: dict[str, int]
    ) -> dict[str, np.ndarray]:
        """The push's gradient groups, copied from its segment; WireError naming the field when
        the segment cannot be read here or does not hold this push."""
        inline = sorted(name for name in tensors if name != "norm_stats")
        if inline:
            raise WireError("tensors", f"{[cap(n, 30) for n in inline[:3]]} as well as shared: one place per push")
        where, key = request.shared.path, request.shared.key
        reader = self._readers.get((where, key))
        if reader is None:
            try:
                reader = SharedWeightsReader(where, key, {g: sizes[g] for g in GRADIENT_GROUPS})
            except FileNotFoundError:
                raise WireError("shared.path", f"{cap(where)}: no such segment on the aggregator's host") from None
            except PermissionError:
                raise WireError("shared.path", f"{cap(where)}: not readable by the aggregator's user") from None
            except (OSError, ValueError) as err:
                raise WireError("shared", cap(str(err), 300)) from None
            if len(self._readers) >= self.LIMIT:  # learners that left: drop the oldest mapping
                self._readers.pop(next(iter(self._readers))).close()
            self._readers[(where, key)] = reader
        read = reader.read()  # no wait: the learner finished writing before it pushed
        if read is None or read[0] != request.seq:
            held = "nothing readable" if read is None else f"push {read[0]}"
            raise WireError("shared", f"the segment holds {held}, not seq {request.seq}")
        return read[1]

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()


@functools.lru_cache(maxsize=8)
def _layout(spec: ModelSpec) -> str:
    """The spec's JSON, serialized once per spec rather than once per version sent."""
    return spec.to_json()


def _shared(segment: SharedWeightsWriter | None) -> pb.SharedSegment | None:
    return None if segment is None else pb.SharedSegment(path=segment.path, key=segment.key)


class AggregatorServicer(pb_grpc.AggregatorServicer):
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
        self._cache = _WeightsCache()
        self._segments = _GradientSegments()
        self.counts: Counter[str] = Counter()
        self.rejected_by_field: Counter[str] = Counter()
        self.subscribers = 0
        self.last_eval = pb.EvalReport()
        self.last_by_kind: dict[str, pb.EvalReport] = {}  # "curve" and "full": newest of each
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
        tensors = _decode_gradients(request)
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


class AggregatorServer:
    """The aggregator gRPC server (asyncio, on a thread of its own) as a context manager;
    restores the newest checkpoint."""

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
        self._loop = asyncio.new_event_loop()
        _quiet_poller_errors()
        self._thread = threading.Thread(target=self._loop.run_forever, name="aggregator-grpc", daemon=True)
        self._thread.start()
        self._pool = futures.ThreadPoolExecutor(max_workers=rpc_threads, thread_name_prefix="aggregator-rpc")
        self._server: grpc.aio.Server | None = None
        try:
            self.port = self._run(self._start(f"{host}:{port}", security))
        except BaseException:
            self._stop_loop()
            raise
        self.address = f"{host}:{self.port}"

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
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, grace: float = 1.0) -> None:
        if self._server is not None:
            self._run(self._server.stop(grace), timeout=grace + 10)  # no step can land after the final checkpoint
            self._server = None
        self._pool.shutdown(wait=True)
        self._stop_loop()
        self.servicer.checkpoint_now(clean_shutdown=True)
        self.servicer.close()

    def abandon(self) -> None:
        """Stop serving at once without the exit checkpoint: what a SIGKILL leaves (fault drills)."""
        if self._server is not None:
            self._run(self._server.stop(0))
            self._server = None
        self._pool.shutdown(wait=True)
        self._stop_loop()
        self.servicer.close()

    def _stop_loop(self) -> None:
        task = self.servicer._deadline_task
        if task is not None:  # no step closes after this (nor after the final checkpoint)
            self.servicer._deadline_task = None
            self._run(_cancelled(task), timeout=10)  # finished, not left pending in a stopped loop
        # Stopped, never closed: grpc's asyncio poller keeps a reader on the loop for the life
        # of the process, and a closed loop turns its next wake-up into a logged EBADF.
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


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


def _decode_gradients(request: pb.Gradients) -> dict[str, np.ndarray]:
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


def run_aggregator(
    config: RunConfig,
    listen: str,
    run_dir: str | None,
    ready_file: str | None,
    stop: threading.Event,
    security: Security = NO_SECURITY,
    advertise: str | None = None,
    heartbeat_path: str | None = None,
) -> int:
    """The aggregator role process: serve until `stop`, checkpoint on the way out. Returns the version.

    It beats every second while its step lock can be taken: a stopped (SIGSTOP) or wedged
    aggregator goes silent, and the watchdog replaces it."""
    torch.set_num_threads(1)  # small vectors: one thread; spare cores belong to learners and samplers
    tasks = TaskSet.for_run(config)
    spec = model_spec(config, tasks)
    grads_per_step = config.aggregator.grads_per_step or config.learner.num_learners
    core = AggregatorCore(spec, config.aggregator, grads_per_step, config.learner.max_grad_staleness, tasks.label)
    writer = _summary_writer(run_dir, "aggregator")
    host, port = parse_hostport(listen, "--listen")
    with AggregatorServer(core, config.aggregator, run_dir, host=host, port=port, security=security) as server:
        log.info("aggregator listening on %s, reachable at %s", server.address, advertise or server.address)
        write_ready_file(ready_file, advertise or server.address)
        log.info("aggregator at %s, version %d, %d gradients per step", server.address, core.version, grads_per_step)
        logged = -1
        heartbeat = Heartbeat(heartbeat_path, interval_sec=1.0)
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
                logged = core.version
                metrics = dict(server.servicer.metrics)
                for key, value in metrics.items():
                    writer.add_scalar(f"learner/{key}", value, logged)
                _write_expert_load(run_dir, logged, metrics)
                writer.add_scalar("aggregator/gradients_stale", server.servicer.counts["stale"], logged)
                writer.add_scalar("aggregator/steps_skipped", core.steps_skipped, logged)
                writer.add_scalar("aggregator/gradients_clipped", core.clipped, logged)
                for learner, count in dict(server.servicer.rejected_by_learner).items():
                    writer.add_scalar(f"aggregator/rejected/{learner}", count, logged)
                writer.flush()
    if writer is not None:
        writer.close()
    return core.version


def _write_expert_load(run_dir: str | None, version: int, metrics: dict[str, float]) -> None:
    """A MoE run's newest router metrics (beta, balancing loss, expert shares per layer) as
    <run_dir>/expert_load.json: the launcher puts them in summary.json."""
    moe = {k.removeprefix("moe/"): v for k, v in metrics.items() if k.startswith("moe/")}
    if run_dir is None or not moe:
        return
    path = pathlib.Path(run_dir) / "expert_load.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"version": version, **moe}, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _summary_writer(run_dir: str | None, name: str) -> ScalarWriter | None:
    return None if run_dir is None else ScalarWriter(pathlib.Path(run_dir) / "tb" / name)
