"""The one wiring point: builds the local fleet from a RunConfig and connects every role.

    fleet = LocalFleet(config, started_at=time.monotonic())
    summary = fleet.run()           # blocks: progress display, stop rule, clean shutdown

Topology (one comment per edge):
    launcher -> LocalRedisCluster       starts >= 3 primaries on loopback, forms the cluster
    buffer   -> Redis Cluster           ingest writes time windows (hash-tagged keys)
    sampler  -> buffer (gRPC Push)      transition batches, retried until acked
    sampler  -> aggregator (Watch)      actor weights, conflated to one per weights_interval_sec
    learner  -> Redis Cluster           reads windows directly (no gRPC hop on the hot path)
    learner  -> aggregator (Push/Watch) gradients in, full weights out
    evaluator-> aggregator (Watch/Report) scores versions, reports success
    evaluator-> buffer (Stats)          env steps at the time a version is scored
    launcher -> aggregator, buffer (Stats) progress display and the stop rule
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import secrets
import threading
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from aggregator.client import AggregatorClient
from buffer.client import IngestClient
from fleet.local_cluster import LocalRedisCluster, free_port_pair
from fleet.observer import FleetObserver, Unobserved
from fleet.progress import Progress, Snapshot
from fleet.spec import FleetHost, FleetSpec, HostSpec, Workers
from fleet.watchdog import Watchdog
from foundation.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from foundation.config import RunConfig
from foundation.cpu import CpuMeter
from foundation.policy import ModelSpec
from foundation.process import free_port, stop_event
from foundation.routing_stats import expert_routing
from foundation.transport import Security, serving

if TYPE_CHECKING:
    from sampler.evaluator import EvalResult

log = logging.getLogger("fleetrl.launch")
READY_TIMEOUT_SEC = 120.0
CPU_SAMPLE_SEC = 2.0


def local_security(config: RunConfig) -> Security:
    """The configured secrets, with a fresh token and Redis password for whatever is not set."""
    given = Security.from_config(config.security)
    if not config.security.enabled:
        return given
    return dataclasses.replace(
        given,
        token=given.token or secrets.token_urlsafe(32),
        redis_user=config.security.redis_user,
        redis_password=given.redis_password or secrets.token_urlsafe(32),
    )


@dataclass
class Summary:
    run_dir: str
    task: str
    reached_target: bool
    target_success: float
    stop_reason: str
    wall_sec: float
    wall_sec_to_target: float | None = None
    env_steps_to_target: int | None = None
    version_to_target: int | None = None
    final_version: int = 0
    final_env_steps: int = 0
    transitions_stored: int = 0
    best_success: float = 0.0
    final_success: float | None = None  # the last checkpoint over eval.final_episodes (a run short of its target)
    final_success_episodes: int = 0
    final_success_version: int | None = None
    train_success: float | None = None  # last 100 training episodes at the end
    updates_per_sec: float = 0.0  # final_version / wall_sec
    restarts: int = 0
    started_unix: float = 0.0  # epoch seconds at the command's start (report plots count from here)
    cpu: dict = field(default_factory=dict)  # foundation.cpu.CpuMeter.report(): per role and group
    fleet_overhead_share: float | None = None  # aggregator+buffer+evaluator+redis+launcher CPU / machine
    counters: dict = field(default_factory=dict)  # each role's last heartbeat counters (heartbeats/*.json)
    checkpoints: list[str] = field(default_factory=list)
    mode: str = "async"  # or "sync": fleetrl train --mode sync (fleet/sync.py)
    expert_load: dict = field(default_factory=dict)  # a MoE run: routers' newest metrics (expert_load.json)
    # A task-routed MoE run: per network, layer and task the experts chosen, overlaps, load
    # (foundation/routing_stats.py), read from the newest checkpoint.
    expert_routing: dict = field(default_factory=dict)
    tasks: list[str] = field(default_factory=list)  # a multi-task run's tasks (success figures are their means)
    # A multi-task run, per task: best (curve or complete full score), last (newest curve) and
    # final (the final score) success.
    task_success: dict = field(default_factory=dict)
    task_env_steps: dict = field(default_factory=dict)  # a multi-task run: env steps acked per task


class LocalFleet:
    def __init__(
        self, config: RunConfig, started_at: float, num_redis_primaries: int = 3, redis_replicas: int = 0
    ) -> None:
        """`redis_replicas`: replicas per Redis primary (one takes over when its primary dies; set
        buffer.replicas_to_ack=1 too, so that an ack waits for a replica)."""
        self.config = config.validate()
        self.started_at = started_at
        self.run_dir = pathlib.Path(config.run_dir)
        self.num_redis_primaries = num_redis_primaries
        self.redis_replicas = redis_replicas
        self._stop = threading.Event()
        self.cpu = CpuMeter()
        self._cpu_sampled = -CPU_SAMPLE_SEC
        # A local run needs no set-up: without a token or Redis password given, one is made.
        self.security = local_security(config)

    def make_cluster(self) -> LocalRedisCluster:
        """The run's local Redis Cluster on ports chosen now (the roles' spec names them before
        it starts); its nodes require the run's ACL user and password."""
        ports = [free_port_pair() for _ in range(self.num_redis_primaries * (1 + self.redis_replicas))]
        return LocalRedisCluster(
            self.num_redis_primaries, auth=self.security, ports=ports, replicas=self.redis_replicas
        )

    def spec(self, cluster: LocalRedisCluster) -> FleetSpec:
        """This run as a fleet of one host on loopback: what `fleetrl fleet up` would start."""
        c = self.config
        workers = {"sampler": c.sampler.num_samplers, "learner": c.learner.num_learners, "evaluator": 1}
        host = HostSpec(
            "local",
            "127.0.0.1",
            redis=tuple(cluster.ports or ()),
            services={"aggregator": free_port(), "buffer": free_port()},
            workers={role: Workers(count) for role, count in workers.items()},
        )
        return FleetSpec(c.run_id, str(self.run_dir), (), (host,), self.redis_replicas)

    def _wait_ready(self, dog: Watchdog, role: str, address: str) -> None:
        """Until the service answers the standard health check with SERVING (the buffer: once
        its Redis answers too), as an orchestrator's readiness probe would."""
        deadline = time.monotonic() + READY_TIMEOUT_SEC
        with self.security.channel(address) as channel:  # TLS when configured
            while not serving(channel, timeout_sec=0.5) and not self._stop.is_set():
                dog.poll()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{role} not ready after {READY_TIMEOUT_SEC}s; see {dog.log_dir / role}.log")
                time.sleep(0.05)

    def prepare(self) -> None:
        """Create the run directory and write the resolved config every role process reads."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(self.config.to_json())

    def start_roles(
        self,
        dog: Watchdog,
        cluster: LocalRedisCluster,
        *,
        learners: bool = True,
        evaluator: bool = True,
        max_restarts: int | None = None,
    ) -> tuple[str, str]:
        """Start the fleet's roles; returns (buffer, aggregator) addresses once both serve.

        Every role starts as early as its addresses allow: the 2 s Redis Cluster formation and
        each process's imports then overlap instead of adding up. `cluster` is started here.
        Benchmarks leave out learners or the evaluator, and use max_restarts=0.
        """
        spec = self.spec(cluster)
        host = FleetHost(spec, "local", self.config, self._stop, host_dir=self.run_dir, security=self.security,
                         max_restarts=max_restarts)  # fmt: skip
        roles = host.roles(str(self.run_dir / "config.json"))
        kinds = {"aggregator", "sampler", *(["evaluator"] if evaluator else [])}
        for role in roles:  # everything that needs no Redis first
            if role.name.split("-")[0] in kinds:
                dog.start(role)
        cluster.start()
        cluster.supervise(dog, self.config.watchdog)  # a node that dies or hangs is restarted and rejoins
        for role in roles:
            if role.name == "buffer" or (learners and role.name.startswith("learner-")):
                dog.start(role)
        buffer, aggregator = spec.service("buffer"), spec.service("aggregator")
        self._wait_ready(dog, "aggregator", aggregator)
        self._wait_ready(dog, "buffer", buffer)
        return buffer, aggregator

    @staticmethod
    def stop_roles(dog: Watchdog) -> None:
        dog.stop_in_order()

    def run(self, observer: FleetObserver | None = None) -> Summary:
        # Ctrl-C (SIGINT to the whole foreground group) or SIGTERM: roles stop themselves, the
        # launcher stops watching, shuts down in order and still writes the summary.
        self._stop = stop_event()
        self.prepare()
        progress = Progress(self.config, self.run_dir, self.started_at)
        try:
            cluster = self.make_cluster()
            events = self.run_dir / "events.jsonl"  # every restart: what, when, why
            with closing(cluster), Watchdog(self.run_dir / "logs", events_path=events) as dog:  # roles stop first
                buffer, aggregator = self.start_roles(dog, cluster)
                progress.note(
                    f"fleet up: {len(dog.roles)} roles started (redis {cluster.addresses}, buffer {buffer}, "
                    f"aggregator {aggregator}); {progress.goal()}"
                )
                watch = observer or Unobserved()
                reason = self._monitor(dog, progress, buffer, aggregator, lambda: watch.tick(dog, cluster))
                watch.stopping(dog, cluster)
                self._sample_cpu(dog, force=True)  # the roles' last readings before they stop
                self._stop_workers(dog, progress, buffer, aggregator)
                watch.workers_stopped(dog, cluster)
                self.stop_roles(dog)
                restarts = dog.restarts
            final = self._final_score(progress)
        finally:
            progress.close()
        return self._summarize(progress, reason, restarts, final)

    def _stop_workers(self, dog: Watchdog, progress: Progress, buffer: str, aggregator: str) -> None:
        """Stop the samplers, learners and evaluator, then read the services once more: the
        summary's env steps and version then hold every push acked until the end, not only
        those acked before the last poll. A service that does not answer leaves the last poll."""
        dog.stop([name for name, running in dog.roles.items() if running.spec.stage == 0])
        c = self.config
        with (
            IngestClient(buffer, sampler_id=0, run_id=c.run_id, security=self.security) as ingest,
            AggregatorClient(aggregator, security=self.security) as agg,
        ):
            snap = Snapshot.take(ingest, agg, time.monotonic() - self.started_at, dog.restarts, _roles(dog))
        if snap is not None:
            progress.update(snap)

    def _final_score(self, progress: Progress) -> tuple[int, EvalResult] | None:
        """(version, result) of the last checkpoint over eval.final_episodes, after the fleet
        stopped (outside the run's wall-clock): what the run reached when the target was not."""
        from sampler.evaluator import score_checkpoint  # the simulator loads only for this

        episodes = self.config.eval.final_episodes
        if progress.reached_target or episodes == 0 or self._stop.is_set():
            return None
        progress.note(f"final score: the last checkpoint over {episodes} episodes")
        try:
            final = score_checkpoint(self.run_dir / "checkpoints", self.config, episodes)
        except (CheckpointError, OSError) as err:  # no checkpoint yet (a very short run)
            progress.note(f"no final score: {err}")
            return None
        except Exception:  # the score is extra: whatever fails, the run's summary is still written
            log.exception("final score failed; summary.json is written without it")
            progress.note("no final score: it failed (see the traceback above)")
            return None
        progress.note(f"final score: version {final[0]}, success {final[1].success_rate:.2f} over {episodes} episodes")
        return final

    def _sample_cpu(self, dog: Watchdog, force: bool = False) -> None:
        """Every role's CPU time, the Redis nodes (roles `redis-<port>`) and the launcher included
        (its own CPU: its children are the roles, counted as themselves)."""
        if not force and time.monotonic() - self._cpu_sampled < CPU_SAMPLE_SEC:
            return
        self._cpu_sampled = time.monotonic()
        self.cpu.sample({**dog.pids(), "launcher": os.getpid()})

    def _monitor(
        self, dog: Watchdog, progress: Progress, buffer: str, aggregator: str, tick: Callable[[], str | None]
    ) -> str:
        c = self.config
        with (
            IngestClient(buffer, sampler_id=0, run_id=c.run_id, security=self.security) as ingest,
            AggregatorClient(aggregator, security=self.security) as agg,
        ):
            while not self._stop.is_set():
                for event in dog.poll():
                    progress.note(event)
                ended = tick()
                if ended:
                    return ended
                self._sample_cpu(dog)
                snap = Snapshot.take(ingest, agg, time.monotonic() - self.started_at, dog.restarts, _roles(dog))
                if snap is not None:
                    progress.update(snap)
                    if progress.target is not None and progress.target.full is not None:
                        full = progress.target.full
                        return (
                            f"evaluation success {full.success:.2f} over {full.episodes} episodes "
                            f">= target {c.target_success}"
                        )
                    if c.max_env_steps and snap.env_steps >= c.max_env_steps:
                        return f"max_env_steps {c.max_env_steps} reached"
                if time.monotonic() - self.started_at >= c.max_wall_sec:
                    return f"max_wall_sec {c.max_wall_sec} reached"
                self._stop.wait(0.25)
        return "interrupted (Ctrl-C or SIGTERM)"

    def _summarize(
        self, progress: Progress, reason: str, restarts: int, final: tuple[int, EvalResult] | None = None
    ) -> Summary:
        last = progress.last
        wall_sec = time.monotonic() - self.started_at
        cores = len(os.sched_getaffinity(0))
        cpu = self.cpu.report(wall_sec, cores)
        summary = Summary(
            run_dir=str(self.run_dir),
            task=self.config.sim.task,
            reached_target=progress.reached_target,
            target_success=self.config.target_success,
            stop_reason=reason,
            wall_sec=wall_sec,
            restarts=restarts,
            started_unix=time.time() - wall_sec,
            cpu=cpu,
            fleet_overhead_share=cpu["overhead_share"],
            counters=_last_counters(self.run_dir / "heartbeats"),
            checkpoints=sorted(str(p) for p in (self.run_dir / "checkpoints").glob("ckpt_*.pt")),
        )
        load = self.run_dir / "expert_load.json"
        if load.exists():  # a MoE run: beta, balancing loss and each layer's expert shares
            summary.expert_load = json.loads(load.read_text())
        summary.expert_routing = _expert_routing(self.run_dir / "checkpoints")
        if final is not None:
            summary.final_success_version, result = final
            summary.final_success, summary.final_success_episodes = result.success_rate, result.episodes
            for task, rate in result.task_success.items():
                summary.task_success.setdefault(task, {})["final"] = rate
        if self.config.sim.tasks:
            summary.tasks = list(self.config.sim.tasks)
            for task, rate in progress.best_task_success.items():
                summary.task_success.setdefault(task, {})["best"] = rate
            for task, rate in progress.last_task_success.items():
                summary.task_success.setdefault(task, {})["last"] = rate
            if last is not None:
                from sim.registry import get_task  # a multi-task run only: the launcher needs no sim otherwise

                summary.task_env_steps = {get_task(t).name: n for t, n in last.env_steps_by_task}
        target = progress.target
        if target is not None and target.full is not None:
            summary.wall_sec_to_target = target.wall_sec
            summary.env_steps_to_target = target.full.env_steps
            summary.version_to_target = target.full.version
        if last is not None:
            summary.final_version = last.version
            summary.final_env_steps = last.env_steps
            summary.transitions_stored = last.transitions
            summary.best_success = progress.best_success
            summary.train_success = last.train_success if last.train_episodes else None
            first = progress.first.version if progress.first is not None else 0  # a resumed run starts late
            summary.updates_per_sec = round((last.version - first) / max(wall_sec, 1e-9), 2)
        (self.run_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2))
        return summary


