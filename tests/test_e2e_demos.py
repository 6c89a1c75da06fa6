"""End-to-end: a real fleet run with demonstrations (sampler.demo_episodes) on a Meta-World task:
`fleetrl train` starts Redis Cluster, the services and every role; the samplers store the
scripted expert's episodes and the learner clones them through the Q-filter. The run starts from
the task's preset (shaped reward, LayerNorm critics, two learners), the settings below on top."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = pytest.mark.e2e

TASK = "MetaWorld-reach-v3"
SETTINGS = {
    "sampler.demo_episodes": "2",
    "sampler.num_samplers": "2",  # each sampler stores one of the two episodes
    "sampler.random_steps": "200",
    "learner.batch_size": "64",
    # the demonstrations' 2 x 100 rows (the shaped reward stores each step once) and the warm-up's: the first
    # batches hold both
    "learner.min_replay_transitions": "400",
    "learner.hidden_sizes": "[64, 64]",
    "eval.min_interval_sec": "1000",  # one score at the first version, then none within the run
    "eval.max_interval_sec": "1000",
    "eval.curve_episodes": "2",
    "eval.episodes": "2",
    "eval.final_episodes": "0",
}


def test_a_fleet_run_stores_its_demonstrations_and_its_learner_clones_them(tmp_path: pathlib.Path) -> None:
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "fleet.cli.main", "train", "--task", TASK, "--run-dir", str(run_dir)]
    cmd += ["--max-wall-sec", "45"] + [arg for key, value in SETTINGS.items() for arg in ("--set", f"{key}={value}")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "COLUMNS": "120"})
    out = proc.stdout + proc.stderr
    assert (run_dir / "summary.json").exists(), out[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"].startswith("max_wall_sec"), out[-4000:]
    assert summary["demo_episodes"] == 2, summary
    samplers = [summary["counters"][f"sampler-{i}"] for i in (0, 1)]
    assert [c["demo_episodes"] for c in samplers] == [1, 1] and sum(c["demo_successes"] for c in samplers) == 2
    assert summary["final_env_steps"] >= 200  # the demonstrations' env steps count
    events = EventAccumulator(str(run_dir / "tb" / "aggregator")).Reload()
    scalars = {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    for tag in ("learner/loss/bc", "learner/demo/share", "learner/demo/q_filter_pass"):
        assert scalars.get(tag), f"no {tag} in {sorted(scalars)}"
    assert max(scalars["learner/demo/share"]) > 0 and max(scalars["learner/loss/bc"]) > 0
    assert all(0.0 <= v <= 1.0 for v in scalars["learner/demo/q_filter_pass"])
