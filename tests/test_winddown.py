"""The order in which a fleet host winds down (fleet/launch/winddown.py wind_down), with fakes that log
every call: workers first, the aggregator's host's summary after its last checkpoint, buffer and
Redis hosts waiting for it, and a signalled host leaving at once. The real thing over two Slurm
nodes: tests/test_slurm.py."""

from __future__ import annotations

import pathlib
import threading
from types import SimpleNamespace

import pytest

from fleet.launch.spec import parse_spec
from fleet.launch.winddown import watch, wind_down

SPEC = parse_spec(
    {
        "hosts": {
            "services": {"address": "10.0.0.1", "redis": [7000, 7001, 7002], "buffer": 50051, "aggregator": 50052},
            "sim": {"address": "10.0.0.2", "sampler": 1, "learner": 1, "evaluator": 1},
        }
    }
)
STAGE = {"sampler-0": 0, "learner-0": 0, "evaluator-0": 0, "aggregator": 1, "buffer": 2, "redis-7000": 3}


class Calls(list):
    def record(self, *call: object) -> None:
        self.append(call)


class FakeDog:
    def __init__(self, calls: Calls, names: list[str]) -> None:
        self.calls, self.restarts = calls, 0
        self.roles = {n: SimpleNamespace(spec=SimpleNamespace(stage=STAGE[n])) for n in names}

    def stop(self, names: list[str]) -> None:
        self.calls.record("stop", tuple(sorted(names)))

    def stop_in_order(self) -> None:
        self.calls.record("stop_in_order")

    def poll(self) -> list[str]:
        return []


class FakeBoard:
    """Answers as a live board would once every host has done its part."""

    def __init__(self, calls: Calls, finished: bool | None = True, reason: str | None = None) -> None:
        self.calls, self._finished, self._reason = calls, finished, reason

    def reason(self) -> str | None:
        return self._reason

    def request(self, reason: str) -> None:
        self.calls.record("request", reason)

    def workers_stopped(self, host: str) -> None:
        self.calls.record("workers_stopped", host)

    def hosts_with_workers_stopped(self) -> set[str]:
        return {"sim"}

    def finish(self) -> None:
        self.calls.record("finish")

    def finished(self) -> bool | None:
        self.calls.record("finished?")
        return self._finished


class FakeJudge:
    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    def read(self, dog: FakeDog, services: bool = True) -> None:
        self.calls.record("read", services)

    def summarize(self, reason: str, restarts: int, host_dir: pathlib.Path, score: bool) -> SimpleNamespace:
        self.calls.record("summarize", reason, score)
        return SimpleNamespace(stop_reason=reason)


def _host(name: str) -> SimpleNamespace:
    return SimpleNamespace(
        host=SPEC.host(name), spec=SPEC, stop=threading.Event(), host_dir=pathlib.Path("h"), run_dir=pathlib.Path("r")
    )


SERVICES = ["aggregator", "buffer", "redis-7000"]
WORKERS = ["sampler-0", "learner-0", "evaluator-0"]


def test_the_aggregator_s_host_writes_the_summary_after_every_worker_and_its_last_checkpoint() -> None:
    calls = Calls()
    wind_down(_host("services"), FakeDog(calls, SERVICES), FakeBoard(calls), FakeJudge(calls), "max_wall_sec reached")
    assert calls == [
        ("read", False),  # this host's CPU, before its roles stop
        ("stop", ()),  # this host has no workers
        ("workers_stopped", "services"),
        ("read", True),  # the services once more: every acked push, the last version
        ("stop", ("aggregator", "buffer")),  # the last checkpoint
        ("finish",),  # the buffer and Redis hosts may go
        ("summarize", "max_wall_sec reached", True),  # short of the target: the final score too
        ("stop_in_order",),  # its Redis nodes last
    ]


def test_a_signal_on_the_aggregator_s_host_stops_the_fleet_and_writes_a_summary_first() -> None:
    calls = Calls()
    wind_down(_host("services"), FakeDog(calls, SERVICES), FakeBoard(calls), FakeJudge(calls), None)
    assert calls[:3] == [
        ("read", False),
        ("request", "SIGTERM or Ctrl-C on services, the aggregator's host"),
        ("summarize", "interrupted (Ctrl-C or SIGTERM)", False),  # before KillWait can run out
    ]
    assert calls[-3:] == [("finish",), ("summarize", "interrupted (Ctrl-C or SIGTERM)", False), ("stop_in_order",)]


@pytest.mark.parametrize(
    ("host", "roles", "signalled", "waits"),
    [
        ("sim", WORKERS, False, False),  # only workers: nothing to keep up for anyone
        ("services", ["buffer", "redis-7000"], False, True),  # keeps buffer and Redis until done
        ("services", ["buffer", "redis-7000"], True, False),  # signalled itself: leaves at once
    ],
)
def test_other_hosts_stop_their_workers_and_keep_buffer_and_redis_until_the_aggregator_s_host_is_done(
    host: str, roles: list[str], signalled: bool, waits: bool
) -> None:
    calls = Calls()
    wind_down(_host(host), FakeDog(calls, roles), FakeBoard(calls), None, None if signalled else "target reached")
    workers = tuple(sorted(r for r in roles if STAGE[r] == 0))
    expected = [("stop", workers), ("workers_stopped", host), *([("finished?",)] if waits else []), ("stop_in_order",)]
    assert calls == expected


class Deciding(FakeJudge):
    """Says "target reached" at its third look; sets `stop` (a signal) at its sixth."""

    def __init__(self, calls: Calls, stop: threading.Event) -> None:
        super().__init__(calls)
        self.looks, self.stop = 0, stop

    def check(self, dog: FakeDog) -> str | None:
        self.looks += 1
        if self.looks >= 6:
            self.stop.set()
        return "target reached" if self.looks >= 3 else None


@pytest.mark.parametrize(("until_signal", "ends"), [(False, "target reached"), (True, None)])
def test_the_aggregator_s_host_decides_unless_told_to_run_until_signalled(until_signal: bool, ends: str | None) -> None:
    calls, host = Calls(), _host("services")
    judge = Deciding(calls, host.stop)
    assert watch(host, FakeDog(calls, SERVICES), FakeBoard(calls), judge, until_signal) == ends
    assert calls == ([] if until_signal else [("request", "target reached")])
    assert judge.looks == (6 if until_signal else 3)


def test_other_hosts_stop_when_the_board_says_so() -> None:
    calls, host = Calls(), _host("sim")
    board = FakeBoard(calls, reason="max_wall_sec 600 reached")
    assert watch(host, FakeDog(calls, WORKERS), board, None) == "max_wall_sec 600 reached"
