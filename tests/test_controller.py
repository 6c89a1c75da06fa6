"""`fleetrl deploy-check`: the exported policy as a fixed-rate controller."""

from __future__ import annotations

import pytest

from aggregator.core import AggregatorCore
from deploy_npu.controller import controller_check
from foundation.checkpoint import save_checkpoint
from foundation.config import RunConfig, with_overrides
from foundation.policy import model_spec
from sim.registry import get_task


def _run_dir(tmp_path, *overrides: str):
    config = with_overrides(RunConfig(), ['sim.task="FetchReach-v4"', *overrides])
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(config.to_json())
    task = get_task("FetchReach-v4")
    core = AggregatorCore(model_spec(config, task), config.aggregator, 1, 1, task.name)
    save_checkpoint(tmp_path / "checkpoints", core.state(), keep=1)
    return tmp_path


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_the_exported_policy_drives_the_task_at_120_hz_beside_the_torch_policy(tmp_path, kind):
    run_dir = _run_dir(tmp_path, f'model.kind="{kind}"', "model.experts=4", "learner.hidden_sizes=[32, 32]")
    report = controller_check(run_dir, hz=120.0, delay_ms=25.0, episodes=2)
    assert report.ticks == 2 * 240  # 2 s episodes at 120 Hz
    assert report.delay_ticks == 3  # 25 ms at 8.33 ms a tick
    assert report.onnx_successes == report.torch_successes or kind == "moe"  # dense: the same graph, the same acts
    assert 0 <= report.deadline_misses <= report.ticks and report.p50_ms <= report.max_ms
    assert (run_dir / "deploy" / "policy.onnx").exists()
    assert "trained at 25 Hz" in report.summary()  # the run trained at Fetch's own rate
    trained_fast = controller_check(_run_dir(tmp_path / "fast", "sim.control_hz=120"), hz=120.0, episodes=1)
    assert "trained at" not in trained_fast.summary()


def test_a_multi_task_run_is_checked_task_by_task_on_each_tasks_own_input(tmp_path):
    from deploy_npu.controller import controller_checks
    from sim.tasks import TaskSet

    tasks = ["FetchReach-v4", "MetaWorld-reach-v3"]
    config = with_overrides(
        RunConfig(), [f"sim.tasks={tasks}".replace("'", '"'), 'model.kind="moe"', "learner.hidden_sizes=[32]"]
    )
    (tmp_path / "config.json").write_text(config.to_json())
    task_set = TaskSet.of(tasks)
    core = AggregatorCore(model_spec(config, task_set), config.aggregator, 1, 1, task_set.label)
    save_checkpoint(tmp_path / "checkpoints", core.state(), keep=1)
    reports, skipped = controller_checks(tmp_path, hz=120.0, delay_ms=10.0, episodes=1)
    assert [r.task for r in reports] == tasks and skipped == {}
    # Each task's own seconds at 120 Hz: FetchReach's 2 s (50 at 25 Hz), MetaWorld-reach's 1.25 s
    # (100 at 80 Hz), each trained at its own rate.
    assert [(r.ticks, r.trained_hz, r.delay_ticks) for r in reports] == [(240, 25.0, 1), (150, 80.0, 1)]
    assert "nothing is re-timed" in reports[1].summary() and "re-timed" in reports[0].summary()
    for task in tasks:
        assert (tmp_path / "deploy" / f"{task}.onnx").exists()
    controller_checks(tmp_path, hz=120.0, delay_ms=0.0, episodes=1, onnx_path=tmp_path / "elsewhere")
    assert sorted(p.name for p in (tmp_path / "elsewhere").glob("*.onnx")) == sorted(f"{t}.onnx" for t in tasks)
    # Below Meta-World's own 80 Hz the Fetch task is checked and the Meta-World one is skipped
    # with the reason (it used to end the whole check in a traceback).
    reports, skipped = controller_checks(tmp_path, hz=25.0, delay_ms=0.0, episodes=1)
    assert [(r.task, r.ticks) for r in reports] == [("FetchReach-v4", 50)]
    assert list(skipped) == ["MetaWorld-reach-v3"]
    assert "below MetaWorld-reach-v3's own 80 Hz" in skipped["MetaWorld-reach-v3"]


def test_deploy_check_writes_its_figures_as_json_and_exits_by_the_deadline_verdict(tmp_path):
    import json

    from fleet.cli.main import main

    run_dir = _run_dir(tmp_path / "run", "learner.hidden_sizes=[32, 32]")
    out = tmp_path / "check.json"
    code = main(["deploy-check", str(run_dir), "--hz", "25", "--delay-ms", "0", "--episodes", "1", "--json", str(out)])
    result = json.loads(out.read_text())
    assert (result["hz"], result["delay_ms"], result["run_dir"]) == (25.0, 0.0, str(run_dir))
    [row] = result["tasks"]
    assert row["task"] == "FetchReach-v4" and row["ticks"] == 50 and row["episodes"] == 1
    assert code == (0 if row["passed"] else 1) and row["passed"] == (row["deadline_misses"] == 0)


def test_a_run_trained_on_the_nominal_task_is_still_checked_randomized_unless_asked_nominal(tmp_path, monkeypatch):
    # deploy-check once drove such a run on the nominal task while its summary said "randomization
    # on": the sim it drives now follows the flag, and the report says which it was.
    import deploy_npu.controller as controller

    seen = []
    real_drive = controller.drive

    def spy(policy, spec, hz, randomization, **setting):
        seen.append(randomization)
        return real_drive(policy, spec, hz, randomization, **setting)

    monkeypatch.setattr(controller, "drive", spy)
    run_dir = _run_dir(tmp_path, "learner.hidden_sizes=[32]", "sim.randomization.enabled=false")
    report = controller_check(run_dir, hz=25.0, delay_ms=0.0, episodes=1)
    assert [r.enabled for r in seen] == [True, True]  # ONNX and torch, both randomized
    assert tuple(seen[0].friction_scale) == (0.8, 1.2)  # the run's ranges (here the defaults)
    assert (report.randomized, report.trained_randomized) == (True, False)
    assert "randomization on (the run's ranges, which it trained without" in report.summary()
    seen.clear()
    report = controller_check(run_dir, hz=25.0, delay_ms=0.0, episodes=1, nominal=True)
    assert [r.enabled for r in seen] == [False, False] and not report.randomized
    assert "randomization off (the nominal task)" in report.summary()
    trained_randomized = controller_check(_run_dir(tmp_path / "r", "learner.hidden_sizes=[32]"), hz=25.0, episodes=1)
    assert "randomization on (the run's ranges)," in trained_randomized.summary()
