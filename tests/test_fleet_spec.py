"""Fleet specs: what `fleetrl fleet up` reads, and the errors a wrong one gets."""

from __future__ import annotations

import json

import pytest

from fleet.launch import LocalFleet
from fleet.spec import FleetHost, FleetSpec
from foundation.config import ConfigError, RunConfig, with_overrides
from foundation.transport import REDIS_PASSWORD_ENV, TOKEN_ENV

SPEC = {
    "run_id": "big",
    "config": {"sim.task": "FetchPush-v4", "learner.batch_size": 512},
    "hosts": {
        "redis-a": {"address": "10.0.0.5", "redis": [7000, 7001]},
        "redis-b": {"address": "10.0.0.6", "redis": [7002]},
        "services": {"address": "10.0.0.7", "buffer": 50051, "aggregator": 50052, "evaluator": 1},
        "sim-1": {"address": "10.0.0.8", "sampler": {"count": 2, "cpus": [0, 1]}, "learner": 1},
        "sim-2": {"address": "10.0.0.9", "sampler": 3},
    },
}


def test_a_spec_gives_every_host_its_roles_with_the_fleets_addresses(monkeypatch, tmp_path):
    monkeypatch.setenv(TOKEN_ENV, "t")
    monkeypatch.setenv(REDIS_PASSWORD_ENV, "p")
    spec = FleetSpec.parse({**SPEC, "run_dir": str(tmp_path)})
    config = spec.config()
    assert (config.run_id, config.sim.task, config.learner.batch_size) == ("big", "FetchPush-v4", 512)
    assert (config.sampler.num_samplers, config.learner.num_learners) == (5, 1)  # counted over the hosts
    assert spec.redis == "10.0.0.5:7000,10.0.0.5:7001,10.0.0.6:7002"
    roles = {r.name: r.argv for r in FleetHost(spec, "sim-2", config, None).roles("c.json")}  # type: ignore[arg-type]
    assert sorted(roles) == ["sampler-2", "sampler-3", "sampler-4"]  # ids unique over the fleet
    argv = roles["sampler-2"]
    assert argv[argv.index("--buffer") + 1] == "10.0.0.7:50051"
    assert argv[argv.index("--aggregator") + 1] == "10.0.0.7:50052"
    sim1 = {r.name: r.argv for r in FleetHost(spec, "sim-1", config, None).roles("c.json")}  # type: ignore[arg-type]
    assert sim1["sampler-0"][:3] == ("taskset", "-c", "0,1")
    assert sim1["learner-0"][sim1["learner-0"].index("--redis") + 1] == spec.redis
    services = {r.name: r.argv for r in FleetHost(spec, "services", config, None).roles("c.json")}  # type: ignore[arg-type]
    assert services["buffer"][services["buffer"].index("--listen") + 1] == "10.0.0.7:50051"


@pytest.mark.parametrize(
    "change,message",
    [
        ({"hosts": {}}, "non-empty 'hosts'"),
        ({"extra": 1}, "unknown keys ['extra']"),
        ({"hosts": {**SPEC["hosts"], "x": {"address": "1.2.3.4", "samplr": 1}}}, "hosts.x: unknown keys ['samplr']"),
        ({"hosts": {**SPEC["hosts"], "x": {"redis": [1]}}}, "hosts.x: expected a mapping with an 'address'"),
        ({"hosts": {**SPEC["hosts"], "x": {"address": "a", "buffer": 1}}}, "exactly one host must run the buffer"),
        ({"hosts": {k: v for k, v in SPEC["hosts"].items() if k != "redis-b"}}, "at least 3 nodes"),
        ({"hosts": {**SPEC["hosts"], "sim-2": {"address": "a", "sampler": 0}}}, "hosts.sim-2.sampler: a count >= 1"),
        ({"hosts": {**SPEC["hosts"], "r": {"address": "a", "redis": [60000]}}}, "hosts.r.redis: a list of ports"),
    ],
)
def test_a_wrong_spec_is_refused_naming_what_is_wrong(change, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        FleetSpec.parse({**SPEC, **change})


def test_an_unknown_host_and_missing_secrets_are_named(monkeypatch):
    spec = FleetSpec.parse(SPEC)
    with pytest.raises(ConfigError, match="--host 'sim-9' is not in the spec"):
        spec.host("sim-9")
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(REDIS_PASSWORD_ENV, raising=False)
    with pytest.raises(ConfigError, match=f"export {TOKEN_ENV}"):
        FleetHost(spec, "sim-1", spec.config(), None)  # type: ignore[arg-type]


def test_the_local_run_is_a_fleet_of_one_host_built_by_the_same_code(tmp_path):
    """`fleetrl train` takes its roles from FleetHost, as `fleetrl fleet up` does."""
    config = with_overrides(RunConfig(), [f'run_dir="{tmp_path}"', "sampler.num_samplers=2"])
    fleet = LocalFleet(config, started_at=0.0)
    cluster = fleet.make_cluster()  # ports chosen, nothing started
    spec = fleet.spec(cluster)
    host = FleetHost(spec, "local", config, None, host_dir=tmp_path, security=fleet.security)  # type: ignore[arg-type]
    roles = {r.name: r.argv for r in host.roles("c.json")}
    assert sorted(roles) == ["aggregator", "buffer", "evaluator-0", "learner-0", "sampler-0", "sampler-1"]
    assert roles["learner-0"][roles["learner-0"].index("--redis") + 1] == ",".join(
        f"127.0.0.1:{p}" for p in cluster.ports or ()
    )
    assert all("--metrics" in argv for argv in roles.values())
    assert sorted(json.loads((tmp_path / "metrics.json").read_text())) == sorted(roles)
