"""The watchdog with real child processes: restarts on exit and on silence, gives up, stops all."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from fleet.launch.watchdog import RoleFailed, RoleSpec, Watchdog
from tests.helpers import poll_until

REPO = Path(__file__).resolve().parents[1]
ENV = {"PYTHONPATH": str(REPO)}
SLEEPER = (sys.executable, "-c", "import time; time.sleep(60)")


def test_a_crashing_role_is_restarted_up_to_max_restarts_then_fails_naming_its_log(tmp_path):
    argv = (sys.executable, "-c", "print('crashing now', flush=True); import sys; sys.exit(3)")
    events_path = tmp_path / "events.jsonl"
    with Watchdog(tmp_path / "logs", stop_grace_sec=2, events_path=events_path) as dog:
        dog.start(RoleSpec("crasher", argv, max_restarts=2, backoff_first_sec=0.2))
        events: list[str] = []
        deadline = time.monotonic() + 120  # a bound against hanging, not a timing check
        with pytest.raises(RoleFailed) as err:
            while time.monotonic() < deadline:
                events += dog.poll()
                time.sleep(0.05)
        assert dog.restarts == 2
    assert events == [
        "crasher exited with code 3: restarted",  # the first failure: at once
        "crasher exited with code 3: restarting in 0.2s",  # again at once: after a backoff
        "crasher restarted after its backoff",
    ]
    recorded = [json.loads(line) for line in events_path.read_text().splitlines()]
    assert [r["event"] for r in recorded] == [*events, "crasher exited with code 3: restart budget spent"]
    assert all(r["role"] == "crasher" and r["time"] > 0 for r in recorded)
    log_path = tmp_path / "logs" / "crasher.log"
    assert "crasher exited with code 3 after 2 restarts" in str(err.value)
    assert str(log_path) in str(err.value)
    assert log_path.read_text().count("crashing now") == 3  # the first run and both restarts, appended


def test_a_role_with_a_stale_heartbeat_is_restarted_and_a_beating_one_is_not(tmp_path):
    hung_beat = tmp_path / "hung.json"
    live_beat = tmp_path / "live.json"
    beating = (
        sys.executable,
        "-c",
        "import time\nfrom foundation.process import Heartbeat\n"
        f"hb = Heartbeat({str(live_beat)!r}, interval_sec=0.1)\n"
        "while True:\n    hb.beat()\n    time.sleep(0.1)\n",
    )
    with Watchdog(tmp_path / "logs", stop_grace_sec=2) as dog:
        dog.start(RoleSpec("live", beating, heartbeat_path=str(live_beat), heartbeat_timeout_sec=1.0, env=ENV))
        deadline = time.monotonic() + 120  # a bound against hanging, not a timing check
        while not live_beat.exists():  # a slow interpreter start-up is not what this test is about
            assert time.monotonic() < deadline
            time.sleep(0.05)
        dog.start(RoleSpec("hung", SLEEPER, heartbeat_path=str(hung_beat), heartbeat_timeout_sec=1.0))
        first = dog.roles["hung"].proc
        live = dog.roles["live"].proc
        events = poll_until(dog, lambda e: len(e) >= 1)
        assert events == ["hung stopped sending heartbeats: restarted"]
        assert first.poll() is not None  # the hung process was terminated, not left behind
        assert dog.roles["hung"].proc.pid != first.pid
        assert dog.roles["hung"].restarts == 1
        time.sleep(0.5)
        assert dog.poll() == []  # the restarted role gets a fresh start-up grace
        assert dog.roles["live"].proc is live and dog.roles["live"].restarts == 0
        assert live.poll() is None and live_beat.exists()


def test_stop_all_terminates_sleeping_roles_and_kills_those_that_ignore_sigterm(tmp_path):
    stubborn = (
        sys.executable,
        "-c",
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
        "time.sleep(60)\n",
    )
    log_dir = tmp_path / "logs"
    dog = Watchdog(log_dir, stop_grace_sec=1.0)
    for i in range(2):
        dog.start(RoleSpec(f"sleeper-{i}", SLEEPER))
    dog.start(RoleSpec("stubborn", stubborn))
    deadline = time.monotonic() + 120  # a bound against hanging, not a timing check
    while "ready" not in (log_dir / "stubborn.log").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    start = time.monotonic()
    dog.stop_all()
    assert time.monotonic() - start < 5
    codes = {name: running.proc.poll() for name, running in dog.roles.items()}
    assert codes == {"sleeper-0": -signal.SIGTERM, "sleeper-1": -signal.SIGTERM, "stubborn": -signal.SIGKILL}
    assert sorted(os.listdir(log_dir)) == ["sleeper-0.log", "sleeper-1.log", "stubborn.log"]


def test_exiting_the_context_stops_every_role_and_names_are_unique(tmp_path):
    with Watchdog(tmp_path, stop_grace_sec=2) as dog:
        dog.start(RoleSpec("a", SLEEPER))
        with pytest.raises(ValueError, match="already started"):
            dog.start(RoleSpec("a", SLEEPER))
        proc = dog.roles["a"].proc
        assert dog.poll() == [] and proc.poll() is None
    assert proc.poll() == -signal.SIGTERM


def test_running_counts_the_roles_with_a_live_process(tmp_path):
    with Watchdog(tmp_path, stop_grace_sec=2) as dog:
        for name in ("a", "b", "c"):
            dog.start(RoleSpec(name, SLEEPER, max_restarts=0))
        assert dog.running() == 3
        dog.stop(["b"])  # exited, not yet restarted
        assert dog.running() == 2 and len(dog.roles) == 3


def test_role_env_and_output_reach_the_log(tmp_path):
    argv = (sys.executable, "-c", "import os, sys; print(os.environ['ROLE_X']); print('err', file=sys.stderr)")
    with Watchdog(tmp_path, stop_grace_sec=2) as dog:
        dog.start(RoleSpec("printer", argv, env={"ROLE_X": "hello-env"}, max_restarts=0))
        dog.roles["printer"].proc.wait(20)
    assert (tmp_path / "printer.log").read_text().split() == ["hello-env", "err"]


def test_the_restart_budget_refills_over_time_so_rare_failures_never_end_a_long_run(tmp_path):
    argv = (sys.executable, "-c", "import sys; sys.exit(1)")
    spec = RoleSpec("flaky", argv, max_restarts=1, restart_refill_sec=0.5, backoff_first_sec=0.1, backoff_max_sec=0.2)
    with Watchdog(tmp_path / "logs", stop_grace_sec=2) as dog:
        dog.start(spec)
        for _ in range(4):  # four failures, each after the budget had time to refill
            before = dog.roles["flaky"].restarts
            poll_until(dog, lambda e, n=before: dog.roles["flaky"].restarts > n)
            time.sleep(0.6)
        assert dog.roles["flaky"].restarts >= 4


def test_children_started_beside_busy_grpc_threads_run_no_fork_handlers(tmp_path, capfd):
    """The supervisor (LocalFleet, the aggregator's host) has live gRPC threads. A child must not
    fork the interpreter and run gRPC's fork handlers before exec: they crashed children or
    wrote "epoll_wait error" lines into their logs (once in ~40 starts). Every fork that runs
    them beside a busy channel says so on stderr, so that line's absence is the check."""
    import threading
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    done = threading.Event()

    def busy() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while not done.is_set():
                stub.Check(health_pb2.HealthCheckRequest(), timeout=5)

    threads = [threading.Thread(target=busy, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    argv = (sys.executable, "-c", "print('ok')")
    try:
        time.sleep(0.2)  # the channels are busy
        for i in range(10):
            with Watchdog(tmp_path / str(i), stop_grace_sec=2) as dog:
                dog.start(RoleSpec("printer", argv, max_restarts=0))
                dog.roles["printer"].proc.wait(20)
            assert (tmp_path / str(i) / "printer.log").read_text() == "ok\n"
    finally:
        done.set()
        for thread in threads:
            thread.join(10)
        server.stop(None)
    assert "fork" not in capfd.readouterr().err


def test_a_role_that_died_waits_for_restart_when_or_its_longest_wait(tmp_path):
    allowed = []
    quits = (sys.executable, "-c", "pass")
    with Watchdog(tmp_path / "logs", stop_grace_sec=2) as dog:
        dog.start(RoleSpec("waits", quits, restart_when=lambda: bool(allowed), restart_wait_max_sec=60))
        dog.start(RoleSpec("capped", quits, restart_when=lambda: False, restart_wait_max_sec=0.5))
        dog.roles["waits"].proc.wait()
        dog.roles["capped"].proc.wait()
        assert sorted(dog.poll()) == [
            "capped exited with code 0: restarting once it may (restart_when)",
            "waits exited with code 0: restarting once it may (restart_when)",
        ]
        time.sleep(0.6)
        assert dog.poll() == ["capped restarted after its backoff"]  # its longest wait is over
        allowed.append(True)
        assert dog.poll() == ["waits restarted after its backoff"]
        assert dog.restarts == 2