def _roles(dog: Watchdog) -> tuple[int, int]:
    """(running now, started): the progress line's roles."""
    return dog.running(), len(dog.roles)


def _last_counters(heartbeats: pathlib.Path) -> dict:
    """{role: its last heartbeat's counters}: what each role did over the run (e.g. the
    aggregator's weights_shared against its version). A torn or missing file is left out."""
    counters = {}
    for path in sorted(heartbeats.glob("*.json")):
        try:
            counters[path.stem] = json.loads(path.read_text())["counters"]
        except (OSError, ValueError, KeyError):
            continue
    return counters


def _expert_routing(checkpoints: pathlib.Path) -> dict:
    """The newest checkpoint's task routing (routing_stats.expert_routing); {} for a dense or
    state-routed model, or no checkpoint."""
    newest = latest_checkpoint(checkpoints) if checkpoints.is_dir() else None
    if newest is None:
        return {}
    ckpt = load_checkpoint(newest)
    spec = ModelSpec.from_json(ckpt["spec"])
    if spec.kind != "moe" or spec.router != "task":
        return {}
    from sim.tasks import TaskSet  # a MoE run only: the launcher needs no sim otherwise

    names = list(TaskSet.parse(ckpt["task"]).names)
    groups = {g: np.asarray(ckpt["weights"][g], np.float32) for g in ("actor", "critic")}
    return expert_routing(spec, groups, names) | {"version": int(ckpt["version"])}
