"""Shared fixtures, and the test tiers (tests/tiers.py). One real Redis Cluster serves the
whole test session.

    def test_something(redis_client):          # flushed cluster, fresh RedisCluster client
        redis_client.set("{run}:x", 1)

    def test_other(clean_redis_cluster):       # flushed cluster, for its .addresses
        run_role(clean_redis_cluster.addresses)

A test that needs a cluster of its own (to kill it, say) starts a LocalRedisCluster itself.

One way to wait for something, everywhere (a bound against hanging, not a timing check):

    count = wait_until(lambda: ledger_rows() > 10, 180, "ten acked batches", procs)
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeVar

import mujoco  # noqa: F401 - its first import probes GLFW's version in a child process: here, before the purity guard
import numpy as np
import pytest
from redis.cluster import RedisCluster

from fleet.launch.local_cluster import LocalRedisCluster
from foundation.wire import Transitions, TransitionSchema
from tests.tiers import (  # noqa: F401 - pytest finds its hooks here: tiers as markers, the purity guard
    pytest_collection_modifyitems,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
    pytest_terminal_summary,
)

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T],
    timeout_sec: float = 10.0,
    what: str | Callable[[], str] = "the condition",
    procs: Mapping[str, subprocess.Popen] | Iterable[tuple[str, subprocess.Popen]] = (),
    interval_sec: float = 0.25,
) -> T:
    """The first truthy value of `condition()`, polled every `interval_sec`.

    AssertionError naming `what` (a string, or a function giving one: a log tail, say) after
    `timeout_sec`, or as soon as one of `procs` (name -> process) has exited: a role that died
    fails the test at once, not at the timeout.
    """
    watched = dict(procs)
    deadline = time.monotonic() + timeout_sec
    while True:
        for name, proc in watched.items():
            assert proc.poll() is None, f"{name} exited with {proc.returncode}"
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout_sec}s waiting for {described}")
        time.sleep(interval_sec)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """A 3-primary LocalRedisCluster for the whole session; tests flush it, never close it."""
    with LocalRedisCluster(num_primaries=3) as cluster:
        yield cluster


def flush_redis(cluster: LocalRedisCluster) -> None:
    """Drop every key on every node (between tests)."""
    cluster.flush()


@pytest.fixture
def clean_redis_cluster(redis_cluster: LocalRedisCluster) -> LocalRedisCluster:
    """The session cluster, flushed before the test."""
    flush_redis(redis_cluster)
    return redis_cluster


@pytest.fixture
def redis_client(clean_redis_cluster: LocalRedisCluster) -> Iterator[RedisCluster]:
    """A client of the freshly flushed session cluster, closed after the test."""
    client = clean_redis_cluster.client()
    yield client
    client.close()


SMALL_SCHEMA = TransitionSchema(obs_dim=3, goal_dim=2, act_dim=2)


@pytest.fixture
def make_transitions() -> Callable[..., Transitions]:
    """make_transitions(n, first_id=0, schema=SMALL_SCHEMA): rows whose values identify them.

    Row i has reward == first_id + i (its id); every other value is derived from the id, so a
    row read back can be checked against what was written (actions squashed into [-1, 1]).
    """

    def make(n: int, first_id: int = 0, schema: TransitionSchema = SMALL_SCHEMA) -> Transitions:
        ids = np.arange(first_id, first_id + n, dtype=np.float32)

        def block(dim: int, offset: float) -> np.ndarray:
            return (ids[:, None] + offset + np.arange(dim, dtype=np.float32) / 8).astype(np.float32)

        return Transitions(
            obs=block(schema.obs_dim, 0.25),
            goal=block(schema.goal_dim, 0.5),
            action=np.tanh(block(schema.act_dim, 0.75) / 1000).astype(np.float32),  # actions lie in [-1, 1]
            reward=ids.copy(),
            next_obs=block(schema.obs_dim, 1.25),
            done=(ids % 2).astype(np.float32),
        )

    return make
