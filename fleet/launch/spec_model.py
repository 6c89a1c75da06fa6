"""A fleet spec as data: its hosts, what each runs, and what the fleet as a whole derives from them.

    spec = load_spec("fleet.yaml")          # fleet/launch/spec.py: schema and cross-host checks first
    spec.service("buffer")                   # "10.0.0.7:50051"
    spec.config()                            # the run's RunConfig, worker counts from every host

The checks (spec_checks.py), the wind-down (winddown.py) and the renderers (slurm.py, k8s.py) read
this module's classes; spec.py builds them from YAML and runs a host.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from foundation.config import ConfigError, RunConfig, with_overrides

SERVICES = ("buffer", "aggregator")
WORKERS = ("sampler", "learner", "evaluator")


@dataclass(frozen=True)
class Workers:
    count: int
    cpus: tuple[int, ...] = ()  # the workers run on these CPUs (taskset); () = any


@dataclass(frozen=True)
class HostSpec:
    name: str
    address: str
    redis: tuple[int, ...] = ()
    services: dict[str, int] = field(default_factory=dict)  # role -> port
    workers: dict[str, Workers] = field(default_factory=dict)
    redis_dir: str = ""  # where this host's Redis nodes keep their data; "": <run_dir>/redis/<name>


@dataclass(frozen=True)
class SlurmSettings:
    """How `fleetrl fleet slurm` asks Slurm to treat the job at its end (docs/fleet-spec.md, "Preemption")."""

    warning_sec: int = 120  # Slurm sends the batch shell SIGUSR1 this long before the end; 0: no warning
    requeue: bool = True  # after the warning the job goes back in the queue and resumes the run


@dataclass(frozen=True)
class VolumeSettings:
    """The persistent volumes `fleetrl fleet render` claims (docs/fleet-spec.md, "Kubernetes")."""

    storage_class: str = ""  # "": the cluster's default StorageClass
    run_volume_size: str = "10Gi"  # the aggregator's run directory: checkpoints, evals.jsonl, tb/
    redis_volume_size: str = "2Gi"  # each Redis node's append-only file and nodes.conf


@dataclass(frozen=True)
class FleetSpec:
    run_id: str
    run_dir: str
    overrides: tuple[str, ...]
    hosts: tuple[HostSpec, ...]
    redis_replicas: int = 0  # replicas per Redis primary; the primaries are the first nodes in spec order
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    kubernetes: VolumeSettings = field(default_factory=VolumeSettings)

    def host(self, name: str) -> HostSpec:
        for h in self.hosts:
            if h.name == name:
                return h
        raise ConfigError(f"--host {name!r} is not in the spec; hosts: {[h.name for h in self.hosts]}")

    def redis_dir(self, host: HostSpec) -> str:
        """Where `host`'s Redis nodes keep their data (with buffer.durable): its `redis_dir`, or
        <run_dir>/redis/<host>. A restarted or requeued host starts its nodes from there."""
        return host.redis_dir or f"{self.run_dir}/redis/{host.name}"

    def service(self, role: str) -> str:
        owner = next(h for h in self.hosts if role in h.services)
        return f"{owner.address}:{owner.services[role]}"

    @property
    def redis_nodes(self) -> list[tuple[str, int]]:
        """Every Redis node (address, port) in spec order: the primaries first, then the replicas."""
        return [(h.address, port) for h in self.hosts for port in h.redis]

    @property
    def redis(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.redis_nodes)

    def count(self, role: str) -> int:
        return sum(h.workers[role].count for h in self.hosts if role in h.workers)

    def first_id(self, host: HostSpec, role: str) -> int:
        """Worker ids run over the hosts in spec order, so every id is unique in the fleet."""
        before = self.hosts[: self.hosts.index(host)]
        return sum(h.workers[role].count for h in before if role in h.workers)

    def config(self, base: RunConfig | None = None) -> RunConfig:
        """The run's config: `base` (default: built-in plus the spec's `config`), the run id,
        the fleet's worker counts, and with Redis replicas an ack once a replica holds a batch
        (unless the spec's config sets buffer.replicas_to_ack)."""
        derived = [f"sampler.num_samplers={self.count('sampler')}", f"learner.num_learners={self.count('learner')}"]
        if self.redis_replicas and not any(o.startswith("buffer.replicas_to_ack=") for o in self.overrides):
            derived.append("buffer.replicas_to_ack=1")
        if base is None:
            base = with_overrides(RunConfig(), list(self.overrides))
        config = with_overrides(base, [f"run_id={json.dumps(self.run_id)}", *derived]).validate()
        agg = config.aggregator
        if agg.grads_per_step > config.learner.num_learners and agg.step_deadline_ms == 0:
            raise ConfigError(
                f"aggregator.grads_per_step ({agg.grads_per_step}) must be <= the spec's learners "
                f"({config.learner.num_learners}) when aggregator.step_deadline_ms is 0: no step would ever close",
                field="aggregator.grads_per_step",
            )
        return config


def host_spec(name: str, body: dict[str, Any]) -> HostSpec:
    """A host from its (schema-checked) mapping: `buffer: 50051` or `{port: 50051}` is a port,
    `learner: 1` or `{count: 1, cpus: [..]}` a count of processes."""
    services = {}
    for role in SERVICES:
        if role in body:
            value = body[role]
            services[role] = value["port"] if isinstance(value, dict) else value
    workers = {}
    for role in WORKERS:
        if role in body:
            value = body[role]
            value = {"count": value} if isinstance(value, int) else value
            workers[role] = Workers(value["count"], tuple(value.get("cpus") or ()))
    redis = tuple(body.get("redis") or ())
    return HostSpec(name, str(body["address"]), redis, services, workers, str(body.get("redis_dir", "")))
