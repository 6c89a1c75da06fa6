"""The soak's fleet over two hosts on one machine: the samplers in a namespace of their own.

    with SamplerHost.create(tag) as net:
        summary = TwoHostFleet(config, net, started_at=t0, redis_replicas=1).run(observer)

The fleet spec it runs (what `fleetrl fleet up` would start on three hosts):
    local     127.0.0.1       Redis nodes, learners, evaluator
    services  10.232.N.1      buffer, aggregator (our end of the veth: "the services' host")
    samplers  10.232.N.2      the samplers, run with `ip netns exec` in the sampler host's namespace
The services listen on the veth's address, which the learners and the evaluator reach inside
this namespace whether or not the link is up; the samplers reach them only over the link. All
roles share the run directory (heartbeats, ack ledgers, logs), as on one host.
"""

from __future__ import annotations

import dataclasses
import json

from fleet.chaos.netns import SamplerHost
from fleet.launch.local_cluster import LocalRedisCluster
from fleet.launch.local_fleet import LocalFleet
from fleet.launch.spec import FleetHost
from fleet.launch.spec_model import FleetSpec, HostSpec, Workers
from fleet.launch.watchdog import RoleSpec
from foundation.config import RunConfig
from foundation.process import free_port

HOSTS = ("local", "services", "samplers")


class TwoHostFleet(LocalFleet):
    """LocalFleet with its samplers on `net`'s sampler host and its services on the link."""

    def __init__(self, config: RunConfig, net: SamplerHost, started_at: float, redis_replicas: int = 0) -> None:
        super().__init__(config, started_at=started_at, redis_replicas=redis_replicas)
        self.net = net

    def spec(self, cluster: LocalRedisCluster) -> FleetSpec:
        c = self.config
        services_address = self.net.addresses["services"]
        hosts = (
            HostSpec(
                "local",
                "127.0.0.1",
                redis=tuple(cluster.ports or ()),
                workers={"learner": Workers(c.learner.num_learners), "evaluator": Workers(1)},
            ),
            HostSpec(
                "services",
                services_address,
                services={"aggregator": free_port(services_address), "buffer": free_port(services_address)},
            ),
            HostSpec("samplers", self.net.addresses["sampler"], workers={"sampler": Workers(c.sampler.num_samplers)}),
        )
        return FleetSpec(c.run_id, str(self.run_dir), (), hosts, self.redis_replicas)

    def roles(self, spec: FleetSpec, max_restarts: int | None) -> list[RoleSpec]:
        """Every host's roles, the samplers' argv run in the sampler host's namespace; one
        metrics.json for all."""
        roles: list[RoleSpec] = []
        metrics: dict[str, str] = {}
        for name in HOSTS:
            host = FleetHost(spec, name, self.config, self._stop, host_dir=self.run_dir, security=self.security,
                             max_restarts=max_restarts)  # fmt: skip
            for role in host.roles(str(self.run_dir / "config.json")):
                if name == "samplers":
                    role = dataclasses.replace(role, argv=(*self.net.exec_prefix, *role.argv))
                roles.append(role)
            metrics |= host.metrics
        (self.run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
        return roles
