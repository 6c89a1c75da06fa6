"""The test tiers, and the guard that keeps the pure ones pure (hooks wired in tests/conftest.py).

    python -m pytest -m fast          # pure logic with fakes: no Redis, no process, no network
    python -m pytest -m "not e2e"     # + slow pure tests and integration tests
    python -m pytest                  # + end-to-end fleets: what CI runs (.ci/run)

Every test gets one tier marker at collection:

    e2e          set by the test module: a real fleet of role processes
    integration  uses a service fixture (SERVICE_FIXTURES, or one built on it), or is listed
                 in INTEGRATION: it starts a process, a server or a connection itself
    slow         pure, but seconds each (real simulators, short trainings, ONNX exports): SLOW
    fast         everything else

A fast or slow test that starts a process, connects to Redis or over TCP, or makes a gRPC
server or channel fails, naming what it did and where to list it. The guard is on in every
run that holds such tests, the full suite included.
"""

from __future__ import annotations

import multiprocessing.process
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from unittest import mock

import grpc
import grpc.aio
import pytest
import redis.connection

from tests.tier_lists import INTEGRATION, SLOW

PURE = ("slow", "fast")
SERVICE_FIXTURES = frozenset({"redis_cluster"})  # item.fixturenames holds every fixture a test pulls in
BROKEN = pytest.StashKey[list[str]]()
FAST_BUDGET_SEC = 10.0  # one fast test's call: a few seconds at most, even on a busy 2-core machine


def tier_of(item: pytest.Item) -> str:
    """The tier of one collected test (see the module docstring)."""
    if item.get_closest_marker("e2e"):
        return "e2e"
    module = item.path.name
    name = getattr(item, "originalname", item.name)  # a parametrized test: its function's name
    if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())) or _listed(INTEGRATION, module, name):
        return "integration"
    return "slow" if _listed(SLOW, module, name) else "fast"


def _listed(table: dict[str, tuple[str, ...]], module: str, name: str) -> bool:
    names = table.get(module, ())
    return "*" in names or name in names


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        if tier != "e2e":
            item.add_marker(tier)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Setup, call and teardown of a pure test (fixtures of every scope included) under the guard."""
    if not any(item.get_closest_marker(tier) for tier in PURE):
        yield
        return
    broken = item.stash.setdefault(BROKEN, [])
    with guard(item.nodeid, broken.append):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A pure test that reached out fails, even where the code under test caught the refusal."""
    outcome = yield
    report = outcome.get_result()
    broken = item.stash.get(BROKEN, [])
    reached, broken[:] = list(broken), []  # each phase reports what it did, once
    if reached and report.passed:
        report.outcome = "failed"
        report.longrepr = "\n".join(reached)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Fast tests over FAST_BUDGET_SEC, listed at the end of the run: candidates for SLOW."""
    reports = terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", [])
    over = [r for r in reports if r.when == "call" and "fast" in r.keywords and r.duration > FAST_BUDGET_SEC]
    if over:
        terminalreporter.section(f"fast tests over {FAST_BUDGET_SEC:g} s: list them in tests/tier_lists.py SLOW")
        for report in sorted(over, key=lambda r: -r.duration):
            terminalreporter.line(f"{report.duration:6.1f}s {report.nodeid}")


class TierViolation(BaseException):
    """Raised where a pure test reaches out (a BaseException: `except Exception` lets it through)."""


def guard(nodeid: str, record: Callable[[str], None]) -> ExitStack:
    """Patches that refuse every way out of the process, while the stack is open, to the test's
    own threads (a thread an earlier test left running is not this test's doing: it passes)."""
    leftovers = {t.ident for t in threading.enumerate()} - {threading.main_thread().ident}

    def refuse(what: str, original: Callable[..., object]) -> Callable[..., object]:
        def refused(*args: object, **kwargs: object) -> object:
            if threading.get_ident() in leftovers:
                return original(*args, **kwargs)
            message = (
                f"{nodeid} {what}, but it is in a pure tier (fast or slow): a test that starts a process or "
                f"reaches a service is an integration test: list it in tests/tier_lists.py INTEGRATION"
            )
            record(message)
            raise TierViolation(message)

        return refused

    def refuse_tcp(original: Callable[..., object]) -> Callable[..., object]:
        refused = refuse("connects over TCP", original)

        def connect(self: socket.socket, address: object) -> object:
            if self.family in (socket.AF_INET, socket.AF_INET6):
                return refused(self, address)
            return original(self, address)

        return connect

    refusals = [
        (subprocess.Popen, "__init__", "starts a subprocess"),
        (os, "fork", "forks"),
        (multiprocessing.process.BaseProcess, "start", "starts a multiprocessing process"),
        (redis.connection.AbstractConnection, "connect", "connects to Redis"),
        (grpc, "server", "makes a gRPC server"),
        (grpc.aio, "server", "makes a gRPC server"),
        (grpc, "insecure_channel", "opens a gRPC channel"),
        (grpc, "secure_channel", "opens a gRPC channel"),
        (grpc.aio, "insecure_channel", "opens a gRPC channel"),
        (grpc.aio, "secure_channel", "opens a gRPC channel"),
    ]
    stack = ExitStack()
    for owner, name, what in refusals:
        stack.enter_context(mock.patch.object(owner, name, refuse(what, getattr(owner, name))))
    for name in ("connect", "connect_ex"):
        stack.enter_context(mock.patch.object(socket.socket, name, refuse_tcp(getattr(socket.socket, name))))
    return stack
