"""The fault injector's choices and its idea of recovery (fleet/chaos/faults.py), with fake processes."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass, field
from typing import Any, cast

from fleet.chaos.faults import REDIS_PRIMARY, Fault, Injector, Watch, fault_menu
from fleet.launch.watchdog import Watchdog

ROLES = ["aggregator", "buffer", "evaluator-0", "learner-0", "sampler-0", "sampler-1", "redis-7000", "redis-7001"]


def test_the_menu_kills_and_stops_every_role_and_kills_a_redis_primary_only_with_replicas():
    menu = fault_menu(ROLES, redis_replicas=1)
    assert Fault("SIGKILL", REDIS_PRIMARY) in menu
    assert {f.target for f in menu} == {*ROLES[:6], REDIS_PRIMARY}
    assert sum(f.kind == "SIGSTOP" for f in menu) == 6  # every role but Redis, and no Redis node stopped
    assert Fault("SIGKILL", REDIS_PRIMARY) not in fault_menu(ROLES, redis_replicas=0)


def beat(pid: int, t: float, **counters: float) -> dict:
    return {"pid": pid, "time": t, "counters": counters}


def test_a_killed_role_recovers_once_its_replacement_shows_work():
    watch = Watch("sampler-0", since=10.0, base_pid=1, base=500.0, needs_new_pid=True)
    watch.see(beat(1, 11.0, acked_env_steps=550))  # the old process's last beat, written late: not it
    watch.see(beat(2, 12.0, acked_env_steps=0))  # the replacement, before its first ack
    assert not watch.moved
    watch.see(beat(2, 14.0, acked_env_steps=50))
    assert watch.moved


def test_a_stopped_role_recovers_once_its_counter_moves_after_sigcont():
    watch = Watch("aggregator", since=10.0, base_pid=1, base=300.0)
    watch.see(beat(1, 9.0, version=301))  # before SIGCONT
    watch.see(beat(1, 10.5, version=300))
    assert not watch.moved
    watch.see(beat(1, 11.0, version=302))
    assert watch.moved


def test_a_role_without_a_progress_counter_recovers_by_beating_again():
    watch = Watch("evaluator-0", since=10.0, base_pid=1, base=None, needs_new_pid=True)
    watch.see(beat(1, 11.0))
    assert not watch.moved
    watch.see(beat(2, 11.0))
    assert watch.moved


@dataclass
class FakeProc:
    code: int | None = None  # None: running

    def poll(self) -> int | None:
        return self.code


@dataclass
class FakeRole:
    restarts: int = 0
    restart_at: float | None = None  # awaiting a restart
    proc: FakeProc = field(default_factory=FakeProc)


@dataclass
class FakeDog:
    roles: dict[str, FakeRole] = field(default_factory=lambda: {r: FakeRole() for r in ROLES[:6]})

    def pids(self) -> dict[str, int]:
        return {name: 100 + i for i, name in enumerate(self.roles)}


def test_the_injector_stops_a_role_continues_it_and_times_its_recovery(tmp_path):
    sent: list[tuple[int, int]] = []
    (tmp_path / "heartbeats").mkdir()

    def write(role: str, pid: int, **counters: Any) -> None:
        (tmp_path / "heartbeats" / f"{role}.json").write_text(json.dumps(beat(pid, time.time(), **counters)))

    dog = cast(Watchdog, FakeDog())
    injector = Injector(tmp_path, every_sec=3600, seed=0, stop_sec=0.2, kill=lambda pid, sig: sent.append((pid, sig)))
    write("learner-0", 103, pushed=7)
    record = injector.inject(dog, None, Fault("SIGSTOP", "learner-0"))  # type: ignore[arg-type]
    assert sent == [(103, signal.SIGSTOP)] and record.target == "learner-0"
    time.sleep(0.3)
    injector.tick(dog, None)  # type: ignore[arg-type]
    assert sent[-1] == (103, signal.SIGCONT) and record.recovered_sec is None
    write("learner-0", 103, pushed=8)
    injector.tick(dog, None)  # type: ignore[arg-type]
    assert record.recovered_sec is not None and record.recovered_sec >= 0.2


def test_faults_are_picked_by_the_seed():
    def picks(seed: int) -> list[Fault]:
        injector = Injector("/nonexistent", every_sec=1, seed=seed)
        return [injector.rng.choice(fault_menu(ROLES, 1)) for _ in range(8)]

    assert picks(3) == picks(3) != picks(4)


def test_a_role_that_is_down_is_never_signalled(tmp_path):
    """A dead role's pid may belong to another process by now: no fault, and no SIGCONT, goes to it."""
    sent: list[tuple[int, int]] = []
    fake = FakeDog()
    dog = cast(Watchdog, fake)
    injector = Injector(tmp_path, every_sec=3600, seed=0, stop_sec=0.0, kill=lambda pid, sig: sent.append((pid, sig)))
    fake.roles["sampler-1"].restart_at = time.monotonic() + 5  # waiting out a backoff
    fake.roles["buffer"].proc.code = -9  # exited, not yet seen by the watchdog
    assert injector.inject(dog, None, Fault("SIGKILL", "sampler-1")) is None  # type: ignore[arg-type]
    assert injector.inject(dog, None, Fault("SIGSTOP", "buffer")) is None  # type: ignore[arg-type]
    record = injector.inject(dog, None, Fault("SIGSTOP", "aggregator"))  # type: ignore[arg-type]
    assert record is not None and sent == [(100, signal.SIGSTOP)]
    fake.roles["aggregator"].proc.code = -15  # the watchdog replaced it while it was stopped
    injector.tick(dog, None)  # type: ignore[arg-type]
    assert sent == [(100, signal.SIGSTOP)] and record.detail == {"replaced_while_stopped": True}
    sent.clear()
    picker = Injector(tmp_path, every_sec=1e-9, first_sec=0.0, seed=0, kill=lambda pid, sig: sent.append((pid, sig)))
    for _ in range(50):  # a fault every tick, picked only among the roles that are up
        picker.tick(dog, None)  # type: ignore[arg-type]
    assert len(sent) >= 50 and {pid for pid, _ in sent} <= {102, 103, 104}  # evaluator-0, learner-0, sampler-0
