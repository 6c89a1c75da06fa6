"""The watchdog: starts role processes, restarts the ones that die or hang, stops them all.

    with Watchdog(log_dir) as dog:
        dog.start(RoleSpec("aggregator", argv, heartbeat_path=...))
        while running:
            events = dog.poll()          # restarts crashed or silent roles, returns what it did
        # __exit__ stops every role: SIGTERM, then SIGKILL after `stop_grace_sec`

Each role runs as its own OS process (`python -m fleetrl.cli <role> ...`) with its output in
`<log_dir>/<name>.log`, and dies with the watchdog (PR_SET_PDEATHSIG) if the watchdog crashes.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import signal
import subprocess
import time
from dataclasses import dataclass, field

from fleetrl.process import die_with_parent

log = logging.getLogger("fleetrl.watchdog")


@dataclass(frozen=True)
class RoleSpec:
    name: str  # unique: "sampler-0", "aggregator", ...
    argv: tuple[str, ...]
    heartbeat_path: str | None = None
    heartbeat_timeout_sec: float = 60.0  # a role silent this long is taken as hung and restarted
    max_restarts: int = 3
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class _Running:
    spec: RoleSpec
    proc: subprocess.Popen
    started: float
    restarts: int = 0


class RoleFailed(RuntimeError):
    """A role kept dying past its restart budget."""


class Watchdog:
    def __init__(self, log_dir: str | os.PathLike, stop_grace_sec: float = 10.0) -> None:
        self.log_dir = pathlib.Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.stop_grace_sec = stop_grace_sec
        self.roles: dict[str, _Running] = {}

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    @property
    def restarts(self) -> int:
        return sum(r.restarts for r in self.roles.values())

    def pids(self) -> dict[str, int]:
        """The current pid of every role (CPU accounting)."""
        return {name: running.proc.pid for name, running in self.roles.items()}

    def start(self, spec: RoleSpec) -> None:
        if spec.name in self.roles:
            raise ValueError(f"role {spec.name!r} already started")
        self.roles[spec.name] = _Running(spec, self._spawn(spec), time.monotonic())

    def _spawn(self, spec: RoleSpec) -> subprocess.Popen:
        if spec.heartbeat_path:
            pathlib.Path(spec.heartbeat_path).unlink(missing_ok=True)
        out = open(self.log_dir / f"{spec.name}.log", "ab")  # noqa: SIM115 - owned by the child
        try:
            return subprocess.Popen(
                list(spec.argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **spec.env},
                preexec_fn=die_with_parent,
            )
        finally:
            out.close()

    def poll(self) -> list[str]:
        """Check every role once; restart the dead and the hung. Returns what happened."""
        events = []
        for name, running in self.roles.items():
            code = running.proc.poll()
            hung = code is None and self._silent(running)
            if code is None and not hung:
                continue
            why = f"exited with code {code}" if code is not None else "stopped sending heartbeats"
            if running.restarts >= running.spec.max_restarts:
                raise RoleFailed(
                    f"{name} {why} after {running.restarts} restarts; see {self.log_dir / (name + '.log')}"
                )
            if hung:
                self._terminate(running.proc)
            running.restarts += 1
            log.warning("%s %s; restart %d/%d", name, why, running.restarts, running.spec.max_restarts)
            running.proc = self._spawn(running.spec)
            running.started = time.monotonic()
            events.append(f"{name} {why}: restarted")
        return events

    def _silent(self, running: _Running) -> bool:
        path = running.spec.heartbeat_path
        if not path:
            return False
        now = time.monotonic()
        if now - running.started < running.spec.heartbeat_timeout_sec:
            return False  # still starting up
        try:
            beat = json.loads(pathlib.Path(path).read_text())["time"]
        except (OSError, ValueError, KeyError):
            return True
        return time.time() - beat > running.spec.heartbeat_timeout_sec

    def stop(self, names: list[str]) -> None:
        """SIGTERM the named roles together, then wait (SIGKILL after the grace period)."""
        procs = [self.roles[n].proc for n in names if n in self.roles]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_sec
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_all(self) -> None:
        self.stop(list(self.roles))

    def _terminate(self, proc: subprocess.Popen) -> None:
        proc.terminate()
        try:
            proc.wait(self.stop_grace_sec)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
