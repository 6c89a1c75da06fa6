"""The timeline of a Slurm job warned and requeued mid-run, as the real-daemon test measures it.

    python3 benchmarks/slurm_requeue.py [--json out.json]

Runs tests/test_slurm_requeue.py (real slurmctld and slurmd, a two-host FetchReach fleet in one
job; it needs what tests/test_slurm.py needs) and keeps what it prints: each event's seconds
after submission (submitted, started, warned, checkpointed, fleet stopped, requeued, resumed,
the resumed life started, summary written, completed) and the resumed run's outcome (its state,
stop reason, resumes, and the version at the requeue and at the end). The test asserts the
events come in that order and the run completes; this script only records its figures.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys

from harness import result_record, write_result  # benchmarks/harness.py (this script's folder)

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEST = "tests/test_slurm_requeue.py"
OUTCOME = re.compile(
    r"^job (\d+): (\w+); (.+); resumes (\d+); version (\d+) at the requeue, (\d+) at the end$", re.MULTILINE
)


def parse(output: str) -> dict:
    """The test's printed timeline and outcome."""
    timeline = [
        {"sec_after_submission": float(sec), "event": event.strip()}
        for sec, event in re.findall(r"^\s+(\d+\.\d)\s+(\S.*)$", output, re.MULTILINE)
    ]
    found = OUTCOME.search(output)
    if not timeline or found is None:
        raise SystemExit(f"{TEST} printed no timeline:\n{output[-3000:]}")
    job, state, reason, resumes, at_requeue, at_end = found.groups()
    outcome = {
        "job": job,
        "state": state,
        "stop_reason": reason,
        "resumes": int(resumes),
        "version_at_requeue": int(at_requeue),
        "final_version": int(at_end),
    }
    return {"timeline": timeline, "outcome": outcome}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the raw result here")
    args = p.parse_args(argv)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", TEST],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        raise SystemExit(f"{TEST} failed ({run.returncode}):\n{run.stdout[-3000:]}{run.stderr[-2000:]}")
    figures = parse(run.stdout)
    for row in figures["timeline"]:
        print(f"{row['sec_after_submission']:7.1f}  {row['event']}")
    print(figures["outcome"])
    if args.json:
        write_result(result_record("slurm_requeue", {**figures, "test": TEST}), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
