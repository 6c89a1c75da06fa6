"""Every role has one shape (foundation/role.py); one that fails while starting up reports that
first error and leaves nothing open.

Each test makes one step of a role's start fail (the fakes stand in for the peers it would
reach) and checks what a user would see: the original exception, no extra thread, every env,
client, writer and ledger closed.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import socket
import threading

import pytest

from foundation.acting import WeightsSnapshot
from foundation.config import RunConfig, with_overrides
from foundation.policy import ModelSpec
from foundation.process import Heartbeat
from foundation.transport import NO_SECURITY
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
        run_learner(
            config, 0, LearnerEndpoints("127.0.0.1:1", "127.0.0.1:2"), NO_SECURITY, threading.Event(), Heartbeat(None)
        )
    assert {t for t in _threads() - before if t.is_alive()} == set()  # the prefetch thread stopped
    assert closed.count("redis") == 1 and "aggregator" in closed


def test_a_sampler_failing_at_start_closes_the_envs_it_made(monkeypatch):
    import sampler.worker as worker
    from sampler.worker import SamplerEndpoints, run_sampler
    from sim.tasks import TaskSet

    closed: list[str] = []
    monkeypatch.setattr(TaskSet, "make_env", lambda self, i, *args, **kwargs: Closes(f"env-{i}", closed))

    def no_cpu(*args, **kwargs):
        raise RuntimeError("cannot pin")

    monkeypatch.setattr(worker, "harden", no_cpu)
    config = with_overrides(RunConfig(), ['sim.tasks=["FetchReach-v4", "FetchPush-v4"]'])
    with pytest.raises(RuntimeError, match="cannot pin"):
        run_sampler(
            config, 0, SamplerEndpoints("127.0.0.1:1", "127.0.0.1:2"), NO_SECURITY, threading.Event(), Heartbeat(None)
        )
    assert sorted(closed) == ["env-0", "env-1"]


def test_an_aggregator_that_cannot_bind_closes_its_tensorboard_writer(monkeypatch, tmp_path):
    import aggregator.service as service
    from aggregator.service import AggregatorEndpoints, run_aggregator

    closed: list[str] = []
    monkeypatch.setattr(service, "summary_writer", lambda run_dir, name: Closes("writer", closed))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = _threads()
        with pytest.raises(Exception, match=f"127.0.0.1:{port}"):  # the bind error names the address
            endpoints = AggregatorEndpoints(f"127.0.0.1:{port}", run_dir=str(tmp_path))
            run_aggregator(RunConfig(), 0, endpoints, NO_SECURITY, threading.Event(), Heartbeat(None))
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


ROLES = [
    ("sampler.worker", "run_sampler"),
    ("sampler.evaluator", "run_evaluator"),
    ("learner.worker", "run_learner"),
    ("aggregator.service", "run_aggregator"),
    ("buffer.service", "run_ingest_service"),
]


@pytest.mark.parametrize("module,name", ROLES, ids=[r[0] for r in ROLES])
def test_every_role_is_started_the_same_way(module, name):
    entry = getattr(importlib.import_module(module), name)
    params = list(inspect.signature(entry).parameters.values())
    kinds = [p.annotation for p in params]
    assert kinds[:2] == ["RunConfig", "int"] and kinds[2].endswith("Endpoints"), kinds
    assert kinds[3:] == ["Security", "threading.Event", "Heartbeat"], kinds
    assert all(p.default is inspect.Parameter.empty for p in params)  # nothing rebuilt from defaults
    assert inspect.signature(entry).return_annotation == "int"


def test_an_evaluator_that_cannot_reach_the_aggregator_closes_its_envs(monkeypatch):
    import sampler.evaluator as evaluator
    from sampler.evaluator import EvaluatorEndpoints, run_evaluator

    closed: list[str] = []
    monkeypatch.setattr(evaluator, "eval_envs", lambda tasks, config: [Closes("env-0", closed)])

    def unreachable(*args, **kwargs):
        raise ConnectionError("no aggregator at 127.0.0.1:2")

    monkeypatch.setattr(evaluator, "AggregatorClient", unreachable)
    config = with_overrides(RunConfig(), ["eval.nice=0"])  # this test process keeps its priority
    with pytest.raises(ConnectionError, match="no aggregator"):
        endpoints = EvaluatorEndpoints("127.0.0.1:1", "127.0.0.1:2")
        run_evaluator(config, 0, endpoints, NO_SECURITY, threading.Event(), Heartbeat(None))
    assert closed == ["env-0"]


def test_an_ingest_service_that_cannot_bind_closes_its_redis_client(monkeypatch):
    import buffer.service as service
    from buffer.service import IngestEndpoints, run_ingest_service

    closed: list[str] = []

    class Redis(Closes):
        def register_script(self, script):
            return None

    monkeypatch.setattr(service, "connect", lambda addresses, security: Redis("redis", closed))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = _threads()
        with pytest.raises(OSError, match=f"cannot bind 127.0.0.1:{port}"):
            endpoints = IngestEndpoints(f"127.0.0.1:{port}", "127.0.0.1:7000")
            run_ingest_service(RunConfig(), 0, endpoints, NO_SECURITY, threading.Event(), Heartbeat(None))
    assert closed == ["redis"]
    assert {t for t in _threads() - before if t.is_alive() and not t.daemon} == set()
