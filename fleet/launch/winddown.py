"""How a fleet over several hosts stops: the aggregator's host decides, every host winds down,
and one summary.json lands in the aggregator's host's run directory.

    board = StopBoard(spec.redis, security, spec.run_id)   # flags in the fleet's own Redis Cluster
    judge = Judge(config, spec, security, started_at)      # on the aggregator's host only
    reason = judge.check(dog)                 # every second: the stop rule (target, caps) or None
    board.request(reason)                     # the first reason wins; every host polls board.reason()
    board.workers_stopped("sim-1")            # each host, once its samplers and learners are down
    board.finish()                            # the aggregator's host, once its checkpoint is written

The order, and why: workers stop first on every host, so the summary's final env steps and
version hold every acked push; the aggregator then writes its last checkpoint; the hosts that
serve the buffer or Redis nodes keep them until the aggregator's host says it is done (its last
read of the buffer needs them). Every wait is bounded (WORKERS_WAIT_SEC, DONE_WAIT_SEC), and a
board that cannot be reached (its Redis nodes are gone) ends a wait at once: under `scancel`
every process of the job gets SIGTERM at the same moment, and the last checkpoint and the
summary must still be written before Slurm's KillWait (30 s by default) runs out; so a signalled
aggregator's host writes summary.json from its last read first, and completes it after.
"""

from __future__ import annotations

import logging
import os
import pathlib
import threading
import time
from collections.abc import Callable
from typing import Protocol

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException

from aggregator.client import AggregatorClient
from buffer.ingest_client import IngestClient
from fleet.launch.spec_model import FleetSpec, HostSpec
from fleet.launch.watchdog import STAGES, Watchdog
from fleet.report.lives import RunHistory
from fleet.report.progress import Progress, Snapshot
from fleet.report.summary import INTERRUPTED, Ending, Summary, final_score, stop_reason, write_summary
from foundation.config import RunConfig
from foundation.cpu import CpuMeter
from foundation.transport import Security, parse_addresses

log = logging.getLogger("fleetrl.fleet")

WORKERS_WAIT_SEC = 15.0  # the aggregator's host waits this long for every host's workers to stop
DONE_WAIT_SEC = 60.0  # a buffer or Redis host waits this long for the aggregator's host to finish
BOARD_TIMEOUT_SEC = 1.0  # one call to the board; it is polled, so a slow answer is skipped
CHECK_EVERY_SEC = 1.0  # the stop rule and the board are looked at this often


class StopBoard:
    """The fleet's stop flags, kept in its own Redis Cluster under one hash tag.

    The cluster may outlive a fleet (buffer.durable: a restarted or requeued fleet starts on its
    data), flags included. So every flag carries the board's clock (a counter each write
    advances), and a host heeds only flags written after it first reached the board: an earlier
    fleet's stop, done and workers-stopped are history. Every call answers None (or does
    nothing) when the cluster cannot be reached: the board only ever shortens a wind-down, it
    never holds one up."""

    def __init__(self, redis_addresses: str, security: Security, run_id: str) -> None:
        self.addresses, self.security = redis_addresses, security
        tag = f"fleetrl-fleet:{{{run_id}}}"
        self.stop_key, self.stopped_key, self.done_key = f"{tag}:stop", f"{tag}:workers-stopped", f"{tag}:done"
        self.clock_key, self.fleets_key = f"{tag}:clock", f"{tag}:fleets"
        self.joined: int | None = None  # the clock when this host first reached the board
        self._client: RedisCluster | None = None

    def _call(self, fn: Callable[[RedisCluster], object]) -> object | None:
        try:
            if self._client is None:
                nodes = [ClusterNode(h, p) for h, p in parse_addresses(self.addresses)]
                password = self.security.redis_password or None
                self._client = RedisCluster(
                    startup_nodes=nodes,
                    username=self.security.redis_user if password else None,
                    password=password,
                    socket_timeout=BOARD_TIMEOUT_SEC,
                    socket_connect_timeout=BOARD_TIMEOUT_SEC,
                    cluster_error_retry_attempts=1,
                )
            if self.joined is None:
                self.joined = self._tick(self._client)
            return fn(self._client)
        except (redis.RedisError, RedisClusterException, OSError, IndexError):  # no node left to ask
            self.close()
            return None

    def _tick(self, client: RedisCluster) -> int:
        return int(client.incr(self.clock_key))

    def _current(self, stamp: bytes | str | None) -> bool:
        """Whether a flag's clock reading is this fleet's (after this host joined); a flag with
        none is not."""
        try:
            return stamp is not None and int(stamp) > (self.joined or 0)
        except ValueError:
            return False

    def request(self, reason: str) -> None:
        """Ask every host to stop; the first reason this fleet gives is the fleet's."""
        self._call(lambda r: r.eval(_REQUEST, 2, self.stop_key, self.clock_key, reason, self.joined or 0))

    def reason(self) -> str | None:
        value = self._call(lambda r: r.get(self.stop_key))
        if not isinstance(value, bytes):
            return None
        stamp, _, reason = value.decode().partition(" ")
        return reason if self._current(stamp) else None

    def workers_stopped(self, host: str) -> None:
        self._call(lambda r: r.hset(self.stopped_key, host, self._tick(r)))

    def hosts_with_workers_stopped(self) -> set[str] | None:
        value = self._call(lambda r: r.hgetall(self.stopped_key))
        if not isinstance(value, dict):
            return None
        return {host.decode() for host, stamp in value.items() if self._current(stamp)}

    def finish(self) -> None:
        self._call(lambda r: r.set(self.done_key, self._tick(r)))

    def finished(self) -> bool | None:
        value = self._call(lambda r: [r.get(self.done_key)])  # a list: a missing key is an answer too
        return self._current(value[0]) if isinstance(value, list) else None

    def fleets_seen(self) -> int | None:
        """Count this fleet (the aggregator's host calls it once): how many fleets of this run id
        have used the cluster, this one included. Above 1 the cluster kept an earlier one's data."""
        value = self._call(lambda r: r.incr(self.fleets_key))
        return None if value is None else int(value)  # type: ignore[call-overload]

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except (redis.RedisError, OSError):
                pass
            self._client = None


