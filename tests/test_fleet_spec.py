"""Fleet specs: what `fleetrl fleet up` reads, and the errors a wrong one gets."""

from __future__ import annotations

import json
import os

import pytest

from fleet.cli.presets import preset_config
from fleet.launch.local_fleet import LocalFleet
from fleet.launch.spec import FleetHost, load_spec, parse_spec
from fleet.launch.spec_checks import redis_layout
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
    spec = parse_spec({**SPEC, "run_dir": str(tmp_path)})
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
    # Samplers and learners keep ack ledgers (one line per acked push) for audits (fleet/chaos/audit.py).
    for role in ("sampler-0", "learner-0"):
        assert sim1[role][sim1[role].index("--ack-log") + 1] == str(tmp_path / "sim-1" / "acks")
    services = {r.name: r.argv for r in FleetHost(spec, "services", config, None).roles("c.json")}  # type: ignore[arg-type]
    assert services["buffer"][services["buffer"].index("--listen") + 1] == "10.0.0.7:50051"


@pytest.mark.parametrize(
    "change,message",
    [
        ({"hosts": {}}, "hosts ({}) must be a non-empty mapping"),
        ({"extra": 1}, "extra: unknown key (known: config, hosts, kubernetes, redis_replicas, run_dir, run_id, slurm)"),
        (
            {"hosts": {**SPEC["hosts"], "x": {"address": "1.2.3.4", "samplr": 1}}},
            "hosts.x.samplr: unknown key; did you mean 'sampler'?",
        ),
        ({"hosts": {**SPEC["hosts"], "x": {"redis": [1]}}}, "hosts.x: missing 'address'"),
        ({"hosts": {**SPEC["hosts"], "x": {"address": "a", "buffer": 1}}}, "exactly one host must run the buffer"),
        ({"hosts": {k: v for k, v in SPEC["hosts"].items() if k != "redis-b"}}, "needs at least 3 nodes"),
        ({"hosts": {**SPEC["hosts"], "sim-2": {"address": "a", "sampler": 0}}}, "hosts.sim-2.sampler (0) must be >= 1"),
        (
            {"hosts": {**SPEC["hosts"], "sim-2": {"address": "a", "sampler": {"count": 2, "cpu": [1]}}}},
            "hosts.sim-2.sampler.cpu: unknown key; did you mean 'cpus'?",
        ),
        (
            {"hosts": {**SPEC["hosts"], "sim-2": {"address": "a", "learner": "1"}}},
            "hosts.sim-2.learner ('1') must be a count of learner processes",
        ),
        (
            {"hosts": {**SPEC["hosts"], "r": {"address": "a", "redis": [60000]}}},
            "hosts.r.redis.0 (60000) must be <= 55535",
        ),
        (
            {
                "hosts": {
                    **SPEC["hosts"],
                    "services": {"address": "10.0.0.7", "buffer": {"port": 70000}, "aggregator": 1},
                }
            },
            "hosts.services.buffer.port (70000) must be <= 65535",
        ),
        (
            {"hosts": {**SPEC["hosts"], "services": {"address": "10.0.0.7", "buffer": 50052, "aggregator": 50052}}},
            "hosts.services.aggregator: port 50052 on 10.0.0.7 is wanted for aggregator and for buffer",
        ),
        (
            {"hosts": {**SPEC["hosts"], "redis-b": {"address": "10.0.0.5", "redis": [17000]}}},
            "hosts.redis-b.redis.0: port 17000 on 10.0.0.5 is wanted for Redis node and for Redis cluster bus of 7000",
        ),
        ({"redis_replicas": 1}, "redis_replicas: a Redis Cluster with redis_replicas 1 needs at least 6 nodes"),
        ({"config": {"sim.tsk": 1}}, "config.sim.tsk: unknown config field 'sim.tsk'; did you mean 'task'?"),
        ({"config": ["sim.task"]}, "config (['sim.task']) must be config overrides"),
        ({"slurm": {"warning_sec": -1}}, "slurm.warning_sec (-1) must be >= 0: seconds before the job's end"),
        ({"slurm": {"requeue": "later"}}, "slurm.requeue ('later') must be true or false"),
        ({"slurm": {"warning": 60}}, "slurm.warning: unknown key; did you mean 'warning_sec'?"),
        ({"kubernetes": {"run_volume_size": "10GB"}}, "kubernetes.run_volume_size ('10GB') must be a volume size"),
        ({"kubernetes": {"storage_class": "Fast SSD"}}, "kubernetes.storage_class ('Fast SSD') must be a StorageClass"),
        (
            {"hosts": {**SPEC["hosts"], "sim-2": {"address": "a", "sampler": 1, "redis_dir": "/data/redis"}}},
            "hosts.sim-2.redis_dir: host sim-2 runs no Redis node, so it keeps no Redis data",
        ),
        (
            {
                "hosts": {
                    **SPEC["hosts"],
                    "redis-b": {"address": "10.0.0.6", "redis": [7002], "redis_dir": "runs/big/redis/redis-a"},
                }
            },
            "hosts.redis-b.redis_dir: runs/big/redis/redis-a is also hosts.redis-a's Redis folder",
        ),
    ],
)
def test_a_wrong_spec_is_refused_naming_what_is_wrong(change, message):
    with pytest.raises(ConfigError) as err:
        parse_spec({**SPEC, **change})
    assert message in str(err.value)


