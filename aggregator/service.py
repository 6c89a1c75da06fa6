"""gRPC adapter over AggregatorCore: gradients in, versioned weights out.

    with AggregatorServer(core, run_dir=..., config=...) as server:   # binds, restores checkpoint
        print(server.address)                                         # learners push here
        server.wait_for_termination()

The servicer only decodes, validates, locks and notifies; the math lives in core.py.
"""

from __future__ import annotations

import json
import logging
import pathlib
import threading
import time
from collections import Counter
from concurrent import futures
from typing import Any

import grpc
import numpy as np

from aggregator.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from aggregator.core import AggregatorCore, GradientError
from fleetrl.config import AggregatorConfig, RunConfig
from fleetrl.policy import GROUPS, ModelSpec
from fleetrl.process import write_ready_file
from fleetrl.proto import fleetrl_pb2 as pb
from fleetrl.proto import fleetrl_pb2_grpc as pb_grpc
from fleetrl.tb import ScalarWriter
from fleetrl.wire import WireError, from_tensor, to_tensor
from sim.registry import get_task

log = logging.getLogger("fleetrl.aggregator")

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
]
WATCH_HEARTBEAT_SEC = 1.0  # a watcher re-checks its connection at least this often


class _WeightsCache:
    """Serialized Weights per group selection, rebuilt once per version, shared by subscribers."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, ...], pb.Weights] = {}

    def get(self, core: AggregatorCore, groups: tuple[str, ...]) -> pb.Weights:
        cached = self._cache.get(groups)
        if cached is not None and cached.version == core.version:
            return cached
        flat = core.weights(groups)
        msg = pb.Weights(
            version=core.version,
            tensors=[to_tensor(g, flat[g]) for g in groups],
            layout=core.spec.to_json(),
        )
        self._cache[groups] = msg
        return msg


class AggregatorServicer(pb_grpc.AggregatorServicer):
    def __init__(self, core: AggregatorCore, config: AggregatorConfig, run_dir: pathlib.Path | None) -> None:
        self.core = core
        self.config = config
        self.run_dir = run_dir
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._cache = _WeightsCache()
        self.counts: Counter[str] = Counter()
        self.rejected_by_field: Counter[str] = Counter()
        self.subscribers = 0
        self.last_eval = pb.EvalReport()
        self.metrics: dict[str, float] = {}
        self._last_checkpoint_version = core.version

    # --- gradients -------------------------------------------------------------------
    def PushGradients(self, request: pb.Gradients, context: grpc.ServicerContext) -> pb.GradientAck:
        try:
            tensors: dict[str, np.ndarray] = {}
            for i, t in enumerate(request.tensors):
                if t.name in tensors:
                    raise WireError(f"tensors[{i}].name", f"duplicate tensor {t.name!r}")
                tensors[t.name] = from_tensor(t, "tensors")
            norm = tensors.pop("norm_stats", None)
            if norm is None:
                raise GradientError("tensors", "missing norm_stats")
            with self._changed:
                result = self.core.submit(request.base_version, tensors, norm)
                if result.stale:
                    self.counts["stale"] += 1
                else:
                    self.counts["applied"] += 1
                    self.metrics = dict(request.metrics)
                    self._changed.notify_all()
                state = self._maybe_checkpoint_state()
        except (GradientError, WireError) as err:
            self.counts["rejected"] += 1
            self.rejected_by_field[err.field] += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        if state is not None:
            self._write_checkpoint(state)
        reason = "stale: computed against weights older than max_grad_staleness" if result.stale else ""
        return pb.GradientAck(applied=not result.stale, version=result.version, reason=reason)

    def _maybe_checkpoint_state(self) -> dict[str, Any] | None:
        due = self.core.version - self._last_checkpoint_version >= self.config.checkpoint_every_versions
        if self.run_dir is None or not due:
            return None
        self._last_checkpoint_version = self.core.version
        return self.core.state()

    def _write_checkpoint(self, state: dict[str, Any]) -> None:
        assert self.run_dir is not None
        path = save_checkpoint(self.run_dir / "checkpoints", state, keep=self.config.keep_checkpoints)
        log.info("checkpoint version %d -> %s", state["version"], path)

    def checkpoint_now(self, clean_shutdown: bool = False) -> pathlib.Path | None:
        if self.run_dir is None:
            return None
        with self._lock:
            state = self.core.state()
            state["clean_shutdown"] = clean_shutdown
            self._last_checkpoint_version = self.core.version
        return save_checkpoint(self.run_dir / "checkpoints", state, keep=self.config.keep_checkpoints)

    # --- weights -----------------------------------------------------------------------
    def WatchWeights(self, request: pb.WatchRequest, context: grpc.ServicerContext):
        groups = tuple(request.groups) or GROUPS
        unknown = [g for g in groups if g not in GROUPS]
        if unknown:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"groups: unknown {unknown}; known {list(GROUPS)}")
        if request.min_interval_sec < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"min_interval_sec: {request.min_interval_sec} < 0")
        with self._lock:
            self.subscribers += 1
        try:
            yield from self._stream(request, groups, context)
        finally:
            with self._lock:
                self.subscribers -= 1

    def _stream(self, request: pb.WatchRequest, groups: tuple[str, ...], context: grpc.ServicerContext):
        sent = request.after_version if request.HasField("after_version") else -1
        next_send = 0.0
        while context.is_active():
            delay = next_send - time.monotonic()
            if delay > 0:
                time.sleep(min(delay, WATCH_HEARTBEAT_SEC))
                continue
            with self._changed:
                if self.core.version <= sent:
                    self._changed.wait(WATCH_HEARTBEAT_SEC)
                    continue
                msg = self._cache.get(self.core, groups)
            sent = msg.version
            next_send = time.monotonic() + request.min_interval_sec
            yield msg

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
            )

    def ReportEval(self, request: pb.EvalReport, context: grpc.ServicerContext) -> pb.EvalAck:
        if not 0.0 <= request.success_rate <= 1.0 or not np.isfinite(request.success_rate):
            self.counts["eval_rejected"] += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"success_rate: {request.success_rate} not in [0, 1]")
        if request.version > self.core.version:
            self.counts["eval_rejected"] += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"version: {request.version} > {self.core.version}")
        with self._lock:
            if request.version >= self.last_eval.version:
                self.last_eval = request
        if self.run_dir is not None:
            row = {
                "version": request.version,
                "success_rate": request.success_rate,
                "mean_return": request.mean_return,
                "episodes": request.episodes,
                "env_steps": request.env_steps,
                "evaluator": request.evaluator,
                "time": time.time(),
            }
            with open(self.run_dir / "evals.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
        return pb.EvalAck()


class AggregatorServer:
    """The aggregator gRPC server as a context manager; restores the newest checkpoint."""

    def __init__(
        self,
        core: AggregatorCore,
        config: AggregatorConfig,
        run_dir: str | pathlib.Path | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.run_dir = pathlib.Path(run_dir) if run_dir is not None else None
        if self.run_dir is not None:
            newest = latest_checkpoint(self.run_dir / "checkpoints")
            if newest is not None:
                state = load_checkpoint(newest)
                core.load_state(state)
                if not state.get("clean_shutdown", False):
                    # After a crash, up to checkpoint_every_versions - 1 newer versions may have been
                    # broadcast and lost. Jumping past them keeps versions monotonic for every
                    # subscriber (a learner never holds weights "ahead" of the aggregator).
                    core.version += config.checkpoint_every_versions
                log.info("restored version %d from %s", core.version, newest)
        self.servicer = AggregatorServicer(core, config, self.run_dir)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), options=GRPC_OPTIONS)
        pb_grpc.add_AggregatorServicer_to_server(self.servicer, self._server)
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"aggregator could not bind {host}:{port}")
        self.address = f"{host}:{self.port}"
        self._server.start()

    def __enter__(self) -> AggregatorServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self._server.wait_for_termination(timeout)

    def close(self, grace: float = 1.0) -> None:
        self._server.stop(grace).wait()  # no step can land after the final checkpoint
        self.servicer.checkpoint_now(clean_shutdown=True)


def run_aggregator(
    config: RunConfig, port: int, run_dir: str | None, ready_file: str | None, stop: threading.Event
) -> int:
    """The aggregator role process: serve until `stop`, checkpoint on the way out. Returns the version."""
    task = get_task(config.sim.task)
    spec = ModelSpec(task.obs_dim, task.goal_dim, task.act_dim, config.learner.hidden_sizes)
    grads_per_step = config.aggregator.grads_per_step or config.learner.num_learners
    core = AggregatorCore(spec, config.aggregator, grads_per_step, config.learner.max_grad_staleness, task.name)
    writer = _summary_writer(run_dir, "aggregator")
    with AggregatorServer(core, config.aggregator, run_dir, port=port) as server:
        write_ready_file(ready_file, server.address)
        log.info("aggregator at %s, version %d, %d gradients per step", server.address, core.version, grads_per_step)
        logged = -1
        while not stop.wait(2.0):
            if writer is not None and core.version != logged:
                logged = core.version
                for key, value in dict(server.servicer.metrics).items():
                    writer.add_scalar(f"learner/{key}", value, logged)
                writer.add_scalar("aggregator/gradients_stale", server.servicer.counts["stale"], logged)
                writer.flush()
    if writer is not None:
        writer.close()
    return core.version


def _summary_writer(run_dir: str | None, name: str) -> ScalarWriter | None:
    return None if run_dir is None else ScalarWriter(pathlib.Path(run_dir) / "tb" / name)
