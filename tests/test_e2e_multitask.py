"""End-to-end: one fleet trains several tasks at once (`fleetrl train --tasks`).

Real Redis Cluster, real gRPC services, every role its own OS process. The run is short: it
checks the plumbing a user relies on (every task's transitions acked and stored, balanced
batches trained on, per-task scores in evals.jsonl, TensorBoard and summary.json), not
learning.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from foundation.checkpoint import load_checkpoint

pytestmark = pytest.mark.e2e

TASKS = ("FetchReach-v4", "FetchPush-v4")


@pytest.mark.parametrize("sampling", ["success", "focus"])
def test_a_multi_task_moe_run_scores_and_reports_every_task(tmp_path: pathlib.Path, sampling: str) -> None:
    run_dir = tmp_path / "run"
    settings = {
        "model.kind": '"moe"',  # the task embedding reaches the gates in every role
        "aggregator.swa": '"layered"',  # the evaluator scores the weight average beside the live policy
        "eval.curve_episodes": "2",
        "eval.episodes": "4",
        "eval.final_episodes": "2",
        "eval.min_interval_sec": "3",
        "eval.max_interval_sec": "3",
        "learner.min_replay_transitions": "300",
        "learner.batch_size": "256",  # a minute's run: not the multi-task recipe's 1024 (fleet/cli/presets.py)
        "sampler.random_steps": "100",
        "learner.task_sampling": f'"{sampling}"',  # batches shared by the evaluator's per-task scores
    }
    sets = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    proc = subprocess.run(
        [sys.executable, "-m", "fleet.cli.main", "train", "--tasks", ",".join(TASKS), "--run-dir", str(run_dir)]
        + ["--max-wall-sec", "60", "--target-success", "1.0", *sets],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "COLUMNS": "160"},
    )
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["tasks"] == list(TASKS), summary
    # Every task's env steps were acked and stored. One sampler takes every task, by the same
    # shares as the batches. 'success': Push, never solved in a minute, never gets fewer env
    # steps than Reach (two 50-step episodes in flight aside), and more once Reach scores.
    steps = summary["task_env_steps"]
    assert set(steps) == set(TASKS) and min(steps.values()) >= 100, steps
    if sampling == "success":
        assert steps[TASKS[1]] >= steps[TASKS[0]] - 2 * 50 * 2, steps
    assert summary["final_version"] > 50, summary
    # Per-task scores: each evaluator report carries every task's rate, the mean beside them.
    evals = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    assert evals, "no evaluation reported"
    for row in evals:
        assert set(row["task_success"]) == set(TASKS), row
        mean = sum(row["task_success"].values()) / len(TASKS)
        assert abs(row["success_rate"] - mean) < 1e-9, row
    assert set(summary["task_success"]) == set(TASKS)
    for task in TASKS:
        assert {"best", "last", "final"} <= set(summary["task_success"][task]), summary["task_success"]
    assert summary["final_success_episodes"] == 2  # per task
    events = EventAccumulator(str(run_dir / "tb" / "fleet")).Reload()
    tags = set(events.Tags()["scalars"])
    assert {f"eval/curve_success/{task}" for task in TASKS} <= tags, tags
    # The MoE routers saw both tasks: expert load is measured per layer as in a one-task run.
    assert summary["expert_load"], "no expert-load metrics from the MoE learner"
    # ... and what each task is routed to, read from the newest checkpoint (the task router).
    routing = summary["expert_routing"]
    assert set(routing) == {"actor", "critic.q1", "critic.q2", "version"}, routing.keys()
    # The recipe's routing (fleet/cli/presets.py TASK_ROUTED_SHARED): top_k 3, expert 0 in every task's.
    for layer in routing["actor"].values():
        assert set(layer["tasks"]) == set(TASKS)
        assert all(len(t["experts"]) == 3 and 0 in t["experts"] for t in layer["tasks"].values()), layer
        assert set(layer["overlap"]) == {"|".join(TASKS)}
    # The multi-task recipe starts two learners (fleet/cli/presets.py MULTITASK): each took its
    # batch shares, and the sampler its env-step shares, from curve scores by the run's rule:
    # 'focus' gives one task all but the other's floor (0.1).
    assert {"learner-0", "learner-1"} <= set(summary["cpu"]["roles"]), summary["cpu"]["roles"].keys()
    for role in ("learner-0", "learner-1", "sampler-0"):
        log = (run_dir / "logs" / f"{role}.log").read_text()
        lines = [line for line in log.splitlines() if f"task shares ({sampling}) from the v" in line]
        assert lines, log[-3000:]
        if sampling == "focus":
            assert all(sorted(re.findall(r"': (0\.\d+)", line)) == ["0.1", "0.9"] for line in lines), lines
    # Layered SWA: scored live versions were offered, the average was scored beside them, and
    # the checkpoint carries it for fleetrl export.
    averaged = [row for row in evals if row["kind"] == "swa_curve"]
    assert averaged and all(row["swa_versions"] for row in averaged), evals
    state = load_checkpoint(run_dir / "checkpoints")
    assert state["swa"]["actor"] is not None and state["swa"]["admitted"] >= 1, state["swa"]
