"""The learner role process: sample from Redis, compute gradients, push to the aggregator.

    batches (Redis, direct) --> compute_gradients(weights v) --> PushGradients --> aggregator
                                           ^                                          |
                                           +------------ WatchWeights (v+1) ----------+

The learner holds no optimizer: it always differentiates the newest weights it has, and waits
only when those fall more than `max_grad_staleness` versions behind what it last pushed.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import grpc
import numpy as np
import torch

from aggregator.client import AggregatorClient, GradientPush, PendingPush, WeightsWatcher
from buffer.client import ReplaySampler
from buffer.ratelimit import rate_limit
from foundation.acting import WeightsSnapshot
from foundation.config import RunConfig
from foundation.ledger import AckLedger
from foundation.policy import LEARNER_GROUPS
from foundation.process import Heartbeat
from foundation.proto import fleetrl_pb2 as pb
from foundation.task_schedule import TaskSchedule
from foundation.transport import Security, connect
from learner.batches import Batches
from learner.gradients import Hyperparams, compute_gradients
from nets.flat import GradientBuffers
from nets.models import GROUPS, SACModel
from sim.tasks import TaskSet

log = logging.getLogger("fleetrl.learner")


@dataclass(frozen=True)
class LearnerEndpoints:
    aggregator: str  # host:port of the aggregator
    redis: str  # host:port[,host:port...] of Redis Cluster nodes
    ack_log_dir: str | None = None  # AckLedger files: every acked gradient push, for audits and fault tests


def _load(model: SACModel, snapshot: WeightsSnapshot, tau: float, versions: int) -> None:
    """Load a snapshot (its vectors become the parameters: a snapshot is the learner's own
    copy); without critic_target in it, move the learner's own target critics toward the new
    critics as the aggregator's Polyak update would over `versions` versions (the same update
    to float rounding for one version; for several, the same total rate on the newest critics)."""
    for group in GROUPS:
        if group in snapshot.tensors:
            model.set_flat(group, snapshot.tensors[group], share=group != "critic_target")
    if "critic_target" not in snapshot.tensors and versions > 0:
        rate = 1.0 - (1.0 - tau) ** versions
        with torch.no_grad():  # target += rate * (critic - target): one pass over both, one call
            targets: list[torch.Tensor] = list(model.critic_target.parameters())
            lives: list[torch.Tensor] = list(model.critic.parameters())
            torch._foreach_lerp_(targets, lives, rate)


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when torch sees a GPU, else cpu; 'cuda' without one is a clear error."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("learner.device is 'cuda' but torch sees no CUDA device: use 'cpu' or 'auto'")
    return torch.device(name)


def run_learner(
    config: RunConfig,
    learner_id: int,
    endpoints: LearnerEndpoints,
    security: Security,
    stop: threading.Event,
    heartbeat: Heartbeat,
) -> int:
    """The learner role (foundation/role.py): loop until `stop` is set; returns the number of
    gradients pushed."""
    torch.set_num_threads(config.learner.torch_threads)
    tasks = TaskSet.for_run(config)
    redis_client = connect(endpoints.redis, security)
    try:
        with (
            AggregatorClient(endpoints.aggregator, security=security) as agg,
            agg.watch(f"learner-{learner_id}", LEARNER_GROUPS, shared_memory=config.learner.shared_memory) as weights,
        ):
            replay = _replay(config, learner_id, redis_client, tasks, agg.incarnation)
            with agg.watch(f"learner-{learner_id}-start") as everything:  # the target critics, once
                snapshot = _wait(lambda: everything.wait_newer_than(-1, timeout=1.0), stop, heartbeat)
            if snapshot is None:
                return 0
            log.info(
                "learner %d: weights v%d; waiting for %d transitions",
                learner_id,
                snapshot.version,
                config.learner.min_replay_transitions,
            )
            _wait_for_replay(replay, config.learner.min_replay_transitions, stop, heartbeat)
            device = resolve_device(config.learner.device)
            batches = Batches(replay, config.learner.batch_size, device, config.learner.prefetch, tasks, heartbeat)
            ledger: AckLedger | None = None
            try:  # an error anywhere here still stops the prefetch thread and closes the ledger
                loop = _GradientLoop(config, learner_id, tasks.act_dim, agg, weights, batches, replay, heartbeat)
                if tasks.multi:
                    loop.schedule = TaskSchedule.for_run(config, tasks.names, agg, replay.set_task_shares)
                if endpoints.ack_log_dir:
                    ledger = AckLedger(endpoints.ack_log_dir, f"learner-{learner_id}", agg.incarnation)
                    loop.ledger = ledger
                pushed = loop.run(snapshot, stop)
                heartbeat.close(pushed=pushed)
            finally:
                batches.close()
                if ledger is not None:
                    ledger.close()
    finally:
        redis_client.close()
    log.info("learner %d: stopped after %d gradients", learner_id, pushed)
    return pushed


def seed_learner_process(config: RunConfig, learner_id: int, incarnation: int) -> int:
    """Seeds torch (the policy's sampling noise) and returns the replay's seed, both streams of
    this learner *process*: a restarted or resumed learner (a new incarnation) draws neither its
    previous life's batches nor its noise again (torch starts every process on one fixed seed)."""
    replay_seed, torch_seed = np.random.SeedSequence([config.aggregator.seed, learner_id, incarnation]).generate_state(
        2
    )
    torch.manual_seed(int(torch_seed))
    return int(replay_seed)


def _replay(config: RunConfig, learner_id: int, redis_client, tasks: TaskSet, incarnation: int) -> ReplaySampler:
    """This learner's replay: the run's windows in a local replica, sampled as learner.* says,
    with this process's streams (seed_learner_process)."""
    return ReplaySampler(
        redis_client,
        config.run_id,
        tasks.schema(),
        config.buffer,
        seed=seed_learner_process(config, learner_id, incarnation),
        refresh_interval_sec=config.learner.buffer_refresh_sec,
        sampling=config.learner.replay_sampling,
        half_life=config.learner.recency_half_life,
        max_policy_lag=config.learner.max_policy_lag,
        limit=rate_limit(config),
        balance_tasks=tasks.ids,  # a multi-task run: every batch holds each task equally
    )


def _wait_for_replay(replay: ReplaySampler, transitions: int, stop: threading.Event, heartbeat: Heartbeat) -> None:
    """Until the replay holds `transitions` (learner.min_replay_transitions) or the role stops."""
    while not stop.is_set() and replay.size() < transitions:
        replay.try_refresh()
        heartbeat.beat(replay=replay.size())
        stop.wait(0.1)


class _GradientLoop:
    """sample -> gradients on the newest weights -> push (one in flight), until stopped."""

    def __init__(
        self,
        config: RunConfig,
        learner_id: int,
        act_dim: int,
        agg: AggregatorClient,
        weights: WeightsWatcher,
        batches: Batches,
        replay: ReplaySampler,
        heartbeat: Heartbeat,
    ) -> None:
        self.hp = Hyperparams.for_run(config, act_dim)
        if config.learner.autocast != "off":  # "auto" resolved on this learner's own CPU
            log.info(
                "learner %d: autocast %s (learner.autocast %s)", learner_id, self.hp.autocast, config.learner.autocast
            )
        self.config, self.learner_id = config, learner_id
        self.agg, self.weights, self.batches, self.heartbeat = agg, weights, batches, heartbeat
        self.replay = replay  # its size and flow-control counters, for the heartbeat
        self.ledger: AckLedger | None = None
        self.schedule: TaskSchedule | None = None  # learner.task_sampling 'success' or 'focus'
        self._share_tried = False
        # Two sets in turn: push N's gradient stays intact while it is in flight, and the
        # set is written again for push N + 2, after push N was acked (run's order).
        self.buffers = GradientBuffers()

    def run(self, snapshot: WeightsSnapshot, stop: threading.Event) -> int:
        learner = self.config.learner
        model = SACModel(snapshot.spec).train_gates(self.config.model.gate_grad)
        model = model.batch_renorm(learner.crossq.momentum, learner.crossq.warmup)
        model = model.fuse_critics(self.config.learner.fused_critics).to(self.batches.device)
        tau = self.config.aggregator.tau
        _load(model, snapshot, tau, 0)
        loaded, need, pushed = snapshot.version, snapshot.version, 0
        pending: PendingPush | None = None  # one push in flight: its step overlaps the next gradient
        while not stop.is_set():
            if self.schedule is not None:
                self.schedule.refresh()
            fresh = _fresh_weights(self.weights, snapshot, need, self.heartbeat)
            if fresh is None:
                continue
            snapshot = fresh
            if snapshot.version != loaded:
                with self.heartbeat.phase("load_weights"):
                    _load(model, snapshot, tau, snapshot.version - loaded)
                loaded = snapshot.version
            push = self._gradient(model, snapshot.version, stop)
            if push is None:
                break
            if pending is not None:
                ack = self._acked(pending, stop)
                if ack is None:  # stopping while the aggregator is away: this gradient is lost
                    pending = None
                    break
                # The next gradient may be computed on weights at most max_grad_staleness behind.
                need = max(need, int(ack.version) - self.config.learner.max_grad_staleness)
                self._beat(pushed, ack)
            self._share_gradients_once(push)
            pending = self.agg.push_gradients_async(push)
            pushed += 1
        if pending is not None:
            try:
                self._record(pending, pending.result(retry=False))
            except grpc.RpcError as err:  # the aggregator may be stopping too; one gradient is lost
                log.info("learner %d: last push not acked on shutdown (%s)", self.learner_id, err.code().name)
        return pushed

    def _acked(self, pending: PendingPush, stop: threading.Event) -> pb.GradientAck | None:
        """The in-flight push's ack, recorded; None when the role stops before the aggregator answers."""
        with self.heartbeat.phase("push"):
            try:
                ack = pending.result(should_stop=stop.is_set, on_wait=self.heartbeat.beat)
            except grpc.RpcError:
                if stop.is_set():
                    return None
                raise
        self._record(pending, ack)
        return ack

    def _beat(self, pushed: int, ack: pb.GradientAck) -> None:
        replay = self.replay
        self.heartbeat.beat(
            pushed=pushed,
            version=ack.version,
            replay=replay.size(),
            lag_fallbacks=replay.lag_fallbacks,
            rate_limited_sec=replay.rate_limited_sec,
        )

    def _share_gradients_once(self, push) -> None:
        """Gradients through /dev/shm where the weights come that way (the aggregator's host): asked once."""
        if not self.agg.shares_gradients and self.weights.shared_memory and not self._share_tried:
            self._share_tried = True
            if self.agg.share_gradients({g: v.size for g, v in push.grads.items()}):
                log.info("learner %d: weights and gradients through /dev/shm (same host)", self.learner_id)

    def _record(self, pending: PendingPush, ack: pb.GradientAck) -> None:
        if self.ledger is not None:
            self.ledger.record(
                seq=pending.seq,
                base_version=pending.base_version,
                applied=ack.applied,
                duplicate=ack.duplicate,
                version=ack.version,
                reason=ack.reason,
            )

    def _gradient(self, model: SACModel, version: int, stop: threading.Event) -> GradientPush | None:
        self.batches.version = version
        with self.heartbeat.phase("sample"):  # with prefetch: only the wait for the next batch
            batch = self.batches.next(stop)
        if batch is None:
            return None
        with self.heartbeat.phase("gradients"):
            result = compute_gradients(model, batch, self.hp, out=self.buffers.next())
        return GradientPush(
            learner_id=self.learner_id,
            base_version=version,
            grads=result.grads,
            norm_stats=result.norm_stats,
            batch_size=self.config.learner.batch_size,
            metrics=result.metrics,
            wire_dtype=self.config.learner.gradient_wire_dtype,
        )


def _fresh_weights(weights, current: WeightsSnapshot, need: int, heartbeat: Heartbeat):
    """The newest snapshot if it is at least version `need`, else wait up to 1 s for one (None)."""
    latest = weights.latest() or current
    if latest.version >= need:
        return latest
    with heartbeat.phase("wait_weights"):
        return weights.wait_newer_than(need - 1, timeout=1.0)


def _wait(poll, stop: threading.Event, heartbeat: Heartbeat):
    while not stop.is_set():
        value = poll()
        if value is not None:
            return value
        heartbeat.beat()
    return None
