"""The samplers' demonstrations (sampler.demo_episodes, sampler/demos.py): which sampler runs which
expert episode on which seed, and what a sampler stores of them through its real pusher, on real
Meta-World envs (the ingest service faked: it checks every push as the service does)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from foundation.config import RunConfig, tasks_overrides, with_overrides
from foundation.process import Heartbeat
from sampler.demos import DEMO_SEEDS_FROM, demo_plan
from sampler.pusher import Pusher
from sampler.worker import TRAIN_SEEDS_FROM, Collector
from sim.registry import get_task
from sim.tasks import TaskSet
from tests.fakes import FakeIngestClient

TASKS = ("MetaWorld-reach-v3", "MetaWorld-push-v3")


def _config(*extra: str) -> RunConfig:
    overrides = [*tasks_overrides(TASKS), "sampler.demo_episodes=2", "sampler.num_samplers=2"]
    return with_overrides(RunConfig(), overrides + ["sampler.her_k=2", *extra]).validate()


def test_each_tasks_episodes_are_spread_over_the_samplers_on_seeds_no_other_episode_draws():
    config = with_overrides(_config(), ["sampler.demo_episodes=5", "sampler.num_samplers=2"])
    shares = [demo_plan(config, 2, sampler, 2) for sampler in (0, 1)]
    assert [(d.place, d.number) for d in shares[0]] == [(0, 0), (1, 0), (0, 2), (1, 2), (0, 4), (1, 4)]
    assert [(d.place, d.number) for d in shares[1]] == [(0, 1), (1, 1), (0, 3), (1, 3)]
    seeds = [d.seed for share in shares for d in share]
    assert len(set(seeds)) == 10 and min(seeds) >= DEMO_SEEDS_FROM >= TRAIN_SEEDS_FROM
    assert TRAIN_SEEDS_FROM >= config.eval.seed + config.eval.episodes  # the evaluator's seeds lie lower still
    assert sorted(seeds) == sorted(d.seed for d in demo_plan(config, 2))  # sync mode: one sampler, the same episodes
    other_run = demo_plan(with_overrides(config, ["sampler.seed=1"]), 2)
    assert not {d.seed for d in other_run} & set(seeds)  # another sampler.seed, other demonstrations


def _collector(config: RunConfig, sampler_id: int, ingest: FakeIngestClient) -> Collector:
    """Sampler `sampler_id` of the run with its own task's env, its pusher on `ingest`."""
    tasks = TaskSet.for_run(config)
    mine = tasks.assigned(sampler_id, config.sampler.num_samplers)
    envs = [tasks.training_env(i, config) for i in mine]
    pusher = Pusher(ingest, tasks.tasks[mine[0]])  # type: ignore[arg-type]
    # one task each: no schedule, so no aggregator client (None) and no weights watcher
    return Collector(config, sampler_id, envs, mine, None, None, pusher, Heartbeat(None))  # type: ignore[arg-type]


def _ingest(config: RunConfig, sampler_id: int, earlier: int = 0) -> FakeIngestClient:
    ingest = FakeIngestClient(TaskSet.for_run(config).schema(), TaskSet.for_run(config).ids)
    ingest.sampler_id, ingest.earlier_demos = sampler_id, earlier
    return ingest


@pytest.mark.parametrize("sampler_id", [0, 1])
def test_a_sampler_stores_its_share_marked_each_episode_the_experts_success(sampler_id):
    """Sampler i runs episode i of both tasks (one of them in an env it builds for the purpose):
    one marked batch per episode, rows built as a training episode's (1 + her_k per step), no
    training episode counted, its env steps counted but not taken from the random warm-up."""
    config = _config()
    ingest = _ingest(config, sampler_id)
    collector = _collector(config, sampler_id, ingest)
    try:
        assert collector.demonstrate(threading.Event()) == 2
        collector.pusher.close()
    finally:
        for env in collector.envs:
            env.close()
    ingest.assert_stored(2)
    batches = ingest.stored()
    horizons = [get_task(name).max_episode_steps for name in TASKS]
    assert [b.task_id for b in batches] == [get_task(name).task_id for name in TASKS]
    assert all(b.demonstration and b.episodes == 0 and b.policy_version == 0 for b in batches)
    assert [b.env_steps for b in batches] == horizons and [b.num_transitions for b in batches] == [
        3 * h for h in horizons
    ]
    assert collector.env_steps == collector.demo_env_steps == sum(horizons) and collector.episodes == 0
    counters = collector.heartbeat.counters
    assert (counters["demo_episodes"], counters["demo_successes"]) == (2, 2)  # the expert solves both tasks
    assert ingest.stats().demo_episodes_by_sampler == {sampler_id: 2}


def test_a_restarted_sampler_stores_only_the_rest_of_its_share():
    config = _config()
    ingest = _ingest(config, 0, earlier=1)  # its earlier life stored reach's demonstration
    collector = _collector(config, 0, ingest)
    try:
        assert collector.demonstrate(threading.Event()) == 2
        collector.pusher.close()
    finally:
        for env in collector.envs:
            env.close()
    ingest.assert_stored(1)
    (batch,) = ingest.stored()
    assert batch.demonstration and batch.task_id == get_task("MetaWorld-push-v3").task_id
    assert collector.heartbeat.counters["demo_episodes"] == 2
    actions = np.frombuffer(next(c for c in batch.columns if c.name == "action").data, np.float32)
    assert np.abs(actions).max() <= 1.0  # the expert's actions, clipped to the action space
