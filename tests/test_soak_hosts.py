"""The soak's two-host fleet (fleet/chaos/soak_hosts.py) as the watchdog would start it: which role runs
where and reaches what, without starting anything."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

from fleet.chaos.soak import soak_config
from fleet.chaos.soak_hosts import TwoHostFleet
from foundation.config import RunConfig, with_overrides


def test_the_samplers_run_on_the_sampler_host_and_reach_the_services_over_the_link(tmp_path):
    overrides = [f"run_dir={json.dumps(str(tmp_path))}", "sampler.num_samplers=2"]
    config = soak_config(with_overrides(RunConfig(), overrides))
    # Loopback addresses stand in for the veth's two ends (nothing is bound: only named).
    net = SimpleNamespace(addresses={"services": "127.0.0.2", "sampler": "127.0.0.3"},
                          exec_prefix=("ip", "netns", "exec", "flabc"))  # fmt: skip
    fleet = TwoHostFleet(config, cast(Any, net), started_at=0.0, redis_replicas=1)
    cluster = SimpleNamespace(ports=[7000, 7001, 7002, 7003, 7004, 7005])
    spec = fleet.spec(cast(Any, cluster))
    roles = {role.name: role.argv for role in fleet.roles(spec, max_restarts=None)}
    buffer, aggregator = spec.service("buffer"), spec.service("aggregator")
    assert buffer.startswith("127.0.0.2:") and aggregator.startswith("127.0.0.2:")
    samplers = [name for name in roles if name.startswith("sampler-")]
    assert len(samplers) == 2
    for name, argv in roles.items():
        on_sampler_host = argv[:4] == net.exec_prefix
        assert on_sampler_host == (name in samplers), (name, argv)
        if name in samplers:  # over the link, to the services' address; metrics on its own address
            assert argv[argv.index("--buffer") + 1] == buffer and argv[argv.index("--aggregator") + 1] == aggregator
            assert argv[argv.index("--metrics") + 1].startswith("127.0.0.3:")
        if name.startswith(("learner-", "buffer")):  # Redis stays on loopback, beside the services
            assert argv[argv.index("--redis") + 1].startswith("127.0.0.1:7000")
    assert argv_of(roles, "buffer", "--listen") == buffer and argv_of(roles, "aggregator", "--listen") == aggregator
    assert set(json.loads((tmp_path / "metrics.json").read_text())) == set(roles)  # every host's roles, one file


def argv_of(roles: dict, role: str, flag: str) -> str:
    argv = roles[role]
    return argv[argv.index(flag) + 1]
