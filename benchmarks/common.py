"""What every benchmark shares: the raw-result record (figures + commit + command).

record = result_record("learner_throughput", figures_dict)
write_result(record, "benchmarks/results/learner_throughput-push.json")
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
from typing import Any

REPO = pathlib.Path(__file__).resolve().parent.parent


def git_commit() -> str:
    """HEAD's hash, with '+dirty' when the work tree has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty.strip() else "")


def result_record(benchmark: str, figures: dict[str, Any]) -> dict[str, Any]:
    return {
        "benchmark": benchmark,
        "command": " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]]),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cores": len(os.sched_getaffinity(0)), "cpu": platform.processor() or platform.machine()},
        "figures": figures,
    }


def write_result(record: dict[str, Any], path: str | os.PathLike) -> None:
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"raw result: {out}", file=sys.stderr)
