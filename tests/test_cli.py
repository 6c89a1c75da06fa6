"""The command line: each role's help lists the flags that role reads, and no other."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fleet.cli.main import main
from foundation.config import RunConfig

SERVICE_FLAGS = ("--port", "--listen", "--advertise", "--ready-file")


@pytest.mark.parametrize(
    "role,has,lacks",
    [
        ("buffer", ("--redis", *SERVICE_FLAGS), ("--run-dir", "--ack-log", "--aggregator")),
        ("aggregator", (*SERVICE_FLAGS, "--run-dir"), ("--redis", "--ack-log", "--buffer")),
        ("learner", ("--redis", "--aggregator", "--ack-log"), (*SERVICE_FLAGS, "--run-dir", "--buffer")),
        ("sampler", ("--buffer", "--aggregator", "--ack-log"), (*SERVICE_FLAGS, "--run-dir", "--redis")),
        ("evaluator", ("--buffer", "--aggregator"), (*SERVICE_FLAGS, "--run-dir", "--ack-log", "--redis")),
    ],
)
def test_a_role_help_lists_only_the_flags_it_reads(role, has, lacks, capsys):
    with pytest.raises(SystemExit) as done:
        main([role, "--help"])
    assert done.value.code == 0
    words = set(capsys.readouterr().out.replace(",", " ").split())
    assert {"--id", "--heartbeat", "--metrics", "--config", *has} <= words
    assert not words & set(lacks), words & set(lacks)


def test_a_flag_a_role_does_not_read_is_refused(capsys):
    with pytest.raises(SystemExit) as done:
        main(["learner", "--redis", "127.0.0.1:7000", "--aggregator", "127.0.0.1:50052", "--listen", "0.0.0.0:1"])
    assert done.value.code == 2 and "unrecognized arguments: --listen" in capsys.readouterr().err


class _FakeFleet:
    """LocalFleet's place in `fleetrl train`: records what it was built with, runs nothing."""

    built: list[tuple[RunConfig, int]] = []

    def __init__(self, config: RunConfig, started_at: float, redis_replicas: int = 0) -> None:
        _FakeFleet.built.append((config, redis_replicas))
        self.run_dir = config.run_dir

    def run(self) -> SimpleNamespace:
        reached = {"target_success": 0.9, "wall_sec_to_target": 1.0, "env_steps_to_target": 1, "version_to_target": 1}
        return SimpleNamespace(stop_reason="done", reached_target=True, mode="async", run_dir=self.run_dir, **reached)


@pytest.mark.parametrize(
    "flags,replicas,replicas_to_ack",
    [
        ([], 0, 0),
        (["--redis-replicas", "1"], 1, 1),  # an ack waits for the replica, as with a fleet spec's redis_replicas
        (["--redis-replicas", "2"], 2, 1),
        (["--redis-replicas", "1", "--set", "buffer.replicas_to_ack=0"], 1, 0),  # the user's setting wins
    ],
)
def test_train_starts_its_redis_cluster_with_the_replicas_asked_for(
    flags, replicas, replicas_to_ack, monkeypatch, tmp_path
):
    monkeypatch.setattr("fleet.launch.local_fleet.LocalFleet", _FakeFleet)
    _FakeFleet.built.clear()
    assert main(["train", "--task", "FetchReach-v4", "--run-dir", str(tmp_path), *flags]) == 0
    [(config, built_replicas)] = _FakeFleet.built
    assert (built_replicas, config.buffer.replicas_to_ack) == (replicas, replicas_to_ack)


@pytest.mark.parametrize("flags", [["--redis-replicas", "-1"], ["--redis-replicas", "1", "--mode", "sync"]])
def test_train_refuses_redis_replicas_it_cannot_start(flags, monkeypatch, capsys):
    monkeypatch.setattr("fleet.launch.local_fleet.LocalFleet", _FakeFleet)
    _FakeFleet.built.clear()
    assert main(["train", "--task", "FetchReach-v4", *flags]) == 2
    assert "--redis-replicas" in capsys.readouterr().err and not _FakeFleet.built


def test_train_refuses_a_control_rate_a_task_cannot_run_at_before_starting_anything(monkeypatch, capsys):
    monkeypatch.setattr("fleet.launch.local_fleet.LocalFleet", _FakeFleet)
    _FakeFleet.built.clear()
    tasks = "FetchReach-v4,MetaWorld-reach-v3"
    assert main(["train", "--tasks", tasks, "--set", "sim.control_hz=25"]) == 2
    err = capsys.readouterr().err
    assert "sim.control_hz (25) is below MetaWorld-reach-v3's own 80 Hz" in err, err
    assert not _FakeFleet.built
    assert main(["train", "--tasks", tasks, "--set", "sim.control_hz=120"]) == 0  # both run at 120 Hz
    assert len(_FakeFleet.built) == 1


def test_train_refuses_random_keep_dims_beyond_the_tasks_actions_before_starting_anything(monkeypatch, capsys):
    monkeypatch.setattr("fleet.launch.local_fleet.LocalFleet", _FakeFleet)
    _FakeFleet.built.clear()
    assert main(["train", "--task", "FetchPush-v4", "--set", "sampler.random_keep_dims=5"]) == 2
    err = capsys.readouterr().err
    assert "sampler.random_keep_dims (5) must be <= the task's action dimensions (4)" in err, err
    assert not _FakeFleet.built


def test_train_refuses_a_flow_control_tolerance_below_one_episodes_push_before_starting_anything(monkeypatch, capsys):
    monkeypatch.setattr("fleet.launch.local_fleet.LocalFleet", _FakeFleet)
    _FakeFleet.built.clear()
    sets = ["--set", "sampler.her_k=0", "--set", "sampler.max_env_steps_per_update=1", "--set"]
    assert main(["train", "--task", "MetaWorld-push-v3", *sets, "buffer.rate_tolerance_rows=50"]) == 2
    err = capsys.readouterr().err
    assert "buffer.rate_tolerance_rows (50) must be at least 76" in err and "150 rows" in err, err
    assert not _FakeFleet.built


@pytest.mark.parametrize("task", ["MetaWorld-push-v3", "MetaWorld-door-open-v3"])
def test_train_builds_a_meta_world_task_alone_with_its_preset_past_every_check(task, monkeypatch, tmp_path):
    monkeypatch.setattr("fleet.launch.local_fleet.LocalFleet", _FakeFleet)
    _FakeFleet.built.clear()
    assert main(["train", "--task", task, "--run-dir", str(tmp_path)]) == 0
    [(config, _)] = _FakeFleet.built
    assert (config.preset, config.sim.reward, config.sampler.demo_episodes) == (task, "shaped", 100)


def test_train_builds_mt10_with_the_meta_world_multi_task_recipe_past_every_check(monkeypatch, tmp_path):
    monkeypatch.setattr("fleet.launch.local_fleet.LocalFleet", _FakeFleet)
    _FakeFleet.built.clear()
    argv = ["train", "--tasks", "mt10", "--set", 'model.kind="moe"', "--max-wall-sec", "5400"]
    assert main([*argv, "--run-dir", str(tmp_path)]) == 0
    [(config, _)] = _FakeFleet.built
    assert (config.preset, config.max_wall_sec, len(config.sim.tasks)) == ("Meta-World multi-task MoE", 5400, 10)
    assert (config.sim.reward, config.sampler.her_k, config.learner.gamma) == ("shaped", 0, 0.99)
    assert (config.sampler.demo_episodes, config.model.critic_norm) == (100, "layer")