# The stop flag: "<clock> <reason>", set unless this fleet has set it already (a later clock
# reading than the asking host's join); an earlier fleet's is overwritten.
_REQUEST = """
local current = redis.call('GET', KEYS[1])
if current and (tonumber(string.match(current, '^(%d+) ')) or 0) > tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], redis.call('INCR', KEYS[2]) .. ' ' .. ARGV[1])
return 1
"""


def wait_on_board(ask: Callable[[], bool | None], timeout_sec: float, stop_early: Callable[[], bool]) -> str:
    """Poll `ask` until it says True ("done"), cannot answer ("board gone"), `timeout_sec` passes
    ("timed out") or `stop_early()` ("signalled"); what ended the wait."""
    deadline = time.monotonic() + timeout_sec
    while True:
        answer = ask()
        if answer is None:
            return "board gone"
        if answer:
            return "done"
        if stop_early():
            return "signalled"
        if time.monotonic() >= deadline:
            return "timed out"
        time.sleep(0.25)


class Judge:
    """The aggregator's host: reads both services' Stats, applies the run's stop rule
    (fleet/report/summary.py stop_reason: target, max_wall_sec, max_env_steps), keeps the learning
    curve (<run_dir>/progress.jsonl, tb/fleet) and writes <run_dir>/summary.json. A run directory
    that holds an earlier fleet's run is continued: this start is its next life (lives.jsonl), and
    the budgets and the summary count every life (fleet/report/lives.py); `buffer_kept`: the Redis
    Cluster holds the earlier lives' data, so its counters hold their env steps."""

    def __init__(
        self, config: RunConfig, spec: FleetSpec, security: Security, started_at: float, buffer_kept: bool
    ) -> None:
        self.config, self.started_at = config, started_at
        self.run_dir = pathlib.Path(spec.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.history = RunHistory.begin(self.run_dir, buffer_kept)
        self.progress = Progress(config, self.run_dir, started_at, self.history.life)
        if self.history.life:
            buffer = "the buffer as it was" if buffer_kept else "an empty buffer"
            log.info("resuming the run in %s: life %d, %.0f s of wall-clock before this start, %s",
                     self.run_dir, self.history.life, self.history.carried.wall_sec, buffer)  # fmt: skip
        self.cpu = CpuMeter()
        # Stats only: sampler_id 0 pushes nothing. A short timeout: a service that is gone is skipped.
        self.ingest = IngestClient(
            spec.service("buffer"), sampler_id=0, run_id=config.run_id, push_timeout_sec=2.0, security=security
        )
        self.agg = AggregatorClient(spec.service("aggregator"), security=security)
        self.snap: Snapshot | None = None  # the newest read (None: a service did not answer)
        self._next = 0.0

    def wall_sec(self) -> float:
        """The run's wall-clock: this life's since its `fleet up` started, and the earlier lives'."""
        return self.history.carried.wall_sec + time.monotonic() - self.started_at

    def check(self, dog: Watchdog) -> str | None:
        """At most every CHECK_EVERY_SEC: one read of the services, and why to stop (or None)."""
        if time.monotonic() < self._next:
            return None
        self._next = time.monotonic() + CHECK_EVERY_SEC
        self.read(dog)
        return stop_reason(self.config, self.progress, self.snap, self.wall_sec())

    def read(self, dog: Watchdog, services: bool = True) -> None:
        """One snapshot of this host's CPU and (`services`) of both services, kept when they answer."""
        self.cpu.sample({**dog.pids(), "launcher": os.getpid()})
        if not services:
            return
        snap = Snapshot.take(self.ingest, self.agg, self.wall_sec(), dog.restarts, (dog.running(), len(dog.roles)))
        self.snap = None if snap is None else self.history.carried.onto(snap)
        if self.snap is not None:
            self.progress.update(self.snap)

    def summarize(self, reason: str, restarts: int, host_dir: pathlib.Path, score: bool) -> Summary:
        """summary.json, after the fleet's roles stopped; `score`: the last checkpoint over
        eval.final_episodes when the target was not reached (not after a signal: no time)."""
        final = final_score(self.config, self.run_dir, self.progress) if score else None
        cpu = self.cpu.report(time.monotonic() - self.started_at, len(os.sched_getaffinity(0)))  # this life's
        ending = Ending(reason, self.wall_sec(), restarts, cpu, final)
        return write_summary(self.config, self.run_dir, self.progress, ending, host_dir=host_dir, history=self.history)

    def close(self) -> None:
        self.ingest.close()
        self.agg.close()
        self.progress.close()


class Host(Protocol):
    """What the wind-down reads of a host's share of the fleet (fleet/launch/spec.py FleetHost)."""

    spec: FleetSpec
    host: HostSpec
    stop: threading.Event
    run_dir: pathlib.Path
    host_dir: pathlib.Path


def watch(host: Host, dog: Watchdog, board: StopBoard, judge: Judge | None, until_signal: bool = False) -> str | None:
    """Supervise until this host is signalled (None) or the fleet is to stop (the reason):
    `judge` (the aggregator's host) decides and tells the board, unless `until_signal` (it then
    keeps the learning curve only); other hosts read the board."""
    next_look = 0.0
    while not host.stop.is_set():
        for event in dog.poll():
            log.info("%s: %s", host.host.name, event)
        if judge is not None:
            reason = judge.check(dog)
            if reason is not None and not until_signal:
                board.request(reason)
                return reason
        elif time.monotonic() >= next_look:
            next_look = time.monotonic() + CHECK_EVERY_SEC
            reason = board.reason()
            if reason is not None:
                return reason
        host.stop.wait(0.25)
    return None


def wind_down(host: Host, dog: Watchdog, board: StopBoard, judge: Judge | None, reason: str | None) -> None:
    """Workers first on every host; the aggregator's host then reads the services once more,
    stops them (the aggregator's last checkpoint) and writes summary.json; buffer and Redis
    hosts keep serving until it is done. A host signalled itself leaves without waiting,
    except the aggregator's host, which first asks the others to stop and still writes the
    summary. Every wait is bounded."""
    name, signalled = host.host.name, reason is None
    log.info("%s: winding down: %s", name, reason or "signalled")
    if judge is not None:
        judge.read(dog, services=False)  # this host's roles' last CPU readings before they stop
    if judge is not None and signalled:
        board.request(f"SIGTERM or Ctrl-C on {name}, the aggregator's host")
        # Under scancel every process got this SIGTERM, and Slurm's KillWait (30 s) bounds what
        # is left: a summary from the last read now, completed below if there is time.
        judge.summarize(INTERRUPTED, dog.restarts, host.host_dir, score=False)
        log.info("%s: summary.json in %s, from the last read; completing it", name, host.run_dir)
    dog.stop([n for n, r in dog.roles.items() if r.spec.stage == 0])  # samplers, learners, evaluator
    board.workers_stopped(name)
    if judge is not None:
        with_workers = {h.name for h in host.spec.hosts if h.workers}
        waited = wait_on_board(
            lambda: _superset(board.hosts_with_workers_stopped(), with_workers), WORKERS_WAIT_SEC, lambda: False
        )
        log.info("%s: every host's workers stopped? %s", name, waited)
        judge.read(dog)  # every acked push and the last version, once no worker pushes any more
        services = [n for n, r in dog.roles.items() if r.spec.stage in (STAGES["aggregator"], STAGES["buffer"])]
        dog.stop(services)  # the aggregator writes its last checkpoint on SIGTERM
        board.finish()  # this host's Redis nodes stop last, below
        summary = judge.summarize(reason or INTERRUPTED, dog.restarts, host.host_dir, score=not signalled)
        log.info("%s: summary.json in %s: %s", name, host.run_dir, summary.stop_reason)
    elif not signalled and (host.host.services or host.host.redis):
        waited = wait_on_board(board.finished, DONE_WAIT_SEC, host.stop.is_set)
        log.info("%s: the aggregator's host finished? %s", name, waited)
    dog.stop_in_order()


def _superset(seen: set[str] | None, wanted: set[str]) -> bool | None:
    return None if seen is None else seen >= wanted
