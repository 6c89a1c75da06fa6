"""The fault table: each fault injected into one running local fleet, and what it cost.

    python3 benchmarks/fault_table.py [--task FetchReach-v4] [--heartbeat-timeout 10] [--out R.json]

Runs `fleetrl train` (watchdog, checkpoints every 100 versions, one evaluation only: it
trains until stopped) and injects, one after another with the fleet recovered in between: SIGKILL of
sampler-0, learner-0, the ingest service and the aggregator; SIGSTOP of sampler-0 and of the
aggregator (found by their silent heartbeats). For each fault it reports:

- `recovered_sec`: from the fault until the replaced role is back at work (a new process
  whose heartbeat shows progress) and the aggregator's version has risen past its value at
  the fault (for the aggregator: past the version its replacement resumed at);
- `versions_reused`: a replaced aggregator resuming at or below a version a role had already
  seen (from every role's heartbeat, read every 0.2 s) would reuse version numbers (goal 0);
- `acked_lost` / `acked_doubled`: after all faults, every batch in the samplers' ack ledgers
  looked up in Redis by an independent reader (goal 0 and 0).

A Redis primary's SIGKILL needs replicas, which the local launcher does not start; its row
comes from `tests/test_e2e_faults.py` (`pytest -s -k redis`). Prints the table LAST.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

import psutil
from harness import print_table, result_record, write_result  # benchmarks/harness.py (this script's folder)

from buffer.storage import TemporalStorage
from foundation.config import RunConfig
from foundation.ledger import read_ledgers
from foundation.transport import REDIS_PASSWORD_ENV, TOKEN_ENV, Security, connect
from sampler.pusher import row_fingerprint
from sim.registry import get_task

FAULTS = [
    ("SIGKILL", "sampler-0"),
    ("SIGKILL", "learner-0"),
    ("SIGKILL", "buffer"),
    ("SIGKILL", "aggregator"),
    ("SIGSTOP", "sampler-0"),
    ("SIGSTOP", "aggregator"),
]
PROGRESS = {"sampler": "env_steps", "learner": "pushed", "buffer": "batches", "aggregator": "version"}


class Fleet:
    """A `fleetrl train` process and what its run directory says."""

    def __init__(self, run_dir: pathlib.Path, task: str, heartbeat_timeout: float) -> None:
        self.run_dir = run_dir
        self.secrets = {TOKEN_ENV: secrets.token_urlsafe(16), REDIS_PASSWORD_ENV: secrets.token_urlsafe(16)}
        argv = [sys.executable, "-m", "fleet.cli.main", "train", "--task", task, "--run-dir", str(run_dir),
                "--max-wall-sec", "3600", "--target-success", "1.0",
                "--set", f"watchdog.heartbeat_timeout_sec={heartbeat_timeout}",
                "--set", "aggregator.checkpoint_every_versions=100",
                "--set", "buffer.capacity_transitions=10000000",
                # one score at the start, then none: the run never reaches its target and stops
                "--set", "eval.min_interval_sec=3600", "--set", "eval.max_interval_sec=3600"]  # fmt: skip
        self.log = open(run_dir.parent / "train.log", "wb")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, **self.secrets, "COLUMNS": "1000"}
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.seen_version = 0

    def beat(self, role: str) -> dict:
        try:
            return json.loads((self.run_dir / "heartbeats" / f"{role}.json").read_text())
        except (OSError, ValueError):
            return {}

    def poll_versions(self) -> int:
        """The newest version any role's heartbeat shows (what has been seen outside the aggregator)."""
        for path in (self.run_dir / "heartbeats").glob("*.json"):
            try:
                version = json.loads(path.read_text()).get("counters", {}).get("version", 0)
            except (OSError, ValueError):
                continue
            self.seen_version = max(self.seen_version, int(version))
        return self.seen_version

    def pid(self, role: str) -> int:
        name, _, index = role.partition("-")
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                cmd = child.cmdline()
            except psutil.Error:  # gone, or a zombie not reaped yet
                continue
            if len(cmd) > 3 and cmd[3] == name and (not index or cmd[cmd.index("--id") + 1] == index):
                return child.pid
        raise RuntimeError(f"no {role} process under the launcher")

    def resumed(self) -> list[int]:
        text = (self.run_dir / "logs" / "aggregator.log").read_text(errors="replace")
        return [int(v) for v in re.findall(r"resuming at version (\d+)", text)]

    def wait(self, condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            self.poll_versions()
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no {what} (launcher exit code {self.proc.poll()}); see {self.run_dir}")
            time.sleep(0.2)

    def redis_addresses(self) -> str:
        text = (self.run_dir.parent / "train.log").read_text(errors="replace")
        match = re.search(r"fleet up: redis (\S+),", text)
        if match is None:
            raise RuntimeError("the launcher did not print its Redis addresses")
        return match.group(1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            self.proc.wait(120)
        self.log.close()


def inject(fleet: Fleet, kind: str, role: str) -> dict:
    old_pid = fleet.pid(role)
    v0, resumed_before = fleet.poll_versions(), len(fleet.resumed())
    start = time.monotonic()
    os.kill(old_pid, signal.SIGKILL if kind == "SIGKILL" else signal.SIGSTOP)
    base = role.partition("-")[0]

    def back() -> bool:
        beat = fleet.beat(role)
        return beat.get("pid") not in (None, old_pid) and beat.get("counters", {}).get(PROGRESS[base], 0) > 0

    fleet.wait(back, 300, f"{role} back at work")
    floor = v0
    if base == "aggregator":
        fleet.wait(lambda: len(fleet.resumed()) > resumed_before, 60, "the aggregator's resume line")
        floor = fleet.resumed()[-1]
    fleet.wait(lambda: fleet.beat("aggregator").get("counters", {}).get("version", 0) > floor, 300, "a new version")
    row = {"fault": f"{kind} {role}", "recovered_sec": round(time.monotonic() - start, 1), "versions_reused": 0}
    if base == "aggregator":
        row["versions_reused"] = max(0, v0 - floor + 1)  # v0 was seen before the fault: resuming at or below it reuses
        row["resumed_at"], row["seen_before"] = floor, v0
    return row


def audit(fleet: Fleet, task: str) -> dict:
    """Every acked batch looked up in Redis (while the fleet runs: acks read first)."""
    ledger = read_ledgers(fleet.run_dir / "acks", "sampler-")
    config = RunConfig.load(fleet.run_dir / "config.json")
    security = Security(redis_user=config.security.redis_user, redis_password=fleet.secrets[REDIS_PASSWORD_ENV])
    client = connect(fleet.redis_addresses(), security)
    storage = TemporalStorage(client, config.run_id, get_task(task).schema(), config.buffer)
    copies = Counter(row_fingerprint(row) for row in storage.committed_rows())
    client.close()
    return {
        "acked_batches": len(ledger),
        "acked_env_steps": sum(r["env_steps"] for r in ledger),
        "acked_lost": sum(copies[r["fingerprint"]] == 0 for r in ledger),
        "acked_doubled": sum(copies[r["fingerprint"]] > 1 for r in ledger),
    }


def fault_rows(task: str, heartbeat_timeout: float) -> tuple[list[dict], dict]:
    """Start the fleet, inject FAULTS one after another with the fleet recovered in between, audit."""
    with tempfile.TemporaryDirectory(prefix="fleetrl-faults-") as tmp:
        fleet = Fleet(pathlib.Path(tmp) / "run", task, heartbeat_timeout)
        rows = []
        try:
            fleet.wait(lambda: fleet.beat("aggregator").get("counters", {}).get("version", 0) >= 300, 300, "warm-up")
            for kind, role in FAULTS:
                rows.append(inject(fleet, kind, role))
                print(f"{rows[-1]}", flush=True)
                time.sleep(5.0)  # the fleet runs settled for a while between faults
            totals = audit(fleet, task)
        finally:
            fleet.stop()
    return rows, totals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="FetchReach-v4")
    p.add_argument("--heartbeat-timeout", type=float, default=10.0, help="watchdog.heartbeat_timeout_sec")
    p.add_argument("--out", help="write the raw result (JSON) here")
    args = p.parse_args(argv)
    rows, totals = fault_rows(args.task, args.heartbeat_timeout)
    figures = {"heartbeat_timeout_sec": args.heartbeat_timeout, "faults": rows, **totals}
    if args.out:
        write_result(result_record("fault_table", figures), args.out)
    print_table("what each fault cost", {r["fault"]: r for r in rows}, ["recovered_sec", "versions_reused"])
    print(
        f"acked batches {totals['acked_batches']} ({totals['acked_env_steps']} env steps): "
        f"lost {totals['acked_lost']}, doubled {totals['acked_doubled']}"
    )
    return 0 if totals["acked_lost"] == 0 and totals["acked_doubled"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
