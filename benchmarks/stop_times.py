"""Seconds from SIGTERM to exit for every role, with its peers up and with its peers gone; and
each role's memory (resident and locked) while it trains.

    python3 benchmarks/stop_times.py [--task FetchReach-v4] [--json out.json]

Twice, a local fleet (Redis Cluster, buffer, aggregator, sampler, learner, evaluator) is
started by fleet.launch.local_fleet.LocalFleet and given time to train; then every role's VmRSS and
its pinned memory are read from /proc (the first fleet), and:
(a) peers up: each role gets SIGTERM in turn (workers first, then the services, then the Redis
    nodes), the others still running;
(b) peers gone: the Redis nodes are SIGKILLed and the buffer gets SIGTERM (its Redis gone);
    then the aggregator is SIGKILLed and every worker gets SIGTERM (a services host lost). The
    aggregator's own peers are its clients only: its peers-up figure is taken after they stopped.
Printed last: one line per role and case (issue goal: <= 5 s each), then the memory table.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import signal
import sys
import tempfile
import time
from contextlib import closing

from harness import result_record, write_result  # benchmarks/harness.py (this script's folder)

from fleet.cli.presets import preset_config
from fleet.launch.local_fleet import LocalFleet
from fleet.launch.watchdog import Watchdog
from foundation.config import with_overrides
from foundation.process import locked_kib

WORKERS = ("sampler-0", "learner-0", "evaluator-0")
SERVICES = ("buffer", "aggregator")
WARMUP_SEC = 25.0


def _time_to_exit(dog: Watchdog, name: str, limit: float = 60.0) -> float:
    proc = dog.roles[name].proc
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(limit)
    except Exception:  # noqa: BLE001 - report it as not stopping within the limit
        proc.kill()
        proc.wait()
        return float("inf")
    return time.monotonic() - start


def memory_mib(pid: int) -> dict[str, float]:
    """Resident (VmRSS) and pinned memory (smaps' Locked: resident and locked) of a process, in
    MiB. VmLck is not the pinned figure: under mlockall(MCL_ONFAULT) it counts every locked
    mapping whole, touched or not (a sampler's thread stacks and arenas)."""
    status = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines())
    rss = int(status["VmRSS"].split()[0]) / 1024
    return {
        "rss": round(rss, 1),
        "locked": round(locked_kib(pid) / 1024, 1),
        "vm_locked": int(status["VmLck"].split()[0]) / 1024,
    }


def run_case(task: str, run_dir: pathlib.Path, peers_gone: bool) -> tuple[dict[str, float], dict[str, dict]]:
    config = with_overrides(preset_config(task), ["run_id=stops", f"run_dir={json.dumps(str(run_dir))}"]).validate()
    fleet = LocalFleet(config, started_at=time.monotonic())
    fleet.prepare()
    cluster = fleet.make_cluster()
    times: dict[str, float] = {}
    with closing(cluster), Watchdog(run_dir / "logs", stop_grace_sec=60.0) as dog:
        fleet.start_roles(dog, cluster, max_restarts=0)
        time.sleep(WARMUP_SEC)
        memory = {name: memory_mib(pid) for name, pid in dog.pids().items()}
        redis = [name for name in dog.roles if name.startswith("redis-")]
        if peers_gone:
            for name in redis:
                dog.roles[name].proc.kill()
                dog.roles[name].proc.wait()
            times["buffer"] = _time_to_exit(dog, "buffer")
            dog.roles["aggregator"].proc.kill()
            dog.roles["aggregator"].proc.wait()
            for name in WORKERS:
                times[name] = _time_to_exit(dog, name)
        else:
            for name in (*WORKERS, *SERVICES, *redis):
                times[name] = _time_to_exit(dog, name)
    return times, memory


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchReach-v4")
    p.add_argument("--json", help="write the raw result here")
    args = p.parse_args(argv)
    root = pathlib.Path(tempfile.mkdtemp(prefix="fleetrl-stops-"))
    up, memory = run_case(args.task, root / "up", peers_gone=False)
    gone, _ = run_case(args.task, root / "gone", peers_gone=True)
    figures = {"peers_up_sec": up, "peers_gone_sec": gone, "memory_mib": memory}
    if args.json:
        write_result(result_record("stop_times", figures), args.json)
    print(f"\n=== seconds from SIGTERM to exit ({args.task}) ===")
    for case, times in (("peers up", up), ("peers gone", gone)):
        for name, sec in times.items():
            print(f"{case:11s} {name:12s} {sec:6.2f}")
    print(f"\n=== memory per role after {WARMUP_SEC:.0f} s of training (MiB) ===")
    for name, mib in memory.items():
        print(f"{name:12s} rss {mib['rss']:7.1f}  locked {mib['locked']:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