def test_slurm_kubernetes_and_redis_dir_have_defaults_and_take_the_specs_values():
    spec = parse_spec(SPEC)
    assert (spec.slurm.warning_sec, spec.slurm.requeue) == (120, True)
    assert (spec.kubernetes.storage_class, spec.kubernetes.run_volume_size) == ("", "10Gi")
    assert [spec.redis_dir(h) for h in spec.hosts if h.redis] == ["runs/big/redis/redis-a", "runs/big/redis/redis-b"]
    hosts = {**SPEC["hosts"], "redis-b": {**SPEC["hosts"]["redis-b"], "redis_dir": "/scratch/redis-b"}}
    given = {"slurm": {"warning_sec": 300, "requeue": False}, "kubernetes": {"storage_class": "fast-ssd"}}
    spec = parse_spec({**SPEC, **given, "hosts": hosts})
    assert (spec.slurm.warning_sec, spec.slurm.requeue, spec.kubernetes.storage_class) == (300, False, "fast-ssd")
    assert spec.redis_dir(spec.host("redis-b")) == "/scratch/redis-b"


def test_an_unknown_host_and_missing_secrets_are_named(monkeypatch):
    spec = parse_spec(SPEC)
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


def test_a_local_run_warns_before_it_starts_when_its_learners_would_make_most_gradients_stale(tmp_path):
    """`fleetrl train --learners 8` on FetchPush's preset (K=1, max_grad_staleness 2) says what
    `fleet check` says of such a spec; the preset's own two learners and K=0 say nothing."""
    push = preset_config("FetchPush-v4")
    eight = ["learner.num_learners=8"]
    for sets, warned in (([], False), (eight, True), ([*eight, "aggregator.grads_per_step=0"], False)):
        config = with_overrides(push, [f'run_dir="{tmp_path}"', *sets])
        notes = LocalFleet(config, started_at=0.0).notes()
        stale = [n for n in notes if "most are dropped as stale" in n]
        assert bool(stale) == warned, (sets, notes)
        if warned:
            assert stale[0].startswith("warning: 8 learners at 1 gradients per step: a gradient arrives about 7")


def test_learner_own_cpu_gives_the_learners_the_highest_cpus_and_everyone_else_the_rest(tmp_path):
    from fleet.launch.local_fleet import confined_to, learner_cpus

    assert learner_cpus({0, 1}, 1) == ((1,), (0,))
    assert learner_cpus({2, 5, 7, 9}, 2) == ((7, 9), (2, 5))
    assert learner_cpus({3}, 1) == ((), ())  # nothing left for the rest: nothing pinned
    allowed = os.sched_getaffinity(0)
    config = with_overrides(RunConfig(), [f'run_dir="{tmp_path}"', "learner.own_cpu=true"])
    fleet = LocalFleet(config, started_at=0.0)
    host = FleetHost(
        fleet.spec(fleet.make_cluster()), "local", config, None, host_dir=tmp_path, security=fleet.security
    )  # type: ignore[arg-type]
    roles = {r.name: r.argv for r in host.roles("c.json")}
    if len(allowed) < 2:
        assert fleet.cpus == ((), ()) and roles["learner-0"][0] != "taskset"
        return
    mine = str(max(allowed))
    assert roles["learner-0"][:3] == ("taskset", "-c", mine)
    assert all(argv[0] != "taskset" for name, argv in roles.items() if name != "learner-0")
    with confined_to(fleet.cpus[1]):  # what the launcher's children inherit
        assert os.sched_getaffinity(0) == set(fleet.cpus[1]) and int(mine) not in fleet.cpus[1]
    assert os.sched_getaffinity(0) == allowed


