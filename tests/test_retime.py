"""A policy trained at 25 Hz run at 120 Hz: its velocity inputs re-timed (deploy_npu/retime.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from aggregator.core import AggregatorCore
from deploy_npu.retime import retime_factor, retimed
from foundation.checkpoint import load_policy_checkpoint, save_checkpoint
from foundation.config import RunConfig, tasks_overrides, with_overrides
from foundation.policy import model_spec
from nets.models import build_actor
from sim.rate import velocity_columns
from sim.registry import get_task, make_env


def _hand_moving(task: str, hz: float) -> tuple[np.ndarray, np.ndarray]:
    """Observations of the last two decisions of 0.3 s of a full-scale +x push of the hand."""
    env = make_env(task, control_hz=hz)
    obs, _ = env.reset(seed=0)
    seen = [obs["observation"]]
    for _ in range(round(0.3 * (hz or 25.0))):
        obs, *_ = env.step(np.array([1.0, 0.0, 0.0, 0.0], np.float32))
        seen.append(obs["observation"])
    env.close()
    return seen[-2], seen[-1]


@pytest.mark.parametrize("task,grip_velp", [("FetchPush-v4", 20), ("FetchReach-v4", 5)])
def test_the_velocity_columns_are_the_hands_displacement_per_decision_at_either_rate(task, grip_velp):
    assert velocity_columns(get_task(task).obs_dim).start <= grip_velp < velocity_columns(get_task(task).obs_dim).stop
    per_decision = {}
    for hz in (25.0, 120.0):
        before, after = _hand_moving(task, hz)
        moved = after[0] - before[0]  # the grip's x over the last decision
        # velocity x dt: 0.71 of the displacement at 25 Hz (the hand lags its target within a
        # decision), 0.97 at 120 Hz; a position column would be far off, another velocity 0
        assert 0.6 * moved < after[grip_velp] < 1.05 * moved, (hz, after[grip_velp], moved)
        per_decision[hz] = after[grip_velp]
    # The hand keeps its speed at 120 Hz (sim/rate.py), so re-timed it reads as at 25 Hz (a
    # 0.3 s push here, the calibration's 0.4 s) where the decision lengths alone read 1.37x that.
    factor = retime_factor(get_task(task), 25.0, 120.0)
    assert per_decision[120.0] * factor == pytest.approx(per_decision[25.0], rel=0.1)
    assert per_decision[120.0] * 120.0 / 25.0 > 1.25 * per_decision[25.0]


def _checkpoint(tmp_path, *overrides: str, tasks: list[str] | None = None):
    from sim.tasks import TaskSet

    sets = tasks_overrides(tasks) if tasks else ['sim.task="FetchPush-v4"']
    config = with_overrides(RunConfig(), [*sets, "learner.hidden_sizes=[32, 32]", *overrides])
    dims = TaskSet.of(tasks) if tasks else get_task("FetchPush-v4")
    core = AggregatorCore(model_spec(config, dims), config.aggregator, 1, 1, getattr(dims, "label", "FetchPush-v4"))
    save_checkpoint(tmp_path / "checkpoints", core.state(), keep=1)
    ckpt = load_policy_checkpoint(tmp_path / "checkpoints")
    rng = np.random.default_rng(0)  # statistics that are not the identity, as after training
    mean, std = ckpt.spec.split_norm(ckpt.obs_norm)
    norm = np.concatenate([rng.normal(size=mean.size), rng.uniform(0.01, 2.0, std.size)]).astype(np.float32)
    return dataclasses.replace(ckpt, obs_norm=norm)


@pytest.mark.parametrize("multi", [False, True])
def test_a_retimed_checkpoint_acts_on_x_as_the_original_on_x_with_its_velocities_scaled(tmp_path, multi):
    tasks = ["FetchReach-v4", "FetchPush-v4"] if multi else None
    ckpt = _checkpoint(tmp_path, tasks=tasks)
    push = get_task("FetchPush-v4")
    place = 1 if multi else 0
    fast = retimed(ckpt, push, trained_hz=25.0, hz=120.0, place=place)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, ckpt.spec.input_dim)).astype(np.float32)
    if multi:  # Push's rows: its one-hot set, the padding zero (Push is the widest here)
        x[:, ckpt.spec.one_hot[0] : ckpt.spec.one_hot[1]] = np.eye(2)[place]
    scaled = x.copy()
    scaled[:, velocity_columns(push.obs_dim)] *= retime_factor(push, 25.0, 120.0)
    task = torch.full((16,), place)

    def act(c, rows):
        return build_actor(c.spec, c.actor, c.obs_norm).deterministic(torch.from_numpy(rows), task).detach().numpy()

    np.testing.assert_allclose(act(fast, x), act(ckpt, scaled), rtol=1e-5, atol=1e-6)
    assert not np.allclose(act(ckpt, x), act(ckpt, scaled), atol=1e-3)  # the velocities matter to this policy
    if multi:  # Reach's statistics are left as they were
        reach_mean = ckpt.spec.split_norm(ckpt.obs_norm)[0][0]
        np.testing.assert_array_equal(fast.spec.split_norm(fast.obs_norm)[0][0], reach_mean)


def test_equal_rates_change_nothing_and_only_fetch_tasks_are_retimed(tmp_path):
    ckpt = _checkpoint(tmp_path)
    assert retimed(ckpt, get_task("FetchPush-v4"), 25.0, 25.0) is ckpt
    with pytest.raises(ValueError, match="only Fetch tasks"):
        retimed(ckpt, get_task("MetaWorld-reach-v3"), 25.0, 120.0)
    with pytest.raises(ValueError, match="must be > 0"):
        retime_factor(get_task("FetchPush-v4"), 0.0, 120.0)


def test_an_export_finds_its_runs_training_rate_beside_the_checkpoints(tmp_path):
    from deploy_npu.pipeline import run_control_hz

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "ckpt_0000000001.pt").write_bytes(b"")
    assert run_control_hz(str(run / "checkpoints")) == 25.0  # no config.json: Fetch's own rate
    (run / "config.json").write_text(with_overrides(RunConfig(), ["sim.control_hz=120"]).to_json())
    assert run_control_hz(str(run / "checkpoints")) == 120.0
    assert run_control_hz(str(run / "checkpoints" / "ckpt_0000000001.pt")) == 120.0
