"""The watchdog: starts role processes, restarts the ones that die or hang, stops them all.

    with Watchdog(log_dir) as dog:
        dog.start(RoleSpec("aggregator", argv, heartbeat_path=...))
        while running:
            events = dog.poll()          # restarts crashed or silent roles, returns what it did
        # __exit__ stops every role: SIGTERM, then SIGKILL after `stop_grace_sec`

Each role runs as its own OS process (`python -m fleet.cli.main <role> ...`) with its output in
`<log_dir>/<name>.log`, and dies with the watchdog (PR_SET_PDEATHSIG) if the watchdog crashes.
A process that writes no heartbeat file (a redis-server) is watched through a `probe` instead
(does it answer?), and one started elsewhere joins with `adopt` (the local Redis nodes, which
the launcher starts before it forms the cluster). Roles stop in stages: workers, aggregator,
buffer, then Redis nodes (`RoleSpec.stage`).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from foundation.config import WatchdogConfig
from foundation.errors import RunFailed
from foundation.process import parent_death_prefix, terminate

log = logging.getLogger("fleetrl.watchdog")

STARTUP_GRACE_SEC = 30.0  # a role's first heartbeat may take this long, whatever the heartbeat timeout
PROBE_EVERY_SEC = 1.0  # a probed role (no heartbeat file) is asked at most this often
# Stop stages: producers first, so nothing is pushed into a stopped service; the aggregator then
# writes its final checkpoint; the buffer after it; the Redis nodes last.
STAGES = {"aggregator": 1, "buffer": 2, "redis": 3}


@dataclass(frozen=True)
class RoleSpec:
    name: str  # unique: "sampler-0", "aggregator", ...
    argv: tuple[str, ...]
    heartbeat_path: str | None = None
    heartbeat_timeout_sec: float = 60.0  # a role silent this long is taken as hung and restarted
    max_restarts: int = 3  # the restart budget: this many restarts in a burst ...
    restart_refill_sec: float = 600.0  # ... and one more every this many seconds, up to max_restarts
    backoff_first_sec: float = 1.0  # the 2nd restart in a row waits this long, each next one twice as long
    backoff_max_sec: float = 30.0
    env: dict[str, str] = field(default_factory=dict)
    probe: Callable[[], bool] | None = None  # without a heartbeat file: True while the process answers
    stage: int = 0  # stop_in_order stops lower stages first
    # A role that died is restarted only once this says True (a Redis primary: once its replica
    # took over), or `restart_wait_max_sec` after it died, whichever comes first.
    restart_when: Callable[[], bool] | None = None
    restart_wait_max_sec: float = 60.0

    def __post_init__(self) -> None:
        if self.heartbeat_path and self.probe:
            raise ValueError(f"role {self.name!r}: a heartbeat file or a probe, not both")


def role_spec(
    name: str,
    argv: tuple[str, ...],
    config: WatchdogConfig,
    heartbeat_path: str | None = None,
    env: dict[str, str] | None = None,
    max_restarts: int | None = None,
    probe: Callable[[], bool] | None = None,
    restart_when: Callable[[], bool] | None = None,
) -> RoleSpec:
    """A RoleSpec with the run's watchdog settings (`max_restarts` overrides the config's); its
    stop stage follows its kind (the name up to the first '-')."""
    return RoleSpec(
        name,
        argv,
        heartbeat_path=heartbeat_path,
        heartbeat_timeout_sec=config.heartbeat_timeout_sec,
        max_restarts=config.max_restarts if max_restarts is None else max_restarts,
        restart_refill_sec=config.restart_refill_sec,
        backoff_first_sec=config.backoff_first_sec,
        backoff_max_sec=config.backoff_max_sec,
        env=env or {},
        probe=probe,
        stage=STAGES.get(name.split("-", 1)[0], 0),
        restart_when=restart_when,
    )


@dataclass
class _Running:
    spec: RoleSpec
    proc: subprocess.Popen
    started: float
    restarts: int = 0  # ever
    budget: float = 0.0  # restarts allowed now (refills over time)
    budget_at: float = 0.0
    in_a_row: int = 0  # restarts since the role last ran for backoff_max_sec
    restart_at: float | None = None  # down, waiting out its backoff until then
    answered: float = 0.0  # a probed role: when it last answered (monotonic)
    probed: float = 0.0
    died: float = 0.0  # when it was last found dead or hung (monotonic)


class RoleFailed(RunFailed, RuntimeError):
    """A role kept dying past its restart budget."""


class Watchdog:
    def __init__(
        self,
        log_dir: str | os.PathLike,
        stop_grace_sec: float = 10.0,
        events_path: str | os.PathLike | None = None,
        startup_grace_sec: float = STARTUP_GRACE_SEC,
    ) -> None:
        self.log_dir = pathlib.Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.stop_grace_sec = stop_grace_sec
        self.startup_grace_sec = startup_grace_sec
        self.events_path = pathlib.Path(events_path) if events_path else None  # JSON lines: what, when, why
        self.roles: dict[str, _Running] = {}

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    @property
    def restarts(self) -> int:
        return sum(r.restarts for r in self.roles.values())

    def running(self) -> int:
        """How many roles have a live process now (not exited, not waiting out a backoff)."""
        return sum(r.restart_at is None and r.proc.poll() is None for r in self.roles.values())

    def pids(self) -> dict[str, int]:
        """The current pid of every role (CPU accounting)."""
        return {name: running.proc.pid for name, running in self.roles.items()}

    def start(self, spec: RoleSpec) -> None:
        if spec.name in self.roles:
            raise ValueError(f"role {spec.name!r} already started")
        self.adopt(spec, self._spawn(spec))

    def adopt(self, spec: RoleSpec, proc: subprocess.Popen) -> None:
        """Supervise a process started elsewhere as if `start` had started it: a restart runs
        `spec.argv`."""
        if spec.name in self.roles:
            raise ValueError(f"role {spec.name!r} already started")
        now = time.monotonic()
        self.roles[spec.name] = _Running(spec, proc, now, budget=spec.max_restarts, budget_at=now, answered=now)

    def _spawn(self, spec: RoleSpec) -> subprocess.Popen:
        if spec.heartbeat_path:
            pathlib.Path(spec.heartbeat_path).unlink(missing_ok=True)
        out = open(self.log_dir / f"{spec.name}.log", "ab")  # noqa: SIM115 - owned by the child
        try:
            return subprocess.Popen(
                [*parent_death_prefix(), *spec.argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **spec.env},
            )
        finally:
            out.close()

    def poll(self) -> list[str]:
        """Check every role once; restart the dead and the hung (after a backoff when they keep
        failing). Returns what happened. Raises RoleFailed once a role's budget is spent."""
        events = []
        now = time.monotonic()
        for name, running in self.roles.items():
            spec = running.spec
            if running.restart_at is not None:
                if now >= running.restart_at and self._may_restart(running, now):
                    running.restart_at = None
                    self._restart(running, now)
                    events.append(self._record(running, f"{name} restarted after its backoff", "backoff over"))
                continue
            code = running.proc.poll()
            hung = code is None and self._silent(running)
            if code is None and not hung:
                if now - running.started >= spec.backoff_max_sec:
                    running.in_a_row = 0  # it ran for a while: the next failure restarts at once
                continue
            why = f"exited with code {code}" if code is not None else "stopped sending heartbeats"
            running.budget = min(
                spec.max_restarts, running.budget + (now - running.budget_at) / spec.restart_refill_sec
            )
            running.budget_at = now
            if running.budget < 1:
                self._record(running, f"{name} {why}: restart budget spent", why)
                raise RoleFailed(
                    f"{name} {why} after {running.restarts} restarts (budget: {spec.max_restarts}, one more every "
                    f"{spec.restart_refill_sec:.0f}s); see {self.log_dir / (name + '.log')}"
                )
            if hung:
                self._terminate(running.proc)
            running.died = now
            running.budget -= 1
            running.in_a_row += 1
            delay = 0.0 if running.in_a_row == 1 else spec.backoff_first_sec * 2 ** (running.in_a_row - 2)
            delay = min(delay, spec.backoff_max_sec)
            log.warning("%s %s; restart %d (in %.1fs)", name, why, running.restarts + 1, delay)
            if delay == 0 and self._may_restart(running, now):
                self._restart(running, now)
                events.append(self._record(running, f"{name} {why}: restarted", why))
            else:
                running.restart_at = now + delay
                when = f"in {delay:.1f}s" if self._may_restart(running, now) else "once it may (restart_when)"
                events.append(self._record(running, f"{name} {why}: restarting {when}", why))
        return events

    @staticmethod
    def _may_restart(running: _Running, now: float) -> bool:
        spec = running.spec
        waited = now - running.died >= spec.restart_wait_max_sec
        return spec.restart_when is None or waited or spec.restart_when()

    def _restart(self, running: _Running, now: float) -> None:
        running.restarts += 1
        running.proc = self._spawn(running.spec)
        running.started = running.answered = now

    def _record(self, running: _Running, event: str, why: str) -> str:
        if self.events_path is not None:
            row = {"time": time.time(), "role": running.spec.name, "event": event, "why": why}
            row["restarts"] = running.restarts
            with open(self.events_path, "a") as f:
                f.write(json.dumps(row) + "\n")
        return event

    def _silent(self, running: _Running) -> bool:
        spec, path = running.spec, running.spec.heartbeat_path
        now = time.monotonic()
        if spec.probe is not None and now - running.probed >= PROBE_EVERY_SEC:
            running.probed = now
            if spec.probe():
                running.answered = now
        if now - running.started < max(spec.heartbeat_timeout_sec, self.startup_grace_sec):
            return False  # still starting up (imports, a checkpoint to restore)
        if spec.probe is not None:
            return now - running.answered > spec.heartbeat_timeout_sec
        if not path:
            return False
        try:
            beat = json.loads(pathlib.Path(path).read_text())["time"]
        except (OSError, ValueError, KeyError):
            return True
        return time.time() - beat > running.spec.heartbeat_timeout_sec

    def stop(self, names: list[str]) -> None:
        """SIGTERM the named roles together, then wait (SIGKILL after the grace period)."""
        terminate([self.roles[n].proc for n in names if n in self.roles], self.stop_grace_sec)

    def stop_all(self) -> None:
        self.stop(list(self.roles))

    def stop_in_order(self) -> None:
        """Stage by stage (STAGES): workers, the aggregator, the buffer, the Redis nodes."""
        for stage in sorted({r.spec.stage for r in self.roles.values()}):
            self.stop([n for n, r in self.roles.items() if r.spec.stage == stage])

    def _terminate(self, proc: subprocess.Popen) -> None:
        terminate([proc], self.stop_grace_sec)  # SIGCONT too: a SIGSTOPped role stops cleanly