README_SPEC = """\
run_id: big
config: {sim.task: FetchPush-v4}
hosts:
  redis-a:  {address: 10.0.0.5, redis: [7000, 7001]}
  redis-b:  {address: 10.0.0.6, redis: [7002]}
  services: {address: 10.0.0.7, buffer: 50051, aggregator: 50052, evaluator: 1}
  sim-1:    {address: 10.0.0.8, sampler: {count: 8, cpus: [0, 1, 2, 3, 4, 5, 6, 7]}, learner: 1}
"""


@pytest.mark.parametrize(
    "old,new,message",
    [
        ("sampler: {count: 8", "samplr: {count: 8", "fleet.yaml:7: hosts.sim-1.samplr: unknown key; did you mean"),
        ("buffer: 50051", "buffer: {port: 0}", "fleet.yaml:6: hosts.services.buffer.port (0) must be >= 1"),
        ("redis: [7000, 7001]", "redis: [7000, 70001]", "fleet.yaml:4: hosts.redis-a.redis.1 (70001) must be <= 55535"),
        ("sim.task: FetchPush-v4", "sim.tsk: FetchPush-v4", "fleet.yaml:2: config.sim.tsk: unknown config field"),
        ("run_id: big", "run_id: big\nredis_replicas: 1", "fleet.yaml:2: redis_replicas: a Redis Cluster with"),
        ("address: 10.0.0.8", "address: 10.0", "fleet.yaml:7: hosts.sim-1.address (10.0) must be the host name"),
        (
            "run_id: big",
            "run_id: big\nslurm: {warning_sec: 70000}",
            "fleet.yaml:2: slurm.warning_sec (70000) must be <=",
        ),
        (
            "redis: [7002]",
            "redis: [7002], redis_dir: ''",
            "fleet.yaml:5: hosts.redis-b.redis_dir ('') must be a folder",
        ),
    ],
)
def test_a_wrong_spec_file_is_refused_naming_its_line(tmp_path, old, new, message):
    assert old in README_SPEC
    path = tmp_path / "fleet.yaml"
    path.write_text(README_SPEC.replace(old, new, 1))
    with pytest.raises(ConfigError) as err:
        load_spec(path)
    assert str(err.value).startswith(str(tmp_path / message)), str(err.value)


def test_ports_and_counts_may_be_spelled_out_and_mean_the_same():
    short = parse_spec(SPEC)
    hosts = {
        **SPEC["hosts"],
        "services": {"address": "10.0.0.7", "buffer": {"port": 50051}, "aggregator": {"port": 50052},
                     "evaluator": {"count": 1}},
        "sim-2": {"address": "10.0.0.9", "sampler": {"count": 3}},
    }  # fmt: skip
    assert parse_spec({**SPEC, "hosts": hosts}) == short
    assert short.service("buffer") == "10.0.0.7:50051"
    assert (short.count("sampler"), short.count("learner")) == (5, 1)


def test_redis_replicas_follow_primaries_and_acks_wait_for_a_replica():
    hosts = {**SPEC["hosts"], "redis-c": {"address": "10.0.0.10", "redis": [7003, 7004, 7005]}}
    spec = parse_spec({**SPEC, "hosts": hosts, "redis_replicas": 1})
    layout = redis_layout(spec)
    assert layout.primaries == [("10.0.0.5", 7000), ("10.0.0.5", 7001), ("10.0.0.6", 7002)]
    assert layout.replicas[0] == (("10.0.0.10", 7003), ("10.0.0.5", 7000))
    assert spec.config().buffer.replicas_to_ack == 1
    assert parse_spec(SPEC).config().buffer.replicas_to_ack == 0
    explicit = parse_spec({**SPEC, "hosts": hosts, "redis_replicas": 1, "config": {"buffer.replicas_to_ack": 0}})
    assert explicit.config().buffer.replicas_to_ack == 0  # the spec's own setting wins


def test_grads_per_step_follows_the_spec_and_a_step_that_cannot_close_is_refused():
    assert parse_spec(SPEC).config().aggregator.grads_per_step == 0  # 0 = every learner of the spec
    stuck = parse_spec(
        {**SPEC, "config": {"aggregator.grads_per_step": 2, "aggregator.step_deadline_ms": 0}}
    )  # one learner in SPEC
    with pytest.raises(ConfigError, match=r"grads_per_step \(2\) must be <= the spec's learners \(1\)"):
        stuck.config()
