"""The fleet spec's cross-host checks, and the ports its hosts must open to each other.

    for port in open_ports(spec):        # Port(address, port, "Redis cluster bus of 7000", ("hosts", "redis-a", ...))
        ...
    check_fleet(spec, "fleet.yaml", lines)   # ConfigError: one buffer, enough Redis nodes, no port twice
    check_cpus(spec, "fleet.yaml", lines, lambda host: 8)   # ConfigError: a `cpus` entry beyond the host's
    spec_warnings(spec, "fleet.yaml")        # what would run to no end: no evaluator

The schema (fleet/launch/spec_schema.py) checks each key alone; these checks need the whole fleet.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from fleet.launch.spec_schema import where
from foundation.config import ConfigError

if TYPE_CHECKING:
    from fleet.launch.spec_model import FleetSpec, HostSpec

REDIS_BUS_OFFSET = 10000  # Redis fixes the cluster bus port at port + 10000
MIN_PRIMARIES = 3  # Redis Cluster needs three primaries to agree on a failover


class Port:
    """A TCP port one host serves to the others: what it is, and the spec key that asks for it."""

    def __init__(self, address: str, port: int, what: str, path: tuple[Any, ...]) -> None:
        self.address, self.port, self.what, self.path = address, port, what, path

    def __repr__(self) -> str:
        return f"{self.address}:{self.port} ({self.what})"


class RedisLayout(NamedTuple):
    primaries: list[tuple[str, int]]
    replicas: list[tuple[tuple[str, int], tuple[str, int]]]  # (replica, the primary it follows)


def open_ports(spec: FleetSpec) -> list[Port]:
    """Every port the fleet's hosts serve to one another, in spec order: each Redis node's port
    and its cluster bus port (+ 10000), the buffer's and the aggregator's."""
    ports = []
    for host in spec.hosts:
        for index, port in enumerate(host.redis):
            path = ("hosts", host.name, "redis", index)
            ports.append(Port(host.address, port, "Redis node", path))
            ports.append(Port(host.address, port + REDIS_BUS_OFFSET, f"Redis cluster bus of {port}", path))
        for role, port in host.services.items():
            ports.append(Port(host.address, port, role, ("hosts", host.name, role)))
    return ports


def redis_layout(spec: FleetSpec) -> RedisLayout:
    """The first nodes in spec order are the primaries; replica i follows primary i mod primaries."""
    nodes = spec.redis_nodes
    count = len(nodes) // (1 + spec.redis_replicas)
    primaries = nodes[:count]
    replicas = [(node, primaries[i % count]) for i, node in enumerate(nodes[count:])]
    return RedisLayout(primaries, replicas)


def check_fleet(spec: FleetSpec, source: str, lines: dict[tuple[Any, ...], int] | None = None) -> None:
    """ConfigError for the first cross-host problem: a service on no host or on two, too few
    Redis nodes for the replicas asked for, a port two things use on one address, no worker."""
    for role in ("buffer", "aggregator"):
        owners = [h.name for h in spec.hosts if role in h.services]
        if len(owners) != 1:
            path = ("hosts", owners[1], role) if owners else ("hosts",)
            raise ConfigError(
                f"{where(source, path, lines)}: exactly one host must run the {role} (found {owners or 'none'})"
            )
    _check_redis(spec, source, lines)
    seen: dict[tuple[str, int], Port] = {}
    for port in open_ports(spec):
        other = seen.setdefault((port.address, port.port), port)
        if other is not port:
            raise ConfigError(
                f"{where(source, port.path, lines)}: port {port.port} on {port.address} is wanted for "
                f"{port.what} and for {other.what} ({'.'.join(map(str, other.path))})",
                field=".".join(map(str, port.path)),
            )
    for role in ("sampler", "learner"):
        if spec.count(role) < 1:
            raise ConfigError(f"{where(source, ('hosts',), lines)}: the fleet needs at least one {role}, found none")
    _check_redis_dirs(spec, source, lines)


def _check_redis(spec: FleetSpec, source: str, lines: dict[tuple[Any, ...], int] | None) -> None:
    nodes, per = len(spec.redis_nodes), 1 + spec.redis_replicas
    need = MIN_PRIMARIES * per
    if nodes < need or nodes % per:
        path = ("redis_replicas",) if spec.redis_replicas else ("hosts",)
        with_replicas = f" with redis_replicas {spec.redis_replicas}" if spec.redis_replicas else ""
        shape = f", a multiple of {per} ({MIN_PRIMARIES} primaries, each with {spec.redis_replicas} replicas)"
        raise ConfigError(
            f"{where(source, path, lines)}: a Redis Cluster{with_replicas} needs at least {need} nodes"
            f"{shape if spec.redis_replicas else f' ({MIN_PRIMARIES} primaries)'}; the hosts list {nodes}: "
            f"{spec.redis or 'none'}",
            field="redis_replicas" if spec.redis_replicas else "hosts",
        )


def _check_redis_dirs(spec: FleetSpec, source: str, lines: dict[tuple[Any, ...], int] | None) -> None:
    """A `redis_dir` belongs to a host with Redis nodes, and no two hosts share one: on a shared
    filesystem their nodes would write the same files."""
    owners: dict[str, str] = {}
    for host in spec.hosts:
        path = ("hosts", host.name, "redis_dir")
        if host.redis_dir and not host.redis:
            raise ConfigError(
                f"{where(source, path, lines)}: host {host.name} runs no Redis node, so it keeps no Redis data",
                field=".".join(path),
            )
        if not host.redis:
            continue
        folder = os.path.normpath(spec.redis_dir(host))
        other = owners.setdefault(folder, host.name)
        if other != host.name:
            raise ConfigError(
                f"{where(source, path, lines)}: {folder} is also hosts.{other}'s Redis folder: each host's nodes "
                "need a folder of their own",
                field=".".join(path),
            )


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def is_this_machine(address: str) -> bool:
    """Whether a host's address is this machine's: loopback, or this machine's host name."""
    import socket

    return address in LOOPBACK or address.startswith("127.") or address in (socket.gethostname(), socket.getfqdn())


