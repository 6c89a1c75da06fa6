"""CPU-seconds per role, for summary.json: where a run's CPU went.

    meter = CpuMeter()
    while running:
        meter.sample({"sampler-0": pid, "redis-7000": pid, ...})   # every few seconds
    meter.report(wall_sec=..., cores=os.cpu_count())             # {"roles": ..., "groups": ...}

A restarted role gets a new pid: the meter keeps the last reading of every pid it has seen,
so a role's total covers all its incarnations (up to each one's last sample).

Each process counts its own CPU only (user + system), never its reaped children's: the
launcher's children are the roles, each metered as itself, and a process also inherits the
children's time of whatever ran before it exec'd (`./scripts/train.sh` runs pip first). Roles
start no processes of their own, so own CPU is all of a role's work.
"""

from __future__ import annotations

import pathlib
import re

import psutil

from foundation.process import locked_kib

# What the issue calls the fleet's overhead: everything but acting (samplers) and learning
# (learners). The launcher's own progress polling is counted too.
OVERHEAD_GROUPS = ("aggregator", "buffer", "evaluator", "redis", "launcher")


# CPU flags of native bfloat16 arithmetic (/proc/cpuinfo): x86's AVX512-BF16 and AMX, Arm's BF16.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def has_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes in bfloat16 natively: a BF16 flag on a `flags` (x86) or
    `Features` (Arm) line of /proc/cpuinfo (`cpuinfo`: that text; None reads it; unreadable: False).
    Without one, torch emulates bfloat16 and autocast is slower than float32."""
    if cpuinfo is None:
        try:
            cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features") and BF16_FLAGS & set(value.split()):
            return True
    return False


def own_cpu_sec(times) -> float:
    """A process's own CPU-seconds from psutil's cpu_times(): user + system, not the
    children_user / children_system of its reaped children (counted where they ran)."""
    return times.user + times.system


def role_group(name: str) -> str:
    """'sampler-3' -> 'sampler', 'redis-7001' -> 'redis', 'aggregator' -> 'aggregator'."""
    return re.sub(r"-\d+$", "", name)


class CpuMeter:
    """CPU-seconds per role, and the peak resident and locked memory of each."""

    def __init__(self) -> None:
        self._seconds: dict[tuple[str, int], float] = {}
        self.peak_rss_mib: dict[str, float] = {}
        self.peak_locked_mib: dict[str, float] = {}

    def sample(self, pids: dict[str, int]) -> None:
        for name, pid in pids.items():
            try:
                process = psutil.Process(pid)
                t = process.cpu_times()
                rss = process.memory_info().rss / 2**20
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # gone since: its last reading stands
            self.record(name, pid, own_cpu_sec(t))
            self.peak_rss_mib[name] = round(max(self.peak_rss_mib.get(name, 0.0), rss), 1)
            locked = locked_kib(pid) / 1024
            self.peak_locked_mib[name] = round(max(self.peak_locked_mib.get(name, 0.0), locked), 1)

    def record(self, name: str, pid: int, cpu_sec: float) -> None:
        """One reading of a role's process: its CPU so far. A newer reading of the same pid
        replaces the older one; another pid of the same role (a restart) adds to it."""
        self._seconds[(name, pid)] = cpu_sec

    def seconds(self) -> dict[str, float]:
        """CPU-seconds per role name, every incarnation summed."""
        totals: dict[str, float] = {}
        for (name, _), sec in self._seconds.items():
            totals[name] = totals.get(name, 0.0) + sec
        return totals

    def report(self, wall_sec: float, cores: int) -> dict:
        """JSON-ready: {"roles": {name: {cpu_sec, share}}, "groups": {...}, "overhead_share": x},
        where share = cpu_sec / (wall_sec * cores), a fraction of the whole machine."""
        capacity = max(wall_sec * cores, 1e-9)
        seconds = self.seconds()
        groups: dict[str, float] = {}
        for name, sec in seconds.items():
            groups[role_group(name)] = groups.get(role_group(name), 0.0) + sec

        def shares(table: dict[str, float]) -> dict[str, dict[str, float]]:
            return {n: {"cpu_sec": round(s, 3), "share": round(s / capacity, 4)} for n, s in sorted(table.items())}

        overhead = sum(sec for g, sec in groups.items() if g in OVERHEAD_GROUPS)
        return {
            "roles": shares(seconds),
            "groups": shares(groups),
            "overhead_share": round(overhead / capacity, 4),
            "peak_rss_mib": dict(sorted(self.peak_rss_mib.items())),
            "peak_locked_mib": dict(sorted(self.peak_locked_mib.items())),
        }
