"""`fleetrl train --mode sync`: the fleet's parts in one alternating process."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest

from fleet.launch.sync import MemoryReplay
from foundation.config import RunConfig
from foundation.wire import Transitions
from sampler.evaluator import score_checkpoint

REPO = pathlib.Path(__file__).resolve().parents[1]


def _transitions(first: int, n: int) -> Transitions:
    ids = np.arange(first, first + n, dtype=np.float32)[:, None]
    return Transitions(ids, ids, ids, ids[:, 0], ids, np.zeros(n, np.float32))


def test_memory_replay_wraps_and_samples_only_what_it_holds():
    replay = MemoryReplay(capacity=10, seed=0)
    replay.add(_transitions(0, 6))
    assert replay.size == 6
    assert set(replay.sample(200).reward.numpy().tolist()) == set(range(6))
    replay.add(_transitions(6, 7))  # 13 rows into 10: rows 0-2 overwritten
    assert replay.size == 10
    assert set(replay.sample(500).reward.numpy().tolist()) == set(range(3, 13))


@pytest.mark.e2e
def test_sync_mode_honours_model_gate_grad(tmp_path):
    from fleet.launch.sync import SyncRun
    from foundation.config import with_overrides
    from nets.moe import MoELinear

    overrides = ['model.kind="moe"', "model.experts=4", "model.gate_grad=false", f'run_dir="{tmp_path}"']
    run = SyncRun(with_overrides(RunConfig(), overrides).validate(), started_at=0.0)
    layers = [m for m in run.model.modules() if isinstance(m, MoELinear)]
    assert layers and not any(layer.gate_grad for layer in layers)


@pytest.mark.e2e
def test_sync_mode_stores_n_step_rows(tmp_path):
    """learner.n_step 3: a 50-step FetchReach episode stores (1 + her_k) x 48 rows (its last two
    steps have no 3 steps left), each reward a sum of up to 3 discounted rewards."""
    from fleet.launch.sync import SyncRun
    from foundation.config import with_overrides

    overrides = ["learner.n_step=3", "sampler.her_k=2", "learner.gamma=0.5", f'run_dir="{tmp_path}"']
    run = SyncRun(with_overrides(RunConfig(), overrides).validate(), started_at=0.0)
    run.collect()
    assert (run.env_steps, run.inserted) == (50, 3 * 48)
    sums = {-(a + 0.5 * b + 0.25 * c) for a in (0, 1) for b in (0, 1) for c in (0, 1)}  # r in {0, -1}
    rewards = set(np.round(run.replay.sample(500).reward.numpy(), 4).tolist())
    assert rewards <= sums and rewards - {0.0, -1.0}, rewards  # some rows sum more than one reward


@pytest.mark.e2e
def test_sync_mode_stores_the_demonstrations_marked_before_its_random_warm_up(tmp_path):
    """sampler.demo_episodes 2: both expert episodes of MetaWorld-reach-v3 (100 steps each, 1 + 2
    HER rows a step) stored marked, their env steps counted; the warm-up's episodes come after."""
    from fleet.launch.sync import SyncRun
    from foundation.config import with_overrides

    overrides = ['sim.task="MetaWorld-reach-v3"', "sampler.demo_episodes=2", "sampler.her_k=2", f'run_dir="{tmp_path}"']
    run = SyncRun(with_overrides(RunConfig(), overrides).validate(), started_at=0.0)
    try:
        run.demonstrate(threading.Event())
        assert (run.demo_episodes, run.env_steps, run.demo_env_steps, run.episodes) == (2, 200, 200, 0)
        assert run.inserted == run.replay.size == 3 * 200
        assert run.replay.sample(64).demo.all()
        run.collect()  # a random warm-up episode: unmarked rows
        assert run.replay.size == 900 and 0.5 < run.replay.sample(900).demo.mean() < 0.9
    finally:
        run.close()


@pytest.mark.parametrize(
    "algo,extra", [("sac", []), ("tqc", []), ("crossq", ["aggregator.adam_beta1=0.5"]), ("sac", ["learner.n_step=3"])]
)
def test_sync_mode_learns_fetch_reach_and_leaves_a_checkpoint(tmp_path, algo, extra):
    run_dir = tmp_path / "sync"
    cmd = [sys.executable, "-m", "fleet.cli.main", "train", "--task", "FetchReach-v4", "--mode", "sync"]
    cmd += ["--run-dir", str(run_dir), "--max-wall-sec", "300", "--set", f'learner.algo="{algo}"']
    for override in extra:
        cmd += ["--set", override]
    subprocess.run(cmd, check=True, cwd=REPO, timeout=600, capture_output=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["mode"], summary["reached_target"]) == ("sync", True), summary["stop_reason"]
    assert summary["code"] == json.loads((run_dir / "code.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    assert rows[-1]["kind"] == "full" and rows[-1]["success_rate"] >= 0.9 and rows[-1]["episodes"] == 50
    config = RunConfig.from_json((run_dir / "config.json").read_text())
    version, result = score_checkpoint(run_dir / "checkpoints", config, episodes=10)
    assert version == summary["final_version"] and result.episodes == 10


@pytest.mark.e2e
def test_sync_mode_trains_and_scores_the_task_sim_tasks_names(tmp_path):
    """sim.tasks ["FetchPush-v4"] beside the default sim.task (FetchReach-v4): run_sync refuses
    the config before it writes anything (sim.task must be sim.tasks[0]), and SyncRun, handed it
    unchecked, still takes the run's one task as every role of the fleet reads it
    (TaskSet.for_run): the networks, the training env and the evaluation env are all Push's."""
    from fleet.launch.sync import SyncRun, run_sync
    from foundation.config import ConfigError, with_overrides

    config = with_overrides(RunConfig(), ['sim.tasks=["FetchPush-v4"]', f'run_dir="{tmp_path}"'])
    with pytest.raises(ConfigError, match=r"sim\.task \('FetchReach-v4'\) must be sim\.tasks\[0\] \('FetchPush-v4'\)"):
        run_sync(config, started_at=0.0, stop=threading.Event())
    assert not (tmp_path / "config.json").exists()
    run = SyncRun(config, started_at=0.0)
    try:
        assert run.task.name == "FetchPush-v4" and run.spec.obs_dim == 25
        assert run.env.observation_space["observation"].shape == (25,)
        assert run.eval_env.observation_space["observation"].shape == (25,)
        assert run.summary.task == "FetchPush-v4"
    finally:
        run.close()


def test_sync_mode_refuses_a_multi_task_run_naming_sim_tasks(tmp_path):
    from fleet.launch.sync import SyncRun
    from foundation.config import ConfigError, with_overrides

    overrides = ['sim.tasks=["FetchReach-v4", "FetchPush-v4"]', f'run_dir="{tmp_path}"']
    with pytest.raises(ConfigError, match=r"sim\.tasks .*FetchPush-v4.* must name one task for --mode sync"):
        SyncRun(with_overrides(RunConfig(), overrides).validate(), started_at=0.0)
    assert not (tmp_path / "config.json").exists()  # refused before the run directory is written
