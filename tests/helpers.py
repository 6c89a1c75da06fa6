"""Helpers that several test modules share (fixtures live in conftest.py).

core = make_core(); gradient = push(core, base_version=0)   # a small aggregator core, a valid push
procs = {r: start_role(r, config, logs, *role_args(cluster, acks)[r]) for r in roles}
stop_all(procs)                                             # real role processes, e2e tests
events = poll_until(dog, lambda ev: "restart" in ev)        # a Watchdog's events
heartbeat = RecordingHeartbeat()                            # a role's beats, kept in memory
"""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

import numpy as np

from aggregator.client import GradientPush
from aggregator.core import AggregatorCore
from fleet.launch.local_cluster import LocalRedisCluster
from fleet.launch.local_fleet import free_port
from fleet.launch.watchdog import Watchdog
from foundation.config import AggregatorConfig
from foundation.policy import GRADIENT_GROUPS, ModelSpec
from foundation.process import Heartbeat
from nets.models import norm_stats
from tests.conftest import wait_until

# --- an aggregator core and its pushes ------------------------------------------------------

SPEC = ModelSpec(obs_dim=3, goal_dim=2, act_dim=2, hidden_sizes=(8,))
CONFIG = AggregatorConfig(lr=1e-2, tau=0.1, checkpoint_every_versions=1000, keep_checkpoints=2)


def make_core() -> AggregatorCore:
    """A core of SPEC under CONFIG: one gradient per step, staleness up to 1."""
    return AggregatorCore(SPEC, CONFIG, grads_per_step=1, max_staleness=1)


def push(core: AggregatorCore, base_version: int, seed: int = 0) -> GradientPush:
    """A valid gradient push for `core` from learner 0, random (by `seed`) but well formed."""
    rng = np.random.default_rng(seed)
    return GradientPush(
        learner_id=0,
        base_version=base_version,
        grads={g: rng.normal(size=core.sizes[g]).astype(np.float32) for g in GRADIENT_GROUPS},
        norm_stats=norm_stats(rng.normal(size=(8, SPEC.input_dim))),
        batch_size=8,
        metrics={"loss/critic": 0.5},
    )


# --- real role processes (end-to-end tests) -------------------------------------------------

TASK = "FetchReach-v4"


def start_role(role: str, config: pathlib.Path, log_dir: pathlib.Path, *args: str) -> subprocess.Popen:
    """`fleetrl <role> --config CONFIG ARGS...` as a process, its output appended to <log_dir>/<role>.log."""
    with open(log_dir / f"{role}.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "fleet.cli.main", role, "--config", str(config), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def role_args(cluster: LocalRedisCluster, acks: pathlib.Path, run_dir: pathlib.Path | None = None) -> dict:
    """Each role's command-line arguments for a fleet on `cluster`, ack ledgers in `acks`."""
    buffer, aggregator = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    ledger = ("--ack-log", str(acks))
    return {
        "aggregator": ("--port", aggregator.split(":")[1], *(("--run-dir", str(run_dir)) if run_dir else ())),
        "buffer": ("--port", buffer.split(":")[1], "--redis", cluster.addresses),
        "sampler": ("--buffer", buffer, "--aggregator", aggregator, *ledger),
        "learner": ("--redis", cluster.addresses, "--aggregator", aggregator, *ledger),
    }


def stop_all(procs: dict) -> None:
    """SIGTERM every process still running, and wait for each."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


# --- the watchdog ---------------------------------------------------------------------------


def poll_until(dog: Watchdog, done: Callable[[list[str]], bool], timeout: float = 120.0) -> list[str]:
    """Poll the watchdog until `done(events so far)`; the events, in order."""
    events: list[str] = []

    def polled() -> bool:
        if done(events):
            return True
        events.extend(dog.poll())
        return False

    wait_until(polled, timeout, lambda: f"the watchdog; events so far: {events}", interval_sec=0.05)
    return events


# --- a role's heartbeat ---------------------------------------------------------------------


class RecordingHeartbeat(Heartbeat):
    """A Heartbeat (no file) that keeps every beat: the thread that beat and the counters it set.

    heartbeat = RecordingHeartbeat()
    run_learner(config, 0, endpoints, NO_SECURITY, stop, heartbeat)   # the code under test
    waits = heartbeat.values("flow_control_wait_sec")
    """

    def __init__(self) -> None:
        super().__init__(None)
        self.beats: list[tuple[threading.Thread, dict[str, float]]] = []

    def beat(self, force: bool = False, **counters: float) -> None:
        self.beats.append((threading.current_thread(), dict(counters)))
        super().beat(force, **counters)

    def values(self, counter: str) -> list[float]:
        """`counter` in every beat that set it, in order."""
        return [c[counter] for _, c in list(self.beats) if counter in c]

    def threads(self) -> set[threading.Thread]:
        return {thread for thread, _ in list(self.beats)}
