"""A fleet over several hosts from one spec: `fleetrl fleet up fleet.yaml --host NAME`.
The format, every key and the ports to open: docs/fleet-spec.md; `fleetrl fleet check` checks one.

    run_id: big
    config: {sim.task: FetchPush-v4}        # config overrides, as --set section.field=value
    hosts:
      redis-a:  {address: 10.0.0.5, redis: [7000, 7001]}
      redis-b:  {address: 10.0.0.6, redis: [7002]}
      services: {address: 10.0.0.7, buffer: 50051, aggregator: {port: 50052}, evaluator: 1}
      gpu-box:  {address: 10.0.0.8, learner: {count: 1}}    # a port above, a count here
      sim-1:    {address: 10.0.0.9, sampler: {count: 8, cpus: [0, 1, 2, 3, 4, 5, 6, 7]}}

Every host runs the same command with its own name; it starts and supervises (the watchdog:
restarts with backoff, events.jsonl) that host's share: its Redis nodes, services and
workers. The first host with Redis nodes joins every node into one cluster once all answer.
Services listen on their host's address; workers get the addresses from the spec. Worker ids
are unique over the fleet (hosts in spec order), and the run's config counts every sampler
and learner of the spec. Secrets never go in the spec: every host exports the same
FLEETRL_TOKEN and FLEETRL_REDIS_PASSWORD (or sets security.token_file and
security.redis_password_file). Each host keeps its logs, heartbeats and events under
`<run_dir>/<host>/`; the aggregator's host also keeps the checkpoints and evaluations in
`<run_dir>/`. The aggregator's host decides when the fleet stops (the run's stop rule), every
host winds down, and summary.json lands in its `<run_dir>/` (fleet/launch/winddown.py). Under Slurm
`fleetrl fleet slurm` runs every host as a task of one job (fleet/launch/slurm.py).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import sys
import threading
import time
from typing import Any

import yaml

from fleet.launch.cluster_admin import cluster_ok, form_cluster, nodes_answer
from fleet.launch.kept import abandon_earlier_writes, host_nodes
from fleet.launch.spec_checks import check_config_tasks, check_fleet
from fleet.launch.spec_model import FleetSpec, SlurmSettings, VolumeSettings, host_spec
from fleet.launch.spec_schema import check_schema, key_lines, where
from fleet.launch.watchdog import RoleSpec, Watchdog, role_spec
from fleet.launch.winddown import Judge, StopBoard, watch, wind_down
from fleet.report.provenance import write_code_json
from foundation.config import ConfigError, RunConfig, with_overrides
from foundation.process import free_port, heartbeat_file
from foundation.transport import REDIS_PASSWORD_ENV, TOKEN_ENV, Security

log = logging.getLogger("fleetrl.fleet")

CLUSTER_WAIT_SEC = 300.0  # how long a host waits for the other hosts' Redis nodes


def load_spec(path: str | pathlib.Path) -> FleetSpec:
    """The spec in the YAML file at `path`, checked (parse_spec)."""
    try:
        text = pathlib.Path(path).read_text()
        raw = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"fleet spec {path}: {err}") from err
    return parse_spec(raw, str(path), key_lines(text))


def parse_spec(raw: Any, source: str = "fleet spec", lines: dict[tuple[Any, ...], int] | None = None) -> FleetSpec:
    """The spec from its YAML's data; ConfigError naming the file, line and key of the first
    problem (`lines`: key path -> line, from spec_schema.key_lines)."""
    check_schema(raw, source, lines)
    check_config_tasks(raw.get("config") or {}, source, lines)
    run_id = str(raw.get("run_id", "fleet"))
    config = raw.get("config") or {}
    overrides = tuple(f"{k}={json.dumps(v)}" for k, v in config.items())
    for key, item in zip(config, overrides, strict=True):
        try:
            with_overrides(RunConfig(), [item])
        except ConfigError as err:
            raise ConfigError(f"{where(source, ('config', key), lines)}: {err}", field=key) from err
    hosts = tuple(host_spec(name, body) for name, body in raw["hosts"].items())
    replicas = int(raw.get("redis_replicas", 0))
    slurm, kubernetes = SlurmSettings(**raw.get("slurm") or {}), VolumeSettings(**raw.get("kubernetes") or {})
    run_dir = str(raw.get("run_dir", f"runs/{run_id}"))
    spec = FleetSpec(run_id, run_dir, overrides, hosts, replicas, slurm, kubernetes)
    check_fleet(spec, source, lines)
    return spec


class FleetHost:
    """One host's share of a fleet: its Redis nodes and roles, supervised until `stop`.

    `fleetrl train` is the one-host case: LocalFleet builds a spec of one host on loopback and
    starts the roles `roles()` gives it (with `host_dir` the run directory, its own generated
    secrets, and its own order: the slow starters before the Redis Cluster is formed)."""

    def __init__(
        self,
        spec: FleetSpec,
        host: str,
        config: RunConfig,
        stop: threading.Event,
        *,
        host_dir: str | pathlib.Path | None = None,
        security: Security | None = None,
        max_restarts: int | None = None,
    ) -> None:
        self.spec, self.host, self.config, self.stop = spec, spec.host(host), config, stop
        self.run_dir = pathlib.Path(spec.run_dir)
        self.host_dir = pathlib.Path(host_dir) if host_dir is not None else self.run_dir / self.host.name
        self.security = security or Security.from_config(config.security)
        self.max_restarts = max_restarts  # None: the config's watchdog.max_restarts
        self.metrics: dict[str, str] = {}  # role -> its Prometheus endpoint (<host_dir>/metrics.json)
        if config.security.enabled and not (self.security.token and self.security.redis_password):
            raise ConfigError(
                f"a fleet over hosts needs the same secrets on every host: export {TOKEN_ENV} and "
                f"{REDIS_PASSWORD_ENV} (or set security.token_file and security.redis_password_file), "
                "or set security.enabled=false on a trusted network"
            )
        self.env = {
            TOKEN_ENV: self.security.token,
            REDIS_PASSWORD_ENV: self.security.redis_password,
            # One process per role is the parallelism: BLAS/OpenMP pools in every role would
            # spin on the same cores (measured: OpenBLAS threads in the aggregator took CPU from
            # the learner). Learners still set learner.torch_threads themselves.
            **{var: os.environ.get(var, "1") for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
        }

    def run(self, until_signal: bool = False) -> None:
        """Start this host's share and supervise it until the fleet stops or this host is
        signalled; then wind down (fleet/launch/winddown.py). On the aggregator's host the stop rule
        decides (target, max_wall_sec, max_env_steps) unless `until_signal`."""
        started_at = time.monotonic()
        self.host_dir.mkdir(parents=True, exist_ok=True)
        config_path = self.host_dir / "config.json"
        config_path.write_text(self.config.to_json())
        write_code_json(self.host_dir)  # each host's own: hosts may run different checkouts
        board = StopBoard(self.spec.redis, self.security, self.spec.run_id)
        nodes = host_nodes(self.spec, self.host, self.config, self.security) if self.host.redis else None
        if nodes is not None:
            nodes.start()  # with buffer.durable on the data of this host's earlier starts
            log.info("%s: Redis nodes %s", self.host.name, nodes.addresses)
        try:
            self._join_cluster()
            if self.stop.is_set():
                return
            judge = None
            if "aggregator" in self.host.services:  # the cluster answers: count this fleet on its board
                judge = Judge(self.config, self.spec, self.security, started_at, (board.fleets_seen() or 1) > 1)
            with Watchdog(self.host_dir / "logs", events_path=self.host_dir / "events.jsonl") as dog:
                if nodes is not None:
                    nodes.supervise(dog, self.config.watchdog, self.spec.redis_nodes)  # restarted nodes rejoin
                for spec in self.roles(str(config_path)):
                    dog.start(spec)
                log.info("%s: started %s", self.host.name, ", ".join(dog.roles))
                try:
                    reason = watch(self, dog, board, judge, until_signal)
                    wind_down(self, dog, board, judge, reason)
                finally:
                    if judge is not None:
                        judge.close()
        finally:
            board.close()
            if nodes is not None:
                nodes.close()

    def roles(self, config_path: str) -> list[RoleSpec]:
        """This host's role processes, services first. Every role also serves Prometheus metrics
        on a port of this host, listed in <host_dir>/metrics.json."""
        buffer, aggregator, redis = self.spec.service("buffer"), self.spec.service("aggregator"), self.spec.redis
        needs = {
            "buffer": ("--redis", redis),
            "aggregator": ("--run-dir", str(self.run_dir)),
            "sampler": ("--buffer", buffer, "--aggregator", aggregator, "--ack-log", str(self.host_dir / "acks")),
            "learner": ("--redis", redis, "--aggregator", aggregator, "--ack-log", str(self.host_dir / "acks")),
            "evaluator": ("--buffer", buffer, "--aggregator", aggregator),
        }
        base = (sys.executable, "-m", "fleet.cli.main")
        specs = []
        for role, port in self.host.services.items():
            listen = f"{self.host.address}:{port}"
            specs.append(self._role(role, (), (*base, role, "--config", config_path, "--listen", listen), needs[role]))
        for role, workers in self.host.workers.items():
            pin = ("taskset", "-c", ",".join(map(str, workers.cpus))) if workers.cpus else ()
            first = self.spec.first_id(self.host, role)
            for index in range(first, first + workers.count):
                argv = (*base, role, "--config", config_path, "--id", str(index))
                specs.append(self._role(f"{role}-{index}", pin, argv, needs[role]))
        self.host_dir.mkdir(parents=True, exist_ok=True)
        (self.host_dir / "metrics.json").write_text(json.dumps(self.metrics, indent=2))
        return specs

    def _role(self, name: str, pin: tuple[str, ...], argv: tuple[str, ...], needs: tuple[str, ...]) -> RoleSpec:
        beat = heartbeat_file(self.host_dir, name)
        self.metrics[name] = metrics = f"{self.host.address}:{free_port('0.0.0.0')}"  # free on every address
        argv = (*pin, *argv, "--heartbeat", beat, "--metrics", metrics, *needs)
        return role_spec(name, argv, self.config.watchdog, beat, self.env, self.max_restarts)

    def _join_cluster(self) -> None:
        """The first Redis host forms the fleet's cluster (nodes kept from an earlier start meet
        again); every host whose roles use it waits for it. The buffer's host then abandons the
        writes an earlier fleet reserved and never made, before its ingest service starts."""
        if self._first_redis_host():
            everyone = self.spec.redis_nodes
            self._wait_for(lambda: nodes_answer(everyone, self.security), "every Redis node of the fleet to answer")
            form_cluster(everyone, self.security, replicas=self.spec.redis_replicas)
            log.info("%s: formed the Redis Cluster of %d nodes", self.host.name, len(everyone))
        if self.host.services or "learner" in self.host.workers:
            self._wait_for(lambda: cluster_ok(self.spec.redis_nodes, self.security), "the Redis Cluster")
        if "buffer" in self.host.services and self.config.buffer.durable and not self.stop.is_set():
            abandon_earlier_writes(self.spec.redis, self.security, self.config)

    def _first_redis_host(self) -> bool:
        return next(h for h in self.spec.hosts if h.redis).name == self.host.name

    def _wait_for(self, ready, what: str) -> None:
        """Wait for another host's part, saying so every 10 s; ConfigError after CLUSTER_WAIT_SEC."""
        started = time.monotonic()
        said = started
        while not self.stop.is_set() and not ready():
            now = time.monotonic()
            if now - started > CLUSTER_WAIT_SEC:
                raise ConfigError(f"{self.host.name}: no {what} after {CLUSTER_WAIT_SEC:.0f}s: {self.spec.redis}")
            if now - said >= 10.0:
                log.info("%s: waiting for %s (%.0fs)", self.host.name, what, now - started)
                said = now
            self.stop.wait(0.5)
