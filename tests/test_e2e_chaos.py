"""The chaos soak end to end: a real FetchReach fleet, faults one after another, audited.

benchmarks/chaos_soak.py as a user runs it (real redis-server nodes with replicas, real role
processes under the watchdog): a learner, a Redis primary, the aggregator and a sampler are
SIGKILLed or SIGSTOPped six seconds apart, and the auditor (fleet/chaos/audit.py) finds every acked
batch in Redis once, no gradient applied twice and no version reused. The run ends once
the last fault has recovered.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e
REPO = pathlib.Path(__file__).resolve().parents[1]
PLAN = "SIGKILL learner-0,SIGKILL redis-primary,SIGKILL aggregator,SIGSTOP sampler-1"


def test_a_short_soak_loses_doubles_and_reuses_nothing(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "soak.json"
    # The run ends once the plan's last fault has recovered (the cap is a bound against hanging);
    # one score at the start, then none: it never stops at the target first; no final score.
    argv = [sys.executable, "benchmarks/chaos_soak.py", "--task", "FetchReach-v4", "--every", "6", "--first", "6",
            "--stop-sec", "3", "--plan", PLAN, "--max-wall-sec", "400", "--target-success", "1.0",
            "--run-dir", str(tmp_path / "run"), "--out", str(out), "--set", "eval.final_episodes=0",
            "--set", "eval.min_interval_sec=3600", "--set", "eval.max_interval_sec=3600"]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())["figures"]
    faults = {f["fault"]: f for f in figures["faults"]}
    assert list(faults) == PLAN.split(","), done.stdout[-3000:]
    assert figures["summary"]["stop_reason"] == "fault plan done: 4 faults, every one recovered", figures["faults"]
    batches, gradients = figures["batches"], figures["gradients"]
    assert batches["acked_batches"] > 0 and gradients["acked"] > 0
    assert figures["evicted_windows"] == 0
    assert (batches["lost"], batches["doubled"], batches["acked_twice"]) == (0, 0, 0), batches
    assert (gradients["applied_twice"], gradients["versions_reused"]) == (0, 0), gradients
    assert figures["aggregator_restarts"] == 1 and figures["errors"] == []
    assert done.returncode == 0, done.stdout[-3000:]
