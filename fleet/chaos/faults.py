"""Faults injected into a running local fleet, one every `every_sec`, and when each recovered.

    injector = Injector(run_dir, every_sec=60, seed=0, started_at=time.monotonic())
    fleet.run(injector)            # LocalFleet calls injector.tick(dog, cluster) every 0.25 s
    injector.records               # one FaultRecord per fault: what, when, whom, recovery, cost

The menu (`fault_menu`): SIGKILL and SIGSTOP (SIGCONT `stop_sec` later) of every role process,
and SIGKILL of a Redis primary (a node that is a primary at that moment: its replica takes
over, the watchdog restarts it and it rejoins as a replica); with the samplers on a host of their
own (`links`: fleet/chaos/netns.py, fleet/chaos/network.py), a partition of the sampler host or of the
services' host and a slow link, each undone 5-20 s later (without one, NOT_AVAILABLE says why
not). A fault has recovered once what it hit works again, as seen from outside, in the heartbeat
files the roles write every 1-2 s (so times are good to ~2 s): the role's progress counter
(PROGRESS) moved after the fault (after SIGCONT for a stop), from its replacement if the
watchdog replaced it; for a Redis primary, once its replica has taken its slots over
(`failover_sec`), every sampler's acked env steps and every learner's pushes moved; for a
network fault, once every sampler's acked env steps moved after the link was restored.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import redis

from fleet.chaos.netns import NetnsError
from fleet.chaos.network import NETWORK_FAULTS, LinkFaults, NetFaultRanges
from fleet.launch.cluster_admin import may_restart
from fleet.launch.local_cluster import LocalRedisCluster
from fleet.launch.watchdog import Watchdog
from foundation.transport import Security

# The counter that says a role is doing its work (heartbeat counters); None: being alive is all.
PROGRESS: dict[str, str | None] = {
    "sampler": "acked_env_steps",
    "learner": "pushed",
    "buffer": "batches",
    "aggregator": "version",
    "evaluator": None,
}
REDIS_PRIMARY = "redis-primary"
ONE_HOST = (
    "the local fleet runs every role on one loopback interface in one network namespace, so no link belongs to "
    "one role: run the soak with --hosts netns (the samplers on a host of their own)"
)
NOT_AVAILABLE = {" ".join(fault): ONE_HOST for fault in NETWORK_FAULTS}  # without a sampler host


@dataclass(frozen=True)
class Fault:
    kind: str  # "SIGKILL", "SIGSTOP", or a network fault's ("PARTITION", "SLOW": fleet/chaos/network.py)
    target: str  # a role name ("sampler-1", "aggregator"), REDIS_PRIMARY, or a network fault's target

    def __str__(self) -> str:
        return f"{self.kind} {self.target}"

    @property
    def network(self) -> bool:
        return (self.kind, self.target) in NETWORK_FAULTS


def fault_menu(roles: list[str], redis_replicas: int) -> list[Fault]:
    """Every fault the soak picks from: each role process (Redis nodes aside) killed or stopped,
    and, with replicas to take over, a Redis primary killed."""
    workers = sorted(r for r in roles if not r.startswith("redis-"))
    menu = [Fault(sig, role) for role in workers for sig in ("SIGKILL", "SIGSTOP")]
    if redis_replicas > 0 and any(r.startswith("redis-") for r in roles):
        menu.append(Fault("SIGKILL", REDIS_PRIMARY))
    return menu


@dataclass
class Watch:
    """One role watched for work done after `since` (epoch seconds)."""

    role: str
    since: float
    base_pid: int | None  # the process at the fault
    base: float | None  # its progress counter then (None: not known)
    needs_new_pid: bool = False  # killed: only a replacement can recover
    new_pid_first: dict[int, float] = field(default_factory=dict)  # a replacement's first counter seen
    moved: bool = False

    def see(self, beat: dict) -> None:
        """Take one heartbeat; `moved` once it shows work done after `since`."""
        pid = beat.get("pid")
        if self.moved or pid is None or beat.get("time", 0.0) <= self.since:
            return
        same = pid == self.base_pid
        if same and self.needs_new_pid:
            return
        counter = PROGRESS[self.role.split("-")[0]]
        if counter is None:  # alive after the fault is all it can show
            self.moved = True
            return
        value = float(beat.get("counters", {}).get(counter, 0.0))
        first = self.base if same and self.base is not None else self.new_pid_first.setdefault(pid, value)
        self.moved = value > first


@dataclass
class FaultRecord:
    fault: str
    at_sec: float  # since the soak's start
    target: str  # the role hit (for a Redis primary: its node, redis-<port>; a network fault's target)
    pid: int | None  # None: a network fault
    cont_sec: float | None = None  # SIGSTOP: when SIGCONT was sent; a network fault: when it was undone
    recovered_sec: float | None = None  # from the fault (None: not by the end)
    restarts: int = 0  # watchdog restarts of the target from the fault until it recovered
    version_at_fault: float | None = None  # the aggregator's version then (its heartbeat)
    detail: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


class Injector:
    """A FleetObserver (fleet/launch/local_fleet.py) that injects a fault every `every_sec` (the first after
    `first_sec`), picked from fault_menu by a seeded random generator, and tracks recoveries."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        every_sec: float,
        seed: int,
        *,
        stop_sec: float = 5.0,
        first_sec: float | None = None,
        redis_replicas: int = 1,
        plan: list[Fault] | None = None,
        started_at: float | None = None,
        kill: Callable[[int, int], None] = os.kill,
        links: LinkFaults | None = None,
        net_ranges: NetFaultRanges = NetFaultRanges(),
    ) -> None:
        """The first fault comes `first_sec` (default `every_sec`) after the first tick (the fleet
        is up then); times in the records count from `started_at` (monotonic; default: now), the
        clock of the run's summary. `plan`: these faults in this order instead of random picks;
        the run then ends once the last has recovered. `links`: the network faults (the samplers
        on a host of their own), drawn from `net_ranges`."""
        self.heartbeats = pathlib.Path(run_dir) / "heartbeats"
        self.every_sec, self.stop_sec, self.redis_replicas = every_sec, stop_sec, redis_replicas
        self.rng = random.Random(seed)
        self.plan = None if plan is None else list(plan)
        self.kill = kill
        self.links, self.net_ranges = links, net_ranges
        self._undo_at: tuple[float, FaultRecord] | None = None  # the network fault in effect: when it ends
        self.started = time.monotonic() if started_at is None else started_at
        self.first_sec = every_sec if first_sec is None else first_sec
        self.next_at: float | None = None  # set at the first tick
        self.records: list[FaultRecord] = []
        self.skipped: list[str] = []  # planned faults whose target was down at their time
        self.errors: list[str] = []  # network faults that `ip` or `tc` refused to make or undo
        self.paused = False  # once the run's stop rule fired: no new faults
        # record, watches (None: a network fault still in effect), restarts before
        self._open: list[tuple[FaultRecord, list[Watch] | None, int]] = []
        self._cont: list[tuple[float, int, FaultRecord]] = []  # (when, pid, record) SIGCONTs due

    # FleetObserver
    def tick(self, dog: Watchdog, cluster: LocalRedisCluster) -> str | None:
        now = time.monotonic()
        if self.next_at is None:
            self.next_at = now + self.first_sec
        self._send_conts(dog, now, force=False)
        self._undo_network(dog, now, force=False)
        if not self.paused and now >= self.next_at:
            self.next_at += self.every_sec
            fault = self._next_fault(dog)
            if fault is not None and self.inject(dog, cluster, fault) is None:
                self.skipped.append(str(fault))
        self._check(dog, cluster, now)
        if self.plan == [] and not self._open and not self._cont and self._undo_at is None:
            return f"fault plan done: {len(self.records)} faults, every one recovered"
        return None

    def _next_fault(self, dog: Watchdog) -> Fault | None:
        """The next fault; never one whose target is down now (its process may be gone and its
        pid reused by a process that is not ours)."""
        if self.plan is None:
            up = [r for r in dog.roles if _running(dog, r)]
            menu = fault_menu(up, self.redis_replicas)
            if self.links is not None and self._undo_at is None:  # one network fault at a time
                menu += [Fault(kind, target) for kind, target in self.links.menu]
            return self.rng.choice(menu)
        return self.plan.pop(0) if self.plan else None

    def stopping(self, dog: Watchdog, cluster: LocalRedisCluster) -> None:
        self.paused = True
        self._send_conts(dog, time.monotonic(), force=True)  # a stopped role must stop cleanly too
        self._undo_network(dog, time.monotonic(), force=True)  # the samplers' last acks must get through

    def workers_stopped(self, dog: Watchdog, cluster: LocalRedisCluster) -> None:
        pass

    def inject(self, dog: Watchdog, cluster: LocalRedisCluster, fault: Fault) -> FaultRecord | None:
        """Send the fault's signal to its target's process; None when the target is down now (a
        network fault: when another is in effect)."""
        if fault.network:
            return self._inject_network(dog, fault)
        target = self._primary(dog, cluster) if fault.target == REDIS_PRIMARY else fault.target
        if target is None or not _running(dog, target):
            return None
        pid = dog.pids()[target]
        record = FaultRecord(str(fault), round(time.monotonic() - self.started, 2), target, pid)
        record.version_at_fault = self._beat("aggregator").get("counters", {}).get("version")
        self.kill(pid, signal.SIGKILL if fault.kind == "SIGKILL" else signal.SIGSTOP)
        self.records.append(record)
        if fault.target == REDIS_PRIMARY:
            record.detail["node"] = next(f"{h}:{p}" for h, p in cluster.nodes if f"redis-{p}" == target)
        if fault.kind == "SIGSTOP":
            self._cont.append((time.monotonic() + self.stop_sec, pid, record))  # record.target: whom
        watched = [target] if fault.target != REDIS_PRIMARY else self._data_path_roles(dog)
        since = time.time() + (self.stop_sec if fault.kind == "SIGSTOP" else 0.0)
        killed = pid if fault.kind == "SIGKILL" else None
        watches = [self._watch(role, since, killed if role == target else None) for role in watched]
        if fault.kind == "SIGSTOP":
            watches[0].base_pid = pid
        self._open.append((record, watches, dog.roles[target].restarts))
        return record

    def _inject_network(self, dog: Watchdog, fault: Fault) -> FaultRecord | None:
        """Take the link down (or slow it) until `for_sec` from now; the samplers are watched
        from then on (in _undo_network)."""
        if self.links is None or self._undo_at is not None:
            return None
        net = self.links.draw(fault.kind, fault.target, self.rng, self.net_ranges)
        record = FaultRecord(str(fault), round(time.monotonic() - self.started, 2), fault.target, None)
        record.version_at_fault = self._beat("aggregator").get("counters", {}).get("version")
        record.detail = net.detail()
        try:
            self.links.apply(net)
        except NetnsError as err:  # the soak goes on without this fault, and says why
            self.errors.append(f"{fault}: {err}")
            return None
        record.detail["at_time"] = time.time()  # epoch, the ledgers' clock: from the link's change on
        self.records.append(record)
        self._undo_at = (time.monotonic() + net.for_sec, record)
        self._open.append((record, None, 0))  # watched once the link is back: never recovered before
        return record

    def _undo_network(self, dog: Watchdog, now: float, force: bool) -> None:
        """The link back once the fault in effect is due (or `force`); from now on its record
        waits for every sampler's acked env steps to move."""
        if self._undo_at is None or not (force or now >= self._undo_at[0]):
            return
        record = self._undo_at[1]
        assert self.links is not None
        record.detail["undone_time"] = time.time()  # until just before the link is back
        try:
            self.links.undo()
        except NetnsError as err:  # the samplers may stay cut off: the record will not recover
            self.errors.append(f"undo {record.fault}: {err}")
        self._undo_at = None
        record.cont_sec = round(now - self.started, 2)
        samplers = [role for role in sorted(dog.roles) if role.startswith("sampler-")]
        watches = [self._watch(role, time.time(), None) for role in samplers]
        self._open = [(r, watches if r is record else w, n) for r, w, n in self._open]

    def _watch(self, role: str, since: float, killed_pid: int | None) -> Watch:
        beat = self._beat(role)
        counter = PROGRESS[role.split("-")[0]]
        pid = beat.get("pid") if killed_pid is None else killed_pid
        value = beat.get("counters", {}).get(counter) if counter and beat.get("pid") == pid else None
        base = float(value) if value is not None else None
        return Watch(role, since, pid, base, needs_new_pid=killed_pid is not None)

    def _data_path_roles(self, dog: Watchdog) -> list[str]:
        return sorted(r for r in dog.roles if r.startswith(("sampler-", "learner-")))

    def _primary(self, dog: Watchdog, cluster: LocalRedisCluster) -> str | None:
        """A node that is a primary now, picked at random (a failover moves primaries around)."""
        primaries = [
            port
            for host, port in cluster.nodes
            if _running(dog, f"redis-{port}") and _role_of(host, port, cluster.auth) == "master"
        ]
        return f"redis-{self.rng.choice(sorted(primaries))}" if primaries else None

    def _beat(self, role: str) -> dict:
        try:
            return json.loads((self.heartbeats / f"{role}.json").read_text())
        except (OSError, ValueError):
            return {}

    def _send_conts(self, dog: Watchdog, now: float, force: bool) -> None:
        due = [c for c in self._cont if force or now >= c[0]]
        self._cont = [c for c in self._cont if c not in due]
        for _, pid, record in due:
            if _running(dog, record.target) and dog.pids()[record.target] == pid:
                self.kill(pid, signal.SIGCONT)
            else:  # the watchdog replaced it meanwhile (its pid may be another process's now)
                record.detail["replaced_while_stopped"] = True
            record.cont_sec = round(now - self.started, 2)

    def _check(self, dog: Watchdog, cluster: LocalRedisCluster, now: float) -> None:
        still: list[tuple[FaultRecord, list[Watch] | None, int]] = []
        for record, watches, restarts in self._open:
            if watches is None:  # a network fault still in effect
                still.append((record, watches, restarts))
                continue
            if record.target in dog.roles:  # a role, not a network fault
                record.restarts = dog.roles[record.target].restarts - restarts
            if record.target.startswith("redis-") and "failover_sec" not in record.detail:
                # Until a replica holds the dead primary's slots, acks on the other primaries
                # say nothing of its slots: the data path is watched from the failover on.
                host, port = record.detail["node"].rsplit(":", 1)
                if not may_restart(host, int(port), cluster.nodes, cluster.auth):
                    still.append((record, watches, restarts))
                    continue
                record.detail["failover_sec"] = round(now - self.started - record.at_sec, 2)
                watches = [self._watch(w.role, time.time(), None) for w in watches]
            for watch in watches:
                watch.see(self._beat(watch.role))
            if all(w.moved for w in watches):
                record.recovered_sec = round(now - self.started - record.at_sec, 2)
            else:
                still.append((record, watches, restarts))
        self._open = still


def _running(dog: Watchdog, role: str) -> bool:
    """The role has a live process of the watchdog's now (not exited, not awaiting a restart)."""
    running = dog.roles.get(role)
    return running is not None and running.restart_at is None and running.proc.poll() is None


def _conn(host: str, port: int, auth: Security) -> redis.Redis:
    user = auth.redis_user if auth.redis_password else None
    return redis.Redis(host=host, port=port, username=user, password=auth.redis_password or None, socket_timeout=1.0)


def _role_of(host: str, port: int, auth: Security) -> str | None:
    """A Redis node's replication role ("master", "slave"), or None when it does not answer."""
    conn = _conn(host, port, auth)
    try:
        role = conn.execute_command("ROLE")[0]
    except redis.RedisError:
        return None
    finally:
        conn.close()
    return role.decode() if isinstance(role, bytes) else str(role)
