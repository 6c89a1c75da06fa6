"""A chaos soak: a local fleet under a fault every few seconds, audited from both ends.

    config = soak_config(preset_config("FetchPush-v4"), seed=0, max_wall_sec=1800)
    result = run_soak(config, every_sec=60, seed=0)     # blocks until the target or the cap
    result.faults, result.batches.lost, result.gradients.applied_twice, result.summary

The fleet is `fleetrl train`'s (fleet/launch/local_fleet.py) with a Redis replica per primary, acks that
wait for a replica, ack ledgers on samplers and learners, and a restart budget that a long
soak cannot spend; fleet/chaos/faults.py injects the faults, fleet/chaos/audit.py counts. With
`hosts="netns"` the samplers run on a host of their own (a network namespace joined by a veth
pair: fleet/chaos/soak_hosts.py), and the network faults join the menu (fleet/chaos/network.py). The samplers'
batches are looked up in Redis once the workers have stopped (their ledgers complete) and
before Redis stops; the learners' gradients against the aggregator's final checkpoint.
benchmarks/chaos_soak.py is the command line.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from fleet.chaos.audit import (
    BatchAudit,
    GradientAudit,
    acked_env_steps_between,
    aggregator_lives,
    audit_batches,
    audit_gradients,
    read_acks,
    restart_times,
    rollback_bound,
)
from fleet.chaos.faults import NOT_AVAILABLE, Fault, Injector
from fleet.chaos.netns import NetnsError, SamplerHost, shaping_unavailable, unavailable
from fleet.chaos.network import LinkFaults, NetFaultRanges
from fleet.chaos.soak_hosts import TwoHostFleet
from fleet.launch.local_cluster import LocalRedisCluster
from fleet.launch.local_fleet import LocalFleet, Summary
from fleet.launch.watchdog import Watchdog
from foundation.checkpoint import load_checkpoint
from foundation.config import RunConfig, with_overrides

HOSTS = ("local", "netns")  # run_soak's `hosts`
# What a soak changes in the run's config, and why.
SOAK_OVERRIDES = [
    "buffer.replicas_to_ack=1",  # an ack waits for a replica: a primary's SIGKILL may lose no acked batch
    "watchdog.max_restarts=100000",  # a role faulted every few minutes must never spend its budget
]


def soak_config(config: RunConfig, overrides: list[str] | None = None) -> RunConfig:
    """`config` with SOAK_OVERRIDES, then `overrides` (which win)."""
    return with_overrides(config, [*SOAK_OVERRIDES, *(overrides or [])])


@dataclass
class SoakResult:
    summary: Summary
    faults: list[dict]
    batches: BatchAudit | None  # None: Redis could not be read (see batch_audit_error)
    gradients: GradientAudit | None
    skipped_faults: list[str] = field(default_factory=list)  # their target was down at their time
    evicted_windows: int = 0  # > 0: the buffer dropped windows, and `lost` may count evicted batches
    aggregator_restarts: int = 0
    aggregator_fresh_starts: int = 0  # restarts that found no checkpoint to resume from
    rollback_bound: int = 0  # the most acked gradients the restarts may roll back (audit.rollback_bound)
    errors: list[str] = field(default_factory=list)
    not_available: dict[str, str] = field(default_factory=dict)  # faults left off the menu, and why

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["summary"] = dataclasses.asdict(self.summary)
        return out


class _Soak:
    """The fleet's observer: the injector, plus the batch audit while Redis still runs."""

    def __init__(self, injector: Injector, config: RunConfig) -> None:
        self.injector, self.config = injector, config
        self.batches: BatchAudit | None = None
        self.evicted = 0
        self.errors: list[str] = []

    def tick(self, dog: Watchdog, cluster: LocalRedisCluster) -> str | None:
        return self.injector.tick(dog, cluster)

    def stopping(self, dog: Watchdog, cluster: LocalRedisCluster) -> None:
        self.injector.stopping(dog, cluster)

    def workers_stopped(self, dog: Watchdog, cluster: LocalRedisCluster) -> None:
        from buffer.storage import TemporalStorage
        from sampler.pusher import row_fingerprint
        from sim.registry import get_task

        acks = read_acks(f"{self.config.run_dir}/acks", "sampler-")  # complete: the samplers stopped
        try:
            client = cluster.client()
            try:
                schema = get_task(self.config.sim.task).schema()
                storage = TemporalStorage(client, self.config.run_id, schema, self.config.buffer)
                self.evicted = storage.snapshot().oldest_window
                stored = Counter(row_fingerprint(row) for row in storage.committed_rows())
            finally:
                client.close()
        except Exception as err:  # the audit is the soak's output: say why it is missing, keep the run's
            self.errors.append(f"batch audit: Redis not read: {err!r}")
            return
        self.batches = audit_batches(acks, stored)


