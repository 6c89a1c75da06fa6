"""Meta-World MT10 as ten controllers: one MoE run's checkpoint exports a frozen-routing graph per
task, and deploy-check drives every one of them at 120 Hz with one tick of delay (none skipped)."""

from __future__ import annotations

import json

from aggregator.core import AggregatorCore
from fleet.cli.presets import preset_for
from foundation.checkpoint import save_checkpoint
from foundation.config import RunConfig, tasks_overrides, with_overrides
from foundation.policy import model_spec
from sim.task_sets import task_set
from sim.tasks import TaskSet

MT10 = list(task_set("mt10"))


def _mt10_moe_run(tmp_path):
    """A run directory holding an MT10 MoE checkpoint as `fleetrl train --tasks mt10 --set
    model.kind="moe"` configures it (the multi-task MoE recipe: task-routed, one shared expert),
    at a width that keeps the test short."""
    overrides = [*tasks_overrides(MT10), 'model.kind="moe"', "model.experts=16", "model.expert_width=32"]
    user = with_overrides(RunConfig(), overrides)
    config = with_overrides(preset_for(user, overrides), overrides)
    assert (config.model.router, config.model.top_k, config.model.shared_experts) == ("task", 3, 1)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(config.to_json())
    tasks = TaskSet.of(MT10)
    core = AggregatorCore(model_spec(config, tasks), config.aggregator, 1, 1, tasks.label)
    save_checkpoint(tmp_path / "checkpoints", core.state(), keep=1)
    return tmp_path


def test_an_mt10_moe_run_exports_ten_frozen_routing_controllers_and_each_runs_at_120_hz(tmp_path, capsys):
    from fleet.cli.main import main as fleetrl

    run_dir = _mt10_moe_run(tmp_path / "run")
    # Budget: the graphs are what this test checks, not this machine's load (no timed asserts).
    export = ["export", str(run_dir), "--episodes", "1", "--latency-calls", "50", "--budget-ms", "1000"]
    assert fleetrl(export) == 0, capsys.readouterr().out
    deploy = run_dir / "deploy"
    assert {p.name for p in deploy.glob("*.onnx")} == {f"{t}.onnx" for t in MT10} | {"multitask.onnx"}
    for task in MT10:
        manifest = json.loads((deploy / f"{task}.onnx.manifest.json").read_text())
        assert manifest["tasks"] == [task] and manifest["checks"]["audit_passed"]
        assert manifest["checks"]["parity_max_abs_error"] <= 1e-5
        assert "TopK" not in manifest["checks"]["ops"] and "Gather" not in manifest["checks"]["ops"]
        routing = manifest["routing"]  # the task's frozen table: a task router's gates are the task's alone
        assert routing["task"] == task and routing["agreement"] == 1.0
    capsys.readouterr()

    out = tmp_path / "check.json"
    check = ["deploy-check", str(run_dir), "--hz", "120", "--delay-ms", "10", "--episodes", "1", "--json", str(out)]
    code = fleetrl(check)
    result = json.loads(out.read_text())
    rows = result["tasks"]
    assert [r["task"] for r in rows] == MT10  # every task, none skipped
    # Each task's own seconds at 120 Hz (reach's 100 decisions at Meta-World's 80 Hz: 150 ticks; the
    # others' 150: 225 ticks), one tick late.
    expected = [(150 if t == "MetaWorld-reach-v3" else 225, 1, True) for t in MT10]
    assert [(r["ticks"], r["delay_ticks"], r["randomized"]) for r in rows] == expected
    assert code == (0 if all(r["passed"] for r in rows) else 1)
