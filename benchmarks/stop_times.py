"""Seconds from SIGTERM to exit for every role, with its peers up and with its peers gone.

    python3 benchmarks/stop_times.py [--task FetchReach-v4] [--json out.json]

Twice, a local fleet (Redis Cluster, buffer, aggregator, sampler, learner, evaluator) is
started by fleetrl.launch.LocalFleet and given time to train:
(a) peers up: each role gets SIGTERM in turn (workers first, then the services), the others
    still running;
(b) peers gone: the Redis nodes, the buffer and the aggregator are SIGKILLed first (a host
    lost), then every remaining role gets SIGTERM.
Printed last: one line per role and case (issue goal: <= 5 s each).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import sys
import tempfile
import time
from contextlib import closing

from common import result_record, write_result  # benchmarks/common.py (this script's folder)

from fleetrl.config import with_overrides
from fleetrl.launch import LocalFleet
from fleetrl.presets import preset_config
from fleetrl.watchdog import Watchdog

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


def run_case(task: str, run_dir: pathlib.Path, peers_gone: bool) -> dict[str, float]:
    config = with_overrides(preset_config(task), ["run_id=stops", f"run_dir={json.dumps(str(run_dir))}"]).validate()
    fleet = LocalFleet(config, started_at=time.monotonic())
    fleet.prepare()
    cluster = fleet.make_cluster()
    times: dict[str, float] = {}
    with closing(cluster), Watchdog(run_dir / "logs", stop_grace_sec=60.0) as dog:
        fleet.start_roles(dog, cluster, max_restarts=0)
        time.sleep(WARMUP_SEC)
        if peers_gone:
            for pid in cluster.pids:
                os.kill(pid, signal.SIGKILL)
            for name in SERVICES:
                dog.roles[name].proc.send_signal(signal.SIGKILL)
                dog.roles[name].proc.wait()
            for name in WORKERS:
                times[name] = _time_to_exit(dog, name)
        else:
            for name in (*WORKERS, *SERVICES):
                times[name] = _time_to_exit(dog, name)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchReach-v4")
    p.add_argument("--json", help="write the raw result here")
    args = p.parse_args(argv)
    root = pathlib.Path(tempfile.mkdtemp(prefix="fleetrl-stops-"))
    up = run_case(args.task, root / "up", peers_gone=False)
    gone = run_case(args.task, root / "gone", peers_gone=True)
    figures = {"peers_up_sec": up, "peers_gone_sec": gone}
    if args.json:
        write_result(result_record("stop_times", figures), args.json)
    print(f"\n=== seconds from SIGTERM to exit ({args.task}) ===")
    for case, times in (("peers up", up), ("peers gone", gone)):
        for name, sec in times.items():
            print(f"{case:11s} {name:12s} {sec:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
