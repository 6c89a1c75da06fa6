"""The tables benchmarks build from raw results: pure logic over synthetic records."""

from __future__ import annotations

import importlib
import json
import pathlib

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def multitask_moe(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("multitask_moe")


def _record(run_dir: str, push_min: float | None, final: dict[str, float], commit: str) -> dict:
    live = {"task_success": final, "success_rate": sum(final.values()) / len(final)}
    run = {
        "run_dir": run_dir,
        "minutes_to_90": {"FetchPush-v4": push_min, "FetchReach-v4": 1.0},
        "updates_per_sec": 40.0,
        "marks": {"15": {"checkpoint": "a.pt", "live": live}, "45": {"checkpoint": "b.pt", "live": live}},
    }
    return {"benchmark": "multitask_moe", "commit": commit, "figures": {"marks_min": [15.0, 45.0], "runs": [run]}}


def test_combine_checks_each_goal_on_every_seed_and_a_missed_target_has_no_median(multitask_moe):
    good = {"FetchReach-v4": 1.0, "FetchPush-v4": 0.96}
    records = [
        _record("r/moe-seed0", 20.0, good, "c0"),
        _record("r/moe-seed1", None, {"FetchReach-v4": 1.0, "FetchPush-v4": 0.5}, "c1"),
        _record("r/dense-seed0", 18.0, {"FetchReach-v4": 1.0, "FetchPush-v4": 1.0}, "c2"),
    ]
    figures = multitask_moe.combine(records, single_task_minutes=10.0)
    moe = figures["arms"]["moe"]
    assert moe["seeds"] == ["moe-seed0", "moe-seed1"]
    assert moe["cost_of_sharing"] == [2.0, None]
    assert moe["minutes_to_90"]["FetchPush-v4"] == {"reached": 1, "of": 2, "median": None, "values": [20.0, None]}
    assert moe["reach_and_push_at_last_mark"] == [0.96, 0.5]
    assert figures["goals"]["moe_reach_and_push_ge_0.9_every_seed"] is False
    assert figures["goals"]["moe_cost_of_sharing_le_2_every_seed"] is False
    assert figures["goals"]["mean_over_tasks_at_last_mark"] == {"moe": 0.865, "dense": 1.0}
    assert figures["goals"]["moe_mean_ge_dense_mean"] is False
    assert figures["goals"]["moe_minus_dense"] == {"difference": -0.135, "standard_error": None, "seeds": [2, 1]}
    assert [r["scored_at"] for r in figures["runs"]] == ["c0", "c1", "c2"]
    assert figures["by_mark"]["moe"]["45min/live"]["FetchPush-v4"] == {"mean": 0.73, "min": 0.5, "max": 0.96, "n": 2}

    records[1] = _record("r/moe-seed1", 19.0, good, "c1")
    records[2] = _record("r/dense-seed0", 18.0, {"FetchReach-v4": 1.0, "FetchPush-v4": 0.9}, "c2")
    figures = multitask_moe.combine(records, single_task_minutes=10.0)
    assert figures["arms"]["moe"]["minutes_to_90"]["FetchPush-v4"]["median"] == 19.5
    assert figures["goals"]["moe_reach_and_push_ge_0.9_every_seed"] is True
    assert figures["goals"]["moe_cost_of_sharing_le_2_every_seed"] is True
    assert figures["goals"]["moe_mean_ge_dense_mean"] is True
    records[1] = _record("r/moe-seed1", 20.03, good, "c1")  # 2.003: the goal is checked unrounded
    figures = multitask_moe.combine(records, single_task_minutes=10.0)
    assert figures["arms"]["moe"]["cost_of_sharing"] == [2.0, 2.0]
    assert figures["goals"]["moe_cost_of_sharing_le_2_every_seed"] is False


def test_combine_checks_every_moe_arm_against_dense_with_the_seeds_standard_error(multitask_moe):
    def rec(run_dir: str, push: float) -> dict:
        return _record(run_dir, 12.0, {"FetchReach-v4": 1.0, "FetchPush-v4": push}, "c")

    records = [rec("r/moe-shared-seed0", 0.9), rec("r/moe-shared-seed1", 1.0)]
    records += [rec("r/dense-seed0", 0.8), rec("r/dense-seed1", 1.0), rec("r/moe-seed0", 0.6)]
    goals = multitask_moe.combine(records, single_task_minutes=10.0)["goals"]
    assert goals["moe-shared_reach_and_push_ge_0.9_every_seed"] is True
    assert goals["moe_reach_and_push_ge_0.9_every_seed"] is False
    assert goals["mean_over_tasks_at_last_mark"] == {"moe-shared": 0.975, "dense": 0.95, "moe": 0.8}
    assert goals["moe-shared_mean_ge_dense_mean"] is True
    # per-seed means 0.95, 1.0 against 0.9, 1.0: sample variances 0.00125 and 0.005, 2 seeds each
    assert goals["moe-shared_minus_dense"] == {"difference": 0.025, "standard_error": 0.0559, "seeds": [2, 2]}
    assert goals["moe_minus_dense"]["standard_error"] is None  # one seed: no spread to measure


def test_the_dense_params_arm_holds_about_as_many_actor_parameters_as_the_moe_arm_on_mt10(multitask_moe):
    """The issue's equal-parameter dense arm: the config `train --tasks mt10` builds with each arm's
    sets, its actor counted by ModelSpec (an MoE's every expert counted)."""
    from types import SimpleNamespace

    from fleet.cli.presets import preset_for
    from foundation.config import RunConfig, tasks_overrides, with_overrides
    from foundation.policy import model_spec
    from sim.task_sets import task_set

    mt10 = task_set("mt10")
    dims = SimpleNamespace(obs_dim=46, goal_dim=3, act_dim=4, tasks=mt10)  # Meta-World v3's, padded

    def actor(arm: str) -> int:
        sets = [*tasks_overrides(list(mt10)), *multitask_moe.ARMS[arm]]
        config = with_overrides(preset_for(with_overrides(RunConfig(), sets), sets), sets).validate()
        return model_spec(config, dims).actor_size()

    moe, wide, dense = actor("moe"), actor("dense-params"), actor("dense")
    assert abs(wide / moe - 1) < 0.02, (wide, moe)
    assert dense < moe / 8  # the equal-active-width arm is the small one


def test_combine_refuses_a_file_that_is_not_a_score_result(multitask_moe, tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"benchmark": "learner_throughput", "figures": {}}))
    with pytest.raises(SystemExit):
        multitask_moe.main(["combine", str(other)])
    assert "not raw results of `multitask_moe.py score`" in capsys.readouterr().err


