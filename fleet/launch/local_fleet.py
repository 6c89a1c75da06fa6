"""The one wiring point: builds the local fleet from a RunConfig and connects every role.

    fleet = LocalFleet(config, started_at=time.monotonic())
    summary = fleet.run()           # blocks: progress display, stop rule, clean shutdown

Topology (one comment per edge):
    launcher -> LocalRedisCluster       starts >= 3 primaries on loopback, forms the cluster (buffer.durable:
                                        in <run_dir>/redis, and a resumed run's from there)
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

import contextlib
import dataclasses
import logging
import os
import pathlib
import secrets
import threading
import time
from collections.abc import Callable
from contextlib import closing

from aggregator.client import AggregatorClient
from buffer.ingest_client import IngestClient
from fleet.launch.kept import abandon_earlier_writes
from fleet.launch.local_cluster import LocalRedisCluster, free_port_pair
from fleet.launch.observer import FleetObserver, Unobserved
from fleet.launch.spec import FleetHost
from fleet.launch.spec_model import FleetSpec, HostSpec, Workers
from fleet.launch.spec_plan import stale_gradient_warning
from fleet.launch.watchdog import RoleSpec, Watchdog
from fleet.report.lives import RunHistory
from fleet.report.progress import Progress, Snapshot
from fleet.report.provenance import write_code_json
from fleet.report.summary import INTERRUPTED, Ending, Summary, final_score, stop_reason, write_summary
from foundation.config import RunConfig
from foundation.cpu import CpuMeter
from foundation.process import free_port, stop_event
from foundation.transport import Security, serving

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


def learner_cpus(allowed: set[int] | frozenset[int], learners: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """learner.own_cpu: (the learners' CPUs, everyone else's) out of this process's `allowed`
    CPUs, the learners taking the highest; ((), ()) where fewer CPUs than learners + 1 are
    allowed (nothing is pinned then). The learner is a single hot thread that every other role
    otherwise preempts now and then (on 2 cores, the aggregator, evaluator and sampler)."""
    ordered = sorted(allowed)
    if len(ordered) <= learners:
        return (), ()
    return tuple(ordered[-learners:]), tuple(ordered[:-learners])


@contextlib.contextmanager
def confined_to(cpus: tuple[int, ...]):
    """This process (and what it starts meanwhile) on `cpus`; the old affinity restored after.
    () changes nothing."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


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
        self.history: RunHistory | None = None  # the run's lives, once run() starts
        self.cpu = CpuMeter()
        self._cpu_sampled = -CPU_SAMPLE_SEC
        # A local run needs no set-up: without a token or Redis password given, one is made.
        self.security = local_security(config)
        # learner.own_cpu: (the learners' CPUs, the rest's); ((), ()) when off or too few CPUs
        self.cpus = (
            learner_cpus(os.sched_getaffinity(0), config.learner.num_learners) if config.learner.own_cpu else ((), ())
        )

    def notes(self) -> list[str]:
        """What the run says before it starts: where learner.own_cpu put the roles, and a warning
        when the learners and aggregator.grads_per_step would make most gradients stale (as
        `fleet check` warns of a spec)."""
        lines = []
        stale = stale_gradient_warning(self.config)
        if stale:
            lines.append(f"warning: {stale}")
        if self.cpus[0]:
            lines.append(
                f"learner.own_cpu: learners on CPU {list(self.cpus[0])}, every other role on {list(self.cpus[1])}"
            )
        return lines

    def make_cluster(self) -> LocalRedisCluster:
        """The run's local Redis Cluster on ports chosen now (the roles' spec names them before
        it starts); its nodes require the run's ACL user and password. With buffer.durable the
        nodes keep their data in <run_dir>/redis, and a resumed run's nodes start from it."""
        ports = [free_port_pair() for _ in range(self.num_redis_primaries * (1 + self.redis_replicas))]
        durable = self.config.buffer.durable
        return LocalRedisCluster(
            self.num_redis_primaries,
            auth=self.security,
            ports=ports,
            replicas=self.redis_replicas,
            appendonly=durable,
            data_dir=self.run_dir / "redis" if durable else None,
            startup_timeout_sec=READY_TIMEOUT_SEC,  # a large buffer's append-only files take a while to load
        )

    def spec(self, cluster: LocalRedisCluster) -> FleetSpec:
        """This run as a fleet of one host on loopback: what `fleetrl fleet up` would start."""
        c = self.config
        workers = {"sampler": c.sampler.num_samplers, "learner": c.learner.num_learners, "evaluator": 1}
        pinned = {"learner": self.cpus[0]}  # learner.own_cpu; () when off
        host = HostSpec(
            "local",
            "127.0.0.1",
            redis=tuple(cluster.ports or ()),
            services={"aggregator": free_port(), "buffer": free_port()},
            workers={role: Workers(count, pinned.get(role, ())) for role, count in workers.items()},
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
        write_code_json(self.run_dir)  # the code as it is now, before any role starts

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
        roles = self.roles(spec, max_restarts)
        kinds = {"aggregator", "sampler", *(["evaluator"] if evaluator else [])}
        for role in roles:  # everything that needs no Redis first
            if role.name.split("-")[0] in kinds:
                dog.start(role)
        cluster.start()
        if self.history is not None and self.history.life and self.history.buffer_kept:
            self._abandon_earlier_writes(cluster)
        cluster.supervise(dog, self.config.watchdog)  # a node that dies or hangs is restarted and rejoins
        for role in roles:
            if role.name == "buffer" or (learners and role.name.startswith("learner-")):
                dog.start(role)
        buffer, aggregator = spec.service("buffer"), spec.service("aggregator")
        self._wait_ready(dog, "aggregator", aggregator)
        self._wait_ready(dog, "buffer", buffer)
        return buffer, aggregator

    def _abandon_earlier_writes(self, cluster: LocalRedisCluster) -> None:
        """A resumed run's kept buffer, before its ingest service starts (fleet/launch/kept.py)."""
        abandon_earlier_writes(cluster.addresses, self.security, self.config)

    def roles(self, spec: FleetSpec, max_restarts: int | None) -> list[RoleSpec]:
        """Every role process of the run: here, those of the spec's one host (the chaos soak's
        fleet puts the samplers on a host of their own: fleet/chaos/soak_hosts.py)."""
        host = FleetHost(spec, "local", self.config, self._stop, host_dir=self.run_dir, security=self.security,
                         max_restarts=max_restarts)  # fmt: skip
        return host.roles(str(self.run_dir / "config.json"))

    @staticmethod
    def stop_roles(dog: Watchdog) -> None:
        dog.stop_in_order()

    def run(self, observer: FleetObserver | None = None) -> Summary:
        # Ctrl-C (SIGINT to the whole foreground group) or SIGTERM: roles stop themselves, the
        # launcher stops watching, shuts down in order and still writes the summary.
        self._stop = stop_event()
        self.prepare()
        cluster = self.make_cluster()
        self.history = RunHistory.begin(self.run_dir, buffer_kept=cluster.kept_nodes())
        progress = Progress(self.config, self.run_dir, self.started_at, self.history.life)
        for line in self.notes():
            progress.note(line)
        if self.history.life:
            progress.note(f"resuming: life {self.history.life} of this run, {self._resumed_text()}")
        try:
            events = self.run_dir / "events.jsonl"  # every restart: what, when, why
            # every role (and Redis) started or restarted meanwhile inherits the rest's CPUs;
            # learners pin themselves to theirs (taskset in their argv, fleet/launch/spec.py)
            with (
                confined_to(self.cpus[1]),
                closing(cluster),
                Watchdog(self.run_dir / "logs", events_path=events) as dog,  # roles stop first
            ):
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
            final = None if self._stop.is_set() else final_score(self.config, self.run_dir, progress)
        finally:
            progress.close()
        life_sec = time.monotonic() - self.started_at
        cpu = self.cpu.report(life_sec, len(os.sched_getaffinity(0)))  # this life's processes
        ending = Ending(reason, self._wall_sec(), restarts, cpu, final)
        return write_summary(self.config, self.run_dir, progress, ending, history=self.history)

    def _wall_sec(self) -> float:
        """The run's wall-clock seconds: this life's since the command started, and the earlier
        lives' (fleet/report/lives.py); budgets (max_wall_sec) and the summary count them all."""
        earlier = self.history.carried.wall_sec if self.history is not None else 0.0
        return earlier + time.monotonic() - self.started_at

    def _resumed_text(self) -> str:
        assert self.history is not None
        carried = self.history.carried
        kept = self.history.buffer_kept
        buffer = "the buffer as it was" if kept else f"an empty buffer (+{carried.env_steps} env steps before)"
        return f"{carried.wall_sec:.0f} s of wall-clock before this start, {buffer}"

    def _snapshot(self, ingest: IngestClient, agg: AggregatorClient, dog: Watchdog) -> Snapshot | None:
        """One poll of both services, counting the whole run (the earlier lives' wall-clock, and
        their env steps where this life's buffer started empty)."""
        snap = Snapshot.take(ingest, agg, self._wall_sec(), dog.restarts, _roles(dog))
        if snap is None or self.history is None:
            return snap
        return self.history.carried.onto(snap)

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
            snap = self._snapshot(ingest, agg, dog)
        if snap is not None:
            progress.update(snap)

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
                snap = self._snapshot(ingest, agg, dog)
                if snap is not None:
                    progress.update(snap)
                reason = stop_reason(c, progress, snap, self._wall_sec())
                if reason is not None:
                    return reason
                self._stop.wait(0.25)
        return INTERRUPTED


def _roles(dog: Watchdog) -> tuple[int, int]:
    """(running now, started): the progress line's roles."""
    return dog.running(), len(dog.roles)
