"""The robustness envelope (deploy_npu/envelope.py, envelope_run.py) and the model variants it
sweeps (sim/variants.py): real MuJoCo envs, real exported graphs, real worker processes."""

from __future__ import annotations

import json

import mujoco
import pytest

from deploy_npu.envelope import AXES, SweepRanges, axis_points, falls_below, own_ranges, ranges_of, scale_points
from foundation.config import RunConfig, with_overrides
from sim.registry import get_task, make_env
from sim.variants import ModelVariant, VariantConfig


def test_scale_points_reach_four_times_the_training_half_width_either_side_of_nominal():
    config = with_overrides(RunConfig(), ["sim.randomization.mass_scale=[0.8, 1.2]"])
    points = scale_points("mass_scale", own_ranges("run", config))
    assert points == sorted(points) and 1.0 in points
    assert {0.7, 1.3} <= set(points)  # 1.5x the training range: the envelope's goal line
    assert min(points) > 0.05 and max(points) == pytest.approx(1.8)
    unrandomized = with_overrides(RunConfig(), ["sim.randomization.mass_scale=[1.0, 1.0]"])
    assert 1.2 in scale_points("mass_scale", own_ranges("run", unrandomized))  # a reference half-width of 0.2
    off = with_overrides(RunConfig(), ["sim.randomization.enabled=false"])  # action_scale's range is 0.9..1.1
    assert SweepRanges(off.sim.randomization, "run").half_width("action_scale") == 0.2  # trained on none of it


def test_a_run_swept_on_another_runs_ranges_meets_that_runs_points(tmp_path):
    fetch = get_task("FetchPush-v4")
    preset, wide = tmp_path / "preset", tmp_path / "wide"
    for run_dir, overrides in ((preset, []), (wide, ["sim.randomization.mass_scale=[0.6, 1.4]"])):
        run_dir.mkdir()
        (run_dir / "config.json").write_text(with_overrides(RunConfig(), overrides).to_json())
    reference = ranges_of(preset)
    assert reference.source == str(preset) and ranges_of(preset / "config.json").half_width("mass_scale") == 0.2
    wide_own = own_ranges(str(wide), RunConfig.load(wide / "config.json"))
    on_preset = [p.value for p in axis_points("mass_scale", reference, fetch, 120.0)]
    assert on_preset != [p.value for p in axis_points("mass_scale", wide_own, fetch, 120.0)]  # 0.4 apart, not 0.2
    assert on_preset == scale_points("mass_scale", own_ranges(str(preset), RunConfig.load(preset / "config.json")))


def test_falls_below_walks_outward_from_nominal_on_each_side():
    values = [0.5, 0.8, 1.0, 1.2, 1.5]
    assert falls_below(values, [0.1, 0.9, 1.0, 0.85, 0.5], nominal_index=2) == [0.5, 1.5]
    assert falls_below(values, [0.9, 0.9, 1.0, 0.9, 0.9], nominal_index=2) == [None, None]
    assert falls_below(values, [0.1, 0.7, 1.0, 0.9, 0.1], nominal_index=2) == [0.8, 1.5]  # the first, not the worst
    assert falls_below(["euler", "rk4"], [1.0, 0.5], nominal_index=0) == ["rk4"]


def test_every_axis_holds_its_nominal_point_and_a_meta_world_task_only_rates_it_can_run():
    config = own_ranges("run", RunConfig())
    fetch, meta = get_task("FetchPush-v4"), get_task("MetaWorld-reach-v3")
    for axis in AXES:
        assert axis_points(axis, config, fetch, 120.0), axis
    assert min(p.value for p in axis_points("control_hz", config, meta, 120.0)) == 80.0
    assert axis_points("timestep_scale", config, meta, 120.0) == []
    mass = axis_points("mass_scale", config, fetch, 120.0)
    assert all(p.randomization.mass_scale == (p.value, p.value) for p in mass)
    assert all(p.randomization.friction_scale == (1.0, 1.0) and p.randomization.obs_noise_std == 0.0 for p in mass)