def run_soak(
    config: RunConfig,
    every_sec: float,
    seed: int,
    *,
    stop_sec: float = 5.0,
    first_sec: float | None = None,
    plan: list[Fault] | None = None,
    hosts: str = "local",
    net_ranges: NetFaultRanges = NetFaultRanges(),
) -> SoakResult:
    """Run the fleet of `config` (soak_config) with a Redis replica per primary and a fault every
    `every_sec` (`every_sec` 0: none, the baseline arm) until its target or cap; `plan`: these
    faults in order instead of random ones (tests). `hosts`: "local" (every role on loopback) or
    "netns" (the samplers on a host of their own, the network faults on the menu; NetnsError
    where no namespace can be made here)."""
    if hosts not in HOSTS:
        raise ValueError(f"hosts ({hosts!r}) must be one of {HOSTS}")
    started = time.monotonic()
    every = every_sec or float("inf")
    first_sec = first_sec if every_sec else float("inf")  # the baseline arm: no fault, ever

    def observer(links: LinkFaults | None) -> _Soak:
        injector = Injector(config.run_dir, every, seed, stop_sec=stop_sec, first_sec=first_sec, plan=plan,
                            started_at=started, links=links, net_ranges=net_ranges)  # fmt: skip
        return _Soak(injector, config)

    summary, soak, not_available = _run_fleet(config, hosts, started, observer)
    injector = soak.injector
    run_dir = summary.run_dir
    restarts = restart_times(f"{run_dir}/events.jsonl", "aggregator")
    lives = aggregator_lives(_read(f"{run_dir}/logs/aggregator.log"))
    _cost_of_faults(injector.records, lives, run_dir)
    errors = [*soak.errors, *injector.errors]
    gradients = _gradient_audit(run_dir, lives, restarts, errors)
    return SoakResult(
        summary=summary,
        faults=[r.as_dict() for r in injector.records],
        batches=soak.batches,
        gradients=gradients,
        skipped_faults=injector.skipped,
        evicted_windows=soak.evicted,
        aggregator_restarts=len(restarts),
        aggregator_fresh_starts=max(0, len(restarts) - len(lives)),
        rollback_bound=rollback_bound(len(restarts), config.aggregator.checkpoint_every_versions),
        errors=errors,
        not_available=not_available,
    )


def _gradient_audit(run_dir: str, lives: list, restarts: list, errors: list[str]):
    """The learners' acked gradients against the aggregator's lives and final version (None, with
    the reason added to `errors`, where the run left no final checkpoint)."""
    try:
        final_version = int(load_checkpoint(f"{run_dir}/checkpoints")["version"])
        return audit_gradients(read_acks(f"{run_dir}/acks", "learner-"), lives, final_version, restarts)
    except (OSError, ValueError, KeyError) as err:
        errors.append(f"gradient audit: no final checkpoint: {err!r}")
        return None


def _cost_of_faults(records: list, lives: list, run_dir: str) -> None:
    """Each record's cost in its detail: an aggregator kill's rolled-back versions, and what got
    through while a network fault lasted (from the samplers' ack ledgers)."""
    kills = [r for r in records if r.fault == "SIGKILL aggregator"]
    if len(kills) == len(lives):  # each kill resumed once (a stop past the heartbeat timeout would add one)
        for record, life in zip(kills, lives, strict=True):
            # The cost of the kill: the versions made since the checkpoint it resumed from (the
            # version at the fault is the aggregator's heartbeat's, up to a second old).
            record.detail["resumed_from"], record.detail["resumed_at"] = life.restored, life.resumed
            record.detail["versions_rolled_back"] = max(0, int(record.version_at_fault or 0) - life.restored)
    sampler_acks = read_acks(f"{run_dir}/acks", "sampler-")
    for record in records:
        if "undone_time" in record.detail:  # a network fault: what got through while it lasted
            window = (record.detail["at_time"], record.detail["undone_time"])
            record.detail["acked_env_steps_during"] = acked_env_steps_between(sampler_acks, *window)


class _Ran(NamedTuple):
    summary: Summary
    soak: _Soak
    not_available: dict[str, str]  # faults left off the menu, and why


def _run_fleet(config: RunConfig, hosts: str, started: float, observer: Callable[[LinkFaults | None], _Soak]) -> _Ran:
    """The soak's fleet until its stop rule: on loopback, or with the samplers on a sampler host
    whose link the observer may cut (the host is removed whole when the fleet has stopped)."""
    if hosts == "local":
        soak = observer(None)
        return _Ran(LocalFleet(config, started_at=started, redis_replicas=1).run(soak), soak, dict(NOT_AVAILABLE))
    reason = unavailable()
    if reason is not None:
        raise NetnsError(f"--hosts netns: {reason}")
    with SamplerHost.create(f"{os.getpid() % 4096:03x}") as net:
        links = LinkFaults(net, shaping_unavailable())
        soak = observer(links)
        summary = TwoHostFleet(config, net, started_at=started, redis_replicas=1).run(soak)
    return _Ran(summary, soak, dict(links.unavailable))


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