def check_cpus(
    spec: FleetSpec, source: str, lines: dict[tuple[Any, ...], int] | None, limit: Callable[[HostSpec], int | None]
) -> None:
    """ConfigError naming the file and line of the first `cpus` entry at or beyond its host's CPU
    count (`limit(host)`; None: unknown here, so unchecked): a worker pinned there cannot start."""
    for host in spec.hosts:
        count = limit(host)
        if count is None:
            continue
        for role, workers in host.workers.items():
            for index, cpu in enumerate(workers.cpus):
                if cpu >= count:
                    path = ("hosts", host.name, role, "cpus", index)
                    raise ConfigError(
                        f"{where(source, path, lines)} ({cpu}) must be < {count}, the CPUs of host {host.name}: "
                        f"a {role} pinned to CPU {cpu} would not start",
                        field=".".join(map(str, path)),
                    )


def check_config_tasks(config: dict[str, Any], source: str, lines: dict[tuple[Any, ...], int] | None) -> None:
    """ConfigError naming the file and line of a task in the spec's `config` (sim.task, sim.tasks)
    that is not registered, with the closest registered name."""
    from foundation.config_base import suggest
    from foundation.config_experience import TASK_NAMES

    for key in ("sim.task", "sim.tasks"):
        value = config.get(key)
        names = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        for name in names:
            if name not in TASK_NAMES:
                raise ConfigError(
                    f"{where(source, ('config', key), lines)}: {name!r} is not a registered task"
                    f"{suggest(str(name), TASK_NAMES)}",
                    field=key,
                )


def spec_warnings(spec: FleetSpec, source: str) -> list[str]:
    """What a spec may run but to no end: no evaluator (nothing would score the policy)."""
    warnings = []
    if spec.count("evaluator") < 1:
        warnings.append(
            f"{source}: no host runs an evaluator: nothing would score the policy, so the run never stops at "
            "target_success (only at max_wall_sec or max_env_steps) and no checkpoint is scored"
        )
    return warnings