def test_every_point_keeps_the_controllers_delay_but_the_delay_axis_own():
    from deploy_npu.envelope import nominal_value

    config, fetch = own_ranges("run", RunConfig()), get_task("FetchPush-v4")
    mass = axis_points("mass_scale", config, fetch, 120.0, delay_ms=10.0)
    assert {p.delay_ticks for p in mass} == {1}  # 10 ms is one tick at 120 Hz
    delays = axis_points("delay_ticks", config, fetch, 120.0, delay_ms=10.0)
    assert [p.delay_ticks for p in delays] == [0, 1, 2, 3, 4, 6, 8] and nominal_value("delay_ticks", 120.0, 10.0) == 1.0
    rates = {p.value: p.delay_ticks for p in axis_points("control_hz", config, fetch, 120.0, delay_ms=10.0)}
    assert rates[25.0] == 0 and rates[120.0] == 1 and rates[240.0] == 2  # the same milliseconds at each rate


def test_a_model_variant_changes_the_model_and_keeps_the_decision_length():
    env = make_env("FetchPush-v4")
    core = env.unwrapped
    period = core.model.opt.timestep * core.n_substeps
    variant = ModelVariant(env, VariantConfig(integrator="rk4", timestep_scale=0.5, impratio=10.0, cone="elliptic"))
    opt = variant.unwrapped.model.opt
    assert opt.integrator == mujoco.mjtIntegrator.mjINT_RK4 and opt.cone == mujoco.mjtCone.mjCONE_ELLIPTIC
    assert opt.impratio == 10.0 and core.n_substeps == 40
    assert opt.timestep * core.n_substeps == pytest.approx(period)
    variant.reset(seed=0)
    variant.step(variant.action_space.sample())
    variant.close()


@pytest.mark.parametrize(
    ("task", "variant", "names"),
    [
        ("FetchPush-v4", VariantConfig(timestep_scale=0.3), "timestep_scale (0.3)"),
        ("FetchPush-v4", VariantConfig(integrator="verlet"), "integrator ('verlet')"),
        ("FetchPush-v4", VariantConfig(cone="round"), "cone ('round')"),
        ("FetchPush-v4", VariantConfig(impratio=0.5), "impratio (0.5)"),
        ("MetaWorld-reach-v3", VariantConfig(timestep_scale=0.5), "timestep_scale needs a Fetch task"),
    ],
)
def test_a_variant_mujoco_cannot_run_is_refused_naming_the_field(task, variant, names):
    env = make_env(task)
    with pytest.raises(ValueError, match=names.replace("(", r"\(").replace(")", r"\)")):
        ModelVariant(env, variant)
    env.close()


@pytest.mark.parametrize(
    "field,says",
    [
        ({"axes": ("mass",)}, r"--axes: unknown \['mass'\]; the axes are mass_scale"),
        ({"episodes": 0}, r"--episodes \(0\) must be >= 1"),
        ({"delay_ms": -1.0}, r"--delay-ms \(-1.0\) must be >= 0"),
        ({"workers": 0}, r"--workers \(0\) must be >= 1"),
    ],
)
def test_a_sweep_setting_refuses_a_bad_value_naming_it(field, says):
    from deploy_npu.envelope_run import SweepSetting
    from foundation.config import ConfigError

    with pytest.raises(ConfigError, match=says):
        SweepSetting(**field)


def test_a_sweep_writes_every_axis_for_the_float_and_int8_graphs_with_its_nominal_point(tmp_path):
    from deploy_npu.envelope_run import SweepSetting, sweep
    from tests.test_controller import _run_dir

    run_dir = _run_dir(tmp_path, 'model.kind="dense"', "learner.hidden_sizes=[32, 32]")
    axes = ("friction_scale", "delay_ticks", "cone", "control_hz")
    lines: list[str] = []
    setting = SweepSetting(hz=60.0, episodes=2, int8=True, workers=2, axes=axes)
    (envelope,) = sweep(run_dir, setting, progress=lines.append)
    assert tuple(a.axis for a in envelope.axes) == axes and set(envelope.graphs) == {"float", "int8"}
    for axis in envelope.axes:
        assert axis.nominal_value in axis.values
        for rates in axis.success.values():
            assert len(rates) == len(axis.values) and all(0.0 <= r <= 1.0 for r in rates)
    written = json.loads((run_dir / "envelope" / "FetchReach-v4.json").read_text())
    assert written["task"] == "FetchReach-v4" and len(written["axes"]) == 4
    assert (run_dir / "envelope" / "FetchReach-v4.png").stat().st_size > 0
    assert lines and "points" in lines[-1]
    assert "below 80% at" in envelope.table()