@pytest.fixture
def chaos_table(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("chaos_soak_table")


def _soak_record(seed: int, every: float | None, sec_to_target: float | None, lost: int = 0) -> dict:
    summary = {
        "reached_target": sec_to_target is not None,
        "wall_sec_to_target": sec_to_target,
        "version_to_target": None if sec_to_target is None else int(sec_to_target * 50),  # 50 updates/s
        "final_version": 90_000,
        "wall_sec": 1800.0,
    }
    figures = {
        "task": "FetchPush-v4",
        "seed": seed,
        "every_sec": every,
        "summary": summary,
        "faults": [{"fault": "SIGKILL aggregator"}, {"fault": "PARTITION sampler-host"}] * (0 if every is None else 6),
        "batches": {"lost": lost, "doubled": 0},
        "gradients": {"applied_twice": 0, "versions_reused": 0},
        "problems": lost,
    }
    return {"benchmark": "chaos_soak", "commit": "c", "figures": figures}


def test_the_chaos_table_pairs_each_soak_with_its_seeds_baseline(chaos_table):
    records = [
        _soak_record(0, None, 600.0),
        _soak_record(0, 60.0, 840.0),
        _soak_record(1, None, 720.0),
        _soak_record(1, 60.0, 1200.0),
        _soak_record(2, 15.0, None, lost=3),  # no baseline, never reached, lost 3
    ]
    figures = chaos_table.table(records)
    rows = {(r["seed"], r["every_sec"]): r for r in figures["rows"]}
    assert (rows[(0, 60.0)]["ratio"], rows[(0, 60.0)]["baseline_minutes"]) == (1.4, 10.0)
    assert rows[(1, 60.0)]["ratio"] == pytest.approx(1.667, abs=1e-3)
    assert rows[(2, 15.0)]["ratio"] is None and rows[(2, 15.0)]["faults"] == 12
    assert rows[(2, 15.0)]["fault_kinds"] == {"PARTITION": 6, "SIGKILL": 6}
    # The same rate with and without faults: the longer run needed more updates, not slower ones.
    assert (rows[(1, 60.0)]["updates_to_target"], rows[(1, 60.0)]["baseline_updates_to_target"]) == (60_000, 36_000)
    assert rows[(1, 60.0)]["updates_per_sec_ratio"] == 1.0
    assert rows[(2, 15.0)]["updates_per_sec"] == 50.0 and rows[(2, 15.0)]["updates_per_sec_ratio"] is None
    assert figures["goals"] == {"ratio_le_1.5_every_paired_soak": False, "nothing_lost_doubled_or_applied_twice": False}
    figures = chaos_table.table(records[:2])
    assert figures["goals"] == {"ratio_le_1.5_every_paired_soak": True, "nothing_lost_doubled_or_applied_twice": True}


def test_fleet_arms_gradient_counts(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    fleet_arms = importlib.import_module("fleet_arms")
    summary = {"wall_sec": 100.0, "counters": {"aggregator": {"gradients_applied": 850, "gradients_stale": 150}}}
    per_sec, stale = fleet_arms.gradient_counts(summary)
    assert per_sec == pytest.approx(10.0) and stale == pytest.approx(0.15)
    assert fleet_arms.gradient_counts({"wall_sec": 100.0, "counters": {}}) == (None, None)
    none_pushed = {"wall_sec": 5.0, "counters": {"aggregator": {"gradients_applied": 0, "gradients_stale": 0}}}
    assert fleet_arms.gradient_counts(none_pushed) == (0.0, None)


def test_learner_throughput_model_arms_are_valid_configs(monkeypatch):
    """Every --model arm applies to the 4-task config it is measured on, and means what it says:
    the config `fleetrl train --tasks ...` would run (the multi-task recipe, task heads for a
    task-routed MoE), one torch thread."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    lt = importlib.import_module("model_arms")  # learner_throughput.py --model's arms

    configs = {arm: lt.arm_config(arm) for arm in lt.MODEL_ARMS}
    assert all(c.learner.torch_threads == 1 and list(c.sim.tasks) == lt.MODEL_TASKS for c in configs.values())
    assert configs["moe-e32"].model.task_heads and configs["moe-e32"].model.task_alpha
    assert configs["moe-e32"].learner.task_sampling == "focus" and not configs["moe-e32"].model.task_onehot
    assert configs["moe-e32-state"].model.router == "state" and not configs["moe-e32-state"].model.task_heads
    assert not configs["dense"].model.task_heads and configs["dense"].model.task_alpha
    assert configs["dense"].learner.gamma == 0.95  # FetchPush's preset, the first task with one
    assert lt.arm_config("moe-e32", ["learner.batch_size=128"]).learner.batch_size == 128
    assert configs["dense"].learner.batch_size == configs["moe-e32"].learner.batch_size == 256
    # not the task-routed MoE recipe's batch 1024 in bfloat16: the per-model yardstick is batch 256 in float32
    assert configs["moe-e32"].learner.autocast == configs["dense"].learner.autocast == "off"
    assert configs["moe-e32-bf16"].learner.autocast == "bf16"
    assert configs["dense-b512"].learner.batch_size == configs["moe-e32-b512"].learner.batch_size == 512
    assert configs["moe-e32-b512"].model.kind == "moe" and configs["moe-e32-b512"].model.experts == 32
    # the yardstick's k = 2 on every MoE arm but the one that measures the multi-task recipe's shared expert
    moe = {arm: (c.model.top_k, c.model.shared_experts) for arm, c in configs.items() if c.model.kind == "moe"}
    assert moe.pop("moe-e32-shared") == (3, 1) and set(moe.values()) == {(2, 0)}, moe
    assert configs["dense-b512"].model.kind == "dense"
    # --tasks mt10: the same arms on Meta-World's MT10, its recipe included (LayerNorm critics)
    from sim.task_sets import task_set

    mt10 = lt.arm_config("dense-w832", tasks=task_set("mt10"))
    assert list(mt10.sim.tasks) == list(task_set("mt10")) and list(mt10.learner.hidden_sizes) == [832, 832]
    assert mt10.model.critic_norm == "layer" and mt10.learner.batch_size == 256


def test_learner_throughput_model_ratios_pair_the_measured_arms_and_count_rows(monkeypatch):
    """A ratio needs both of its arms; at batch 512 it compares rows learned, twice the updates' rows."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    arms = importlib.import_module("model_arms")
    ratios = arms.model_ratios({"dense": 50.0, "moe-e32": 40.0, "dense-b512": 30.0})
    assert ratios == {"moe-e32 / dense (equal active width)": 0.8, "dense-b512 / dense (rows)": 1.2}
    assert arms.model_ratios({"moe-e32": 40.0, "dense": 0.0}) == {}  # no rate to divide by


def test_learner_throughput_measures_the_fleet_against_the_one_thread_float32_batch_256_loop(monkeypatch):
    """The fleet figure's yardstick keeps the run's model and algorithm and takes the reference's
    batch, precision and threads; a run already at them is its own reference (one bare loop)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    lt = importlib.import_module("learner_throughput")
    from fleet.cli.presets import preset_config
    from foundation.config import with_overrides

    pnp = preset_config("FetchPickAndPlace-v4")
    assert pnp.learner.num_learners == 2 and lt.reference_config(pnp) == pnp
    fast = with_overrides(pnp, ["learner.batch_size=1024", 'learner.autocast="bf16"', "learner.torch_threads=2"])
    ref = lt.reference_config(fast)
    assert ref != fast and ref == pnp
    assert (ref.learner.batch_size, ref.learner.autocast, ref.learner.torch_threads) == (256, "off", 1)
    tqc = with_overrides(pnp, ['learner.algo="tqc"', "learner.batch_size=512"])
    assert lt.reference_config(tqc).learner.algo == "tqc"  # the same update, at the reference's settings


def test_goal_split_scores_a_real_pickandplace_checkpoint_by_goal_height(monkeypatch, tmp_path):
    """benchmarks/goal_split.py on an untrained FetchPickAndPlace checkpoint: every episode is a
    table goal or an air goal, the air goals' heights are listed met or missed, and they lie
    where the task puts them (up to 0.45 m above the table)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    goal_split = importlib.import_module("goal_split")
    from aggregator.core import AggregatorCore
    from foundation.checkpoint import save_checkpoint
    from foundation.config import RunConfig, with_overrides
    from foundation.policy import model_spec
    from sim.registry import get_task

    config = with_overrides(RunConfig(), ['sim.task="FetchPickAndPlace-v4"', "learner.hidden_sizes=[16]"])
    (tmp_path / "config.json").write_text(config.to_json())
    task = get_task("FetchPickAndPlace-v4")
    core = AggregatorCore(model_spec(config, task), config.aggregator, 1, 1, task.name)
    checkpoint = save_checkpoint(tmp_path / "checkpoints", core.state(), keep=1)
    out = goal_split.split(tmp_path, pathlib.Path(checkpoint), episodes=12)
    assert out["table_goals"] + out["air_goals"] == 12 and out["air_goals"] >= 1, out
    heights = out["air_heights_met"] + out["air_heights_missed"]
    assert len(heights) == out["air_goals"] and all(0.02 < h <= 0.46 for h in heights), out
    assert out["version"] == 0 and out["checkpoint"] == pathlib.Path(checkpoint).name
    rows = out["per_episode"]
    assert [r["seed"] for r in rows] == [config.eval.seed + i for i in range(12)]
    air = [r for r in rows if r["height"] > goal_split.AIR_ABOVE_M]
    assert len(air) == out["air_goals"] and all(r["lift"] >= 0.0 for r in rows), rows  # the start is a sample
    assert out["air_lifted"] == round(sum(r["lift"] > goal_split.LIFTED_M for r in air) / len(air), 3), out
    assert out["air_success"] == round(len(out["air_heights_met"]) / len(air), 3), out
    assert out["success"] == round(sum(r["success"] for r in rows) / 12, 3), out
    # the CLI: the run's newest checkpoint by default; a run without one is refused by name
    out_json = tmp_path / "split.json"
    assert goal_split.main([str(tmp_path), "--episodes", "2", "--json", str(out_json)]) == 0
    assert json.loads(out_json.read_text())["figures"]["checkpoint"] == pathlib.Path(checkpoint).name
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    with pytest.raises(SystemExit, match="no checkpoint"):
        goal_split.main([str(tmp_path / "empty")])


def test_routing_precision_finds_the_route_a_bf16_gate_would_change(monkeypatch, tmp_path):
    """benchmarks/routing_precision.py on a task-routed MoE checkpoint: a gate whose second and
    third logits are 0.0009 apart routes task 0 to experts {0, 2} in float32 and to another
    pair under bf16 autocast; that one route is listed, every other agrees; a dense run is
    refused by name."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    routing_precision = importlib.import_module("routing_precision")
    import numpy as np
    import torch

    from aggregator.core import AggregatorCore
    from foundation.checkpoint import save_checkpoint
    from foundation.config import AggregatorConfig
    from foundation.policy import ModelSpec
    from nets.models import SACModel

    spec = ModelSpec(5, 3, 2, (16, 16), kind="moe", experts=4, top_k=2, tasks=2, router="task", task_heads=True)
    core = AggregatorCore(spec, AggregatorConfig(), 1, 1, "FetchReach-v4,FetchPush-v4")
    state = core.state()
    model = SACModel(spec)
    model.set_flat("actor", np.asarray(state["weights"]["actor"], np.float32))
    body = model.actor.body
    with torch.no_grad():
        body.task_embed.copy_(torch.tensor([[1.0] + [0.0] * 7, [0.0, 1.0] + [0.0] * 6]))
        gate = body.hidden[0].gate
        gate.weight.zero_()
        gate.weight[:, 0] = torch.tensor([2.0, 0.5, 0.5009, -1.0])  # task 0's logits
        gate.weight[:, 1] = torch.tensor([-1.0, 0.0, 1.0, 2.0])  # task 1's: far apart
        gate.bias.zero_()
    state["weights"]["actor"] = model.get_flat("actor")
    save_checkpoint(tmp_path / "checkpoints", state, keep=1)
    out = routing_precision.run_routing(tmp_path)
    assert out["tasks"] == ["FetchReach-v4", "FetchPush-v4"] and out["version"] == 0
    reach = out["layers"]["actor.l0"]["FetchReach-v4"]
    assert reach["float32"] == [0, 2] and reach["bfloat16"] != [0, 2], reach
    assert out["layers"]["actor.l0"]["FetchPush-v4"] == {"float32": [2, 3], "bfloat16": [2, 3]}
    assert out["differ"] == [f"actor.l0 FetchReach-v4: [0, 2] / {reach['bfloat16']}"]
    assert set(out["layers"]) == {
        "actor.l0",
        "actor.l1",
        "critic.q1.l0",
        "critic.q1.l1",
        "critic.q2.l0",
        "critic.q2.l1",
    }
    dense = ModelSpec(5, 3, 2, (16, 16))
    dense_dir = tmp_path / "dense"
    save_checkpoint(
        dense_dir / "checkpoints", AggregatorCore(dense, AggregatorConfig(), 1, 1, "FetchReach-v4").state(), 1
    )
    with pytest.raises(SystemExit, match="task-routed MoEs"):
        routing_precision.run_routing(dense_dir)


def test_exploration_probe_counts_moved_episodes_with_the_samplers_policy(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    probe = importlib.import_module("exploration_probe")
    low, high = probe.wilson(3, 10)  # the 95% Wilson interval of 3/10, by hand: 0.108 to 0.603
    assert low == pytest.approx(0.1078, abs=1e-3) and high == pytest.approx(0.6032, abs=1e-3)
    assert probe.wilson(0, 5)[0] == 0.0 and probe.wilson(5, 5)[1] == 1.0
    policy = probe.fresh_policy("FetchPush-v4", random_share=0.3, repeat=5, seed=0)
    assert policy.random_action_repeat == 5 and policy.random_action_prob == 0.3 and policy.version == 0
    # FetchReach's achieved goal is the gripper: a walk of uniform steps always leaves its first 5 cm.
    reach = probe.probe("FetchReach-v4", random_share=1.0, repeat=1, episodes=3, seed=0)
    assert reach["moved"] == 3 and reach["moved_share"] == 1.0 and reach["episodes"] == 3


def test_a_baseline_counts_its_training_rate_without_the_evaluations_after_its_first_update(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    outcome_mod = importlib.import_module("baseline_outcome")
    outcome = outcome_mod.Outcome(seed=0, target=0.9, wall_sec=100.0, gradient_steps=700)
    assert outcome_mod.train_updates_per_sec(outcome) == 0.0  # no update made: no training time
    outcome.train_start_wall_sec, outcome.eval_sec_total, outcome.eval_sec_before_train = 10.0, 30.0, 10.0
    assert outcome_mod.train_updates_per_sec(outcome) == 10.0  # 700 updates over 100 - 10 - (30 - 10) s


def test_the_envelope_goal_figures_read_1_5x_the_training_range_and_2_ticks_as_shares_of_nominal(monkeypatch):
    from deploy_npu.envelope import AxisResult, Envelope

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    goal_figures = importlib.import_module("robustness_envelope").goal_figures

    mass = AxisResult(
        "mass_scale", [0.7, 1.0, 1.3], {"float": [0.5, 1.0, 0.9], "int8": [0.5, 0.8, 0.8]}, (0.8, 1.2), 1.0
    )
    delay = AxisResult("delay_ticks", [0.0, 2.0], {"float": [1.0, 0.6], "int8": [0.8, 0.8]}, None, 0.0)
    envelope = Envelope("run", "FetchPush-v4", 120.0, 10, 0, {"float": "f", "int8": "q"}, [mass, delay])
    envelope.half_widths = {"mass_scale": 0.2}
    figures = goal_figures(envelope)
    assert figures["float"] == {"mass_scale": 0.5, "delay_ticks": 0.6}  # the lower side of 1.5x
    assert figures["int8"] == {"mass_scale": 0.625, "delay_ticks": 1.0}
    assert figures["int8_max_gap"] == 0.2


def test_the_agreement_table_has_a_row_per_controller_and_per_pair_in_the_reports_order(monkeypatch):
    from deploy_npu.agreement import AgreementReport, AgreementSetting, PairFigures

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    agreement = importlib.import_module("controller_agreement")
    setting = AgreementSetting("FetchSlide-v4", 120.0, 1, 4, 0, True, 1e-7, 1e-4)
    onnx, torch = (True, True, False, True), (True, False, False, False)
    pairs = [
        PairFigures("onnx", "torch", onnx, torch, 1.2e-7, (30, 41, None, 52)),
        PairFigures("torch-again", "torch", torch, torch, 0.0, (None,) * 4),
    ]
    report = AgreementReport(setting, {"onnx": onnx, "torch": torch, "torch-again": torch}, pairs)
    successes = agreement.success_rows(report)
    assert successes["onnx"] == {"successes": 3, "episodes": 4, "success rate": 0.75}
    rows = agreement.pair_rows(report)
    assert list(rows) == ["onnx vs torch", "torch-again vs torch"]
    exported = rows["onnx vs torch"]
    assert (exported["flips"], exported["won by a only / b only"], exported["difference"]) == (2, "2 / 0", 0.5)
    assert exported["paired SE"] == 0.289 and exported["parted"] == "3/4" and exported["median tick parted"] == 46.5
    assert rows["torch-again vs torch"]["median tick parted"] is None and rows["torch-again vs torch"]["flips"] == 0
    three = PairFigures("onnx", "torch", onnx[:3], torch[:3], 1.2e-7, (30, 41, None))
    odd = AgreementReport(setting, {"onnx": onnx[:3], "torch": torch[:3]}, [three])
    tick = agreement.pair_rows(odd)["onnx vs torch"]["median tick parted"]
    assert tick == 41 and isinstance(tick, int)  # whole: the table shows 41, not 41.000


@pytest.fixture
def resume_cost(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("resume_cost")


def _evals(run_dir: pathlib.Path, rows: list[dict]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps({"target_success": 0.9, "eval": {"episodes": 50}}))
    (run_dir / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_target_is_the_first_complete_full_score_at_or_above_it_after_the_resume(resume_cost, tmp_path):
    _evals(tmp_path, [
        {"kind": "full", "episodes": 50, "success_rate": 0.92, "time": 10.0},   # before the resume
        {"kind": "full", "episodes": 12, "success_rate": 1.0, "time": 30.0},    # stopped early: not complete
        {"kind": "curve", "episodes": 10, "success_rate": 1.0, "time": 31.0},   # a curve score never reaches it
        {"kind": "full", "episodes": 50, "success_rate": 0.88, "time": 32.0},
        {"kind": "full", "episodes": 50, "success_rate": 0.90, "time": 40.0},
    ])  # fmt: skip
    assert resume_cost._target_time(tmp_path, since=20.0) == 40.0
    assert resume_cost._target_time(tmp_path, since=41.0) is None


def test_the_scores_around_a_kill_are_the_last_curve_before_and_the_first_after(resume_cost, tmp_path):
    curve = lambda version, rate, t: {"kind": "curve", "version": version, "success_rate": rate,  # noqa: E731
                                      "episodes": 10, "env_steps": 100 * version, "time": t}  # fmt: skip
    _evals(tmp_path, [curve(1, 0.2, 1.0), curve(2, 0.5, 2.0), curve(9, 0.44, 8.0), curve(10, 0.7, 9.0)])
    around = resume_cost._score_around(tmp_path, killed_at=3.0, resumed_at=5.0)
    assert (around["before"]["version"], around["after"]["version"]) == (2, 9)
    assert around["stderr_50_episodes"] == pytest.approx((0.5 * 0.5 / 50) ** 0.5, abs=1e-3)
    assert around["drop_within_one_stderr"]  # 0.5 -> 0.44 is within 0.071
    assert resume_cost._score_around(tmp_path, killed_at=0.5, resumed_at=5.0)["before"] is None


def test_ratios_divide_each_killed_arm_by_the_same_seeds_uninterrupted_run(resume_cost):
    seeds = {
        "0": {"uninterrupted": {"sec_to_target": 300.0}, "kept": {"sec_to_target": 330.0},
              "thrown-away": {"sec_to_target": 390.0}},
        "1": {"uninterrupted": {"sec_to_target": 200.0}, "kept": {"sec_to_target": None}},
    }  # fmt: skip
    for results in seeds.values():
        results["ratio_to_uninterrupted"] = resume_cost._ratios(results)
    assert seeds["0"]["ratio_to_uninterrupted"] == {"kept": 1.1, "thrown-away": 1.3}
    assert seeds["1"]["ratio_to_uninterrupted"] == {"kept": None, "thrown-away": None}
    medians = resume_cost._figures(seeds)["medians"]
    assert medians["kept_ratio_median"] == 1.1 and medians["thrown-away_ratio_worst"] == 1.3


def test_the_slurm_requeue_timeline_is_read_from_what_the_test_prints(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    slurm_requeue = importlib.import_module("slurm_requeue")
    printed = (
        "\njob 1 timeline (seconds after submission):\n      0.0  submitted\n     10.0  warned (SIGUSR1 to the batch "
        "shell)\n     48.0  completed (fleet stopped, status 0)\njob 1: COMPLETED; evaluation success 1.00 over 50 "
        "episodes >= target 0.9; resumes 1; version 96 at the requeue, 629 at the end\n.\n1 passed in 49.70s\n"
    )
    figures = slurm_requeue.parse(printed)
    assert [r["event"] for r in figures["timeline"]] == [
        "submitted",
        "warned (SIGUSR1 to the batch shell)",
        "completed (fleet stopped, status 0)",
    ]
    assert figures["outcome"]["resumes"] == 1 and figures["outcome"]["final_version"] == 629
    with pytest.raises(SystemExit, match="printed no timeline"):
        slurm_requeue.parse("1 failed")
