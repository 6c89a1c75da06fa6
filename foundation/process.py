"""Process glue shared by every role process: stop signals, ready files, heartbeats, timers,
and how a parent starts and stops its children (parent-death signal, terminate-then-kill).

Kept apart from the math (Sample Factory's learner_worker.py vs learner.py split).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from contextlib import contextmanager

PR_SET_PDEATHSIG = 1
_metrics = None  # this process's RoleMetrics, when it serves Prometheus metrics (see use_metrics)


def locked_kib(pid: int | str = "self") -> int:
    """Memory a process has pinned (resident and locked), in KiB; 0 if it cannot be read.
    smaps_rollup: one summary line per field, not a pass over every mapping."""
    for name in ("smaps_rollup", "smaps"):
        try:
            with open(f"/proc/{pid}/{name}") as f:
                return sum(int(line.split()[1]) for line in f if line.startswith("Locked:"))
        except OSError:
            continue
    return 0


def use_metrics(metrics) -> None:
    """Publish every heartbeat of this process as Prometheus metrics."""
    global _metrics
    _metrics = metrics


def setup_logging(role: str) -> logging.Logger:
    logging.basicConfig(
        level=os.environ.get("FLEETRL_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s {role} %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    return logging.getLogger(f"fleetrl.{role}")


HANDED_OUT_PORTS: set[int] = set()  # ports this process chose for a child to bind later


def free_port(host: str = "127.0.0.1") -> int:
    """A port of `host` free now and never handed out before by this process: ports are chosen
    up front and bound later (by a child), so two children must not be given the same one."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in HANDED_OUT_PORTS:
            HANDED_OUT_PORTS.add(port)
            return port


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies (no orphans after a crash)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def parent_death_prefix() -> list[str]:
    """An argv prefix that makes the child get SIGTERM when this process dies (Linux only):
    util-linux's `setpriv --pdeathsig TERM --`, which sets the signal and execs the command
    (same pid). [] where setpriv is missing.

    Not a preexec_fn: that makes subprocess fork the whole interpreter and run Python in the
    child before exec, and in a process with live gRPC threads the child then runs gRPC's
    fork handlers, which can crash it or write their errors into its log. Without preexec_fn,
    subprocess starts the child with vfork/posix_spawn, which runs no fork handlers.
    Linux ties PR_SET_PDEATHSIG to the thread that forked: start children from a thread that
    lives as long as they do (the main thread, in practice)."""
    if not sys.platform.startswith("linux"):
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


def terminate(procs: list[subprocess.Popen], grace_sec: float) -> None:
    """SIGTERM (and SIGCONT: a stopped child handles it too) every child at once, wait up to
    `grace_sec` for all, SIGKILL what is left."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + grace_sec
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_event() -> threading.Event:
    """An Event set by SIGTERM or SIGINT: role loops poll it and shut down cleanly."""
    event = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: event.set())
    return event


def write_ready_file(path: str | os.PathLike | None, address: str) -> None:
    """Atomically publish a bound address; launchers poll for the file."""
    if not path:
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(address)
    os.replace(tmp, path)


class Heartbeat:
    """Writes {time, phase timers, counters} to a JSON file every `interval_sec`.

    The local watchdog restarts a role whose heartbeat goes stale; operators read the
    per-phase timers to see where a role spends its time.
    """

    def __init__(self, path: str | os.PathLike | None, interval_sec: float = 2.0) -> None:
        self.path = pathlib.Path(path) if path else None
        self.interval_sec = interval_sec
        self.phase_sec: dict[str, float] = defaultdict(float)
        self.counters: dict[str, float] = {}
        self._last = 0.0

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.phase_sec[name] += time.perf_counter() - start

    def beat(self, force: bool = False, **counters: float) -> None:
        self.counters.update(counters)
        now = time.time()
        if (self.path is None and _metrics is None) or (not force and now - self._last < self.interval_sec):
            return
        self._last = now
        if _metrics is not None:
            _metrics.update(self.phase_sec, self.counters)
        if self.path is None:
            return
        payload = {"time": now, "pid": os.getpid(), "phase_sec": self.phase_sec, "counters": self.counters}
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(payload))
        os.replace(tmp, self.path)

    def close(self, **counters: float) -> None:
        """The last beat, written whatever the interval: a stopped role's file then holds its
        final counters (the run's summary and tests compare counters across roles)."""
        self.beat(force=True, **counters)


def heartbeat_file(run_dir: str | os.PathLike, name: str) -> str:
    """Where role `name` of a run writes its heartbeat."""
    path = pathlib.Path(run_dir) / "heartbeats"
    path.mkdir(parents=True, exist_ok=True)
    return str(path / f"{name}.json")