def _reach_controller(path) -> str:
    """An ONNX P-controller for FetchReach (obs 10 ++ goal 3 -> action 4): the hand toward the goal."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    gain = np.zeros((13, 4), np.float32)
    for i in range(3):
        gain[i, i], gain[10 + i, i] = -10.0, 10.0  # 10 x (goal - grip position)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "gain"], ["raw"]), helper.make_node("Clip", ["raw", "low", "high"], ["a"])],
        "reach",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 13])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(gain, "gain"), numpy_helper.from_array(np.float32(-1), "low"),
         numpy_helper.from_array(np.float32(1), "high")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def test_a_point_scores_what_a_direct_drive_of_the_same_episodes_counts(tmp_path):
    """score_point in worker processes against deploy-check's own drive loop, on a controller that succeeds."""
    from deploy_npu.envelope import Point, score_point
    from deploy_npu.envelope_run import run_points
    from deploy_npu.parity import OnnxPolicy, drive

    graph = _reach_controller(tmp_path / "reach.onnx")
    nominal = Point("delay_ticks", 0.0)
    late = Point("delay_ticks", 8.0, delay_ticks=8)
    jobs = [(graph, "FetchReach-v4", point, 60.0, 5, 0) for point in (nominal, late)]
    won = run_points(jobs, workers=2, progress=lambda line: None)
    policy = OnnxPolicy(graph)
    task = get_task("FetchReach-v4")
    for point, count in zip((nominal, late), won, strict=True):
        direct, _ = drive(lambda x: policy.run_batch(x[None])[0], task, 60.0, point.randomization,
                          episodes=5, delay_ticks=point.delay_ticks, seed=0)  # fmt: skip
        assert count == direct
    assert won[0] >= 4  # the controller reaches: the count is not a trivial zero
    assert score_point(jobs[0]) == won[0]  # in this process too


def test_deploy_check_sweep_writes_the_envelope_and_refuses_an_unknown_axis(tmp_path, capsys):
    from fleet.cli.main import main
    from tests.test_controller import _run_dir

    run_dir = _run_dir(tmp_path, 'model.kind="dense"', "learner.hidden_sizes=[16]")
    argv = ["deploy-check", str(run_dir), "--sweep", "--axes", "cone", "--episodes", "1", "--workers", "1"]
    assert main([*argv, "--json", str(tmp_path / "envelope.json")]) == 0
    out = capsys.readouterr().out
    assert "envelope FetchReach-v4" in out and "cone" in out
    assert json.loads((tmp_path / "envelope.json").read_text())[0]["axes"][0]["values"] == ["pyramidal", "elliptic"]
    assert main(["deploy-check", str(run_dir), "--sweep", "--axes", "mass"]) == 2
    err = capsys.readouterr().err
    assert "fleetrl deploy-check: error: --axes: unknown ['mass']" in err and "mass_scale" in err


def test_deploy_check_sweeps_a_run_on_another_runs_ranges_and_records_them(tmp_path, capsys):
    from fleet.cli.main import main
    from tests.test_controller import _run_dir

    preset = _run_dir(tmp_path / "preset", 'model.kind="dense"', "learner.hidden_sizes=[16]")
    wide = _run_dir(tmp_path / "wide", 'model.kind="dense"', "learner.hidden_sizes=[16]",
                    "sim.randomization.friction_scale=[0.6, 1.4]")  # fmt: skip
    argv = ["deploy-check", str(wide), "--sweep", "--axes", "friction_scale", "--episodes", "1", "--workers", "1"]
    assert main([*argv, "--ranges-from", str(preset), "--json", str(tmp_path / "envelope.json")]) == 0
    assert f"scale axes at multiples of the ranges of {preset}" in capsys.readouterr().out
    (written,) = json.loads((tmp_path / "envelope.json").read_text())
    assert written["ranges_from"] == str(preset) and written["half_widths"] == {"friction_scale": 0.2}
    (axis,) = written["axes"]
    assert axis["values"] == scale_points("friction_scale", ranges_of(preset))
    assert axis["training_range"] == [0.6, 1.4]  # the run's own range stays what the plot shades
