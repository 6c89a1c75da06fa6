"""A role that fails while starting up reports that first error and leaves nothing open.

Each test makes one step of a role's start fail (the fakes stand in for the peers it would
reach) and checks what a user would see: the original exception, no extra thread, every env,
client, writer and ledger closed.
"""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest

from foundation.acting import WeightsSnapshot
from foundation.config import RunConfig, with_overrides
from foundation.policy import ModelSpec
from tests.fakes import FakeBatchSource
from tests.helpers import CONFIG, make_core


class Closes:
    """Records close() calls under a name, into a shared list."""

    def __init__(self, name: str, closed: list[str]) -> None:
        self.name, self.closed = name, closed

    def close(self) -> None:
        self.closed.append(self.name)


def _threads() -> set[threading.Thread]:
    return set(threading.enumerate())


def test_a_learner_failing_to_start_its_loop_reports_that_error_and_stops_its_prefetch_thread(monkeypatch):
    import learner.worker as worker
    from learner.worker import LearnerEndpoints, run_learner

    closed: list[str] = []
    spec = ModelSpec(obs_dim=10, goal_dim=3, act_dim=4, hidden_sizes=(8,))
    snapshot = WeightsSnapshot(0, {}, spec)

    class Watch:
        shared_memory = False

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            closed.append("watch")

        def wait_newer_than(self, version, timeout=None):
            return snapshot

    class Aggregator:
        incarnation = 1

        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            closed.append("aggregator")

        def watch(self, *args, **kwargs):
            return Watch()

    class Replay(FakeBatchSource):
        def size(self) -> int:
            return 10**6

        def try_refresh(self) -> None:
            pass

    def broken_loop(*args, **kwargs):
        raise ValueError("the loop could not be built")

    monkeypatch.setattr(worker, "connect", lambda addresses, security: Closes("redis", closed))
    monkeypatch.setattr(worker, "AggregatorClient", Aggregator)
    monkeypatch.setattr(worker, "ReplaySampler", lambda *args, **kwargs: Replay())
    monkeypatch.setattr(worker, "_GradientLoop", broken_loop)
    config = with_overrides(RunConfig(), ["learner.prefetch=true", 'learner.device="cpu"'])
    before = _threads()
    with pytest.raises(ValueError, match="the loop could not be built"):  # not an error of the cleanup
        run_learner(config, 0, LearnerEndpoints("127.0.0.1:1", "127.0.0.1:2"), threading.Event())
    assert {t for t in _threads() - before if t.is_alive()} == set()  # the prefetch thread stopped
    assert closed.count("redis") == 1 and "aggregator" in closed


def test_a_sampler_failing_at_start_closes_the_envs_it_made(monkeypatch):
    import sampler.worker as worker
    from sampler.worker import SamplerEndpoints, run_sampler
    from sim.tasks import TaskSet

    closed: list[str] = []
    monkeypatch.setattr(TaskSet, "make_env", lambda self, i, *args: Closes(f"env-{i}", closed))

    def no_cpu(*args, **kwargs):
        raise RuntimeError("cannot pin")

    monkeypatch.setattr(worker, "harden", no_cpu)
    config = with_overrides(RunConfig(), ['sim.tasks=["FetchReach-v4", "FetchPush-v4"]'])
    with pytest.raises(RuntimeError, match="cannot pin"):
        run_sampler(config, 0, SamplerEndpoints("127.0.0.1:1", "127.0.0.1:2"), threading.Event())
    assert sorted(closed) == ["env-0", "env-1"]


def test_an_aggregator_that_cannot_bind_closes_its_tensorboard_writer(monkeypatch, tmp_path):
    import aggregator.service as service
    from aggregator.service import run_aggregator

    closed: list[str] = []
    monkeypatch.setattr(service, "summary_writer", lambda run_dir, name: Closes("writer", closed))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = _threads()
        with pytest.raises(Exception, match=f"127.0.0.1:{port}"):  # the bind error names the address
            run_aggregator(RunConfig(), f"127.0.0.1:{port}", str(tmp_path), None, threading.Event())
    assert closed == ["writer"]
    lingering = {t for t in _threads() - before if t.is_alive() and not t.daemon}
    assert lingering == set()


def test_the_aggregator_server_leaves_no_thread_when_it_cannot_bind(tmp_path):
    from aggregator.service import AggregatorServer

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = _threads()
        with contextlib.suppress(Exception), AggregatorServer(make_core(), CONFIG, tmp_path, port=port):
            pytest.fail("bound a port already taken")
    assert {t.name for t in _threads() - before if t.is_alive() and t.name == "aggregator-grpc"} == set()
