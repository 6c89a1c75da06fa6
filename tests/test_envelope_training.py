"""benchmarks/envelope_training.py's pure pieces: the arms' options, the carry, the widest verdict,
the time ratios, and a rerun that keeps what an earlier one did (trainings and sweeps faked)."""

from __future__ import annotations

import importlib
import json
import pathlib

import pytest

from deploy_npu.envelope import AxisResult
from foundation.config import RunConfig

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
PRESET = RunConfig().sim.randomization


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("envelope_training")


def test_the_arms_turn_randomization_off_keep_the_preset_or_double_every_scale_range(bench):
    assert bench.arm_options("none", PRESET) == ["--set", "sim.randomization.enabled=false"]
    assert bench.arm_options("preset", PRESET) == []
    wide = bench.arm_options("wide", PRESET)
    assert wide[::2] == ["--set"] * 5 and "sim.randomization.mass_scale=[0.6, 1.4]" in wide
    assert "sim.randomization.action_scale=[0.8, 1.2]" in wide
    with pytest.raises(SystemExit, match="mass_scale: 6.0x the preset's range 0.8..1.2 reaches -0.2 <= 0"):
        bench.widened("mass_scale", PRESET, 6.0)


@pytest.mark.parametrize(
    ("success", "below", "expected"),
    [
        ([0.2, 0.9, 1.0, 0.9, 0.5], [0.4, 1.6], 0.6),  # both sides fall: the nearer
        ([0.2, 0.9, 1.0, 0.9, 0.9], [0.4, None], 0.6),  # one side holds throughout
        ([0.9, 0.9, 1.0, 0.9, 0.9], [None, None], None),  # holds over the whole swept range
        ([0.0, 0.0, 0.0, 0.0, 0.0], [None, None], 0.0),  # fails at nominal: carries nowhere
    ],
)
def test_the_carry_is_the_distance_to_the_nearer_80_percent_point(bench, success, below, expected):
    axis = AxisResult("mass_scale", [0.4, 0.8, 1.0, 1.2, 1.6], {"float": success}, None, 1.0, {"float": below})
    assert bench.carry(axis) == (expected if expected is None else pytest.approx(expected))


@pytest.mark.parametrize(
    ("carries", "winners", "widest"),
    [
        ({"a": {"mass_scale": 0.6}, "b": {"mass_scale": 0.4}}, {"mass_scale": ["a"]}, ["a"]),
        ({"a": {"mass_scale": 0.6}, "b": {"mass_scale": None}}, {"mass_scale": ["b"]}, ["b"]),  # None: beyond
        ({"a": {"mass_scale": 0.6}, "b": {"mass_scale": 0.6}}, {"mass_scale": []}, []),  # all alike: no verdict
        (
            {"a": {"mass_scale": 0.6, "delay_ticks": 1.0}, "b": {"mass_scale": 0.4, "delay_ticks": 2.0},
             "c": {"mass_scale": 0.6, "delay_ticks": 1.0}},
            {"mass_scale": ["a", "c"], "delay_ticks": ["b"]},
            ["a", "b", "c"],
        ),  # a and c share mass, b takes delay: one win each, a tie
        ({"a": {"cone": 1.0}, "b": {"cone": 0.0}}, {}, []),  # not an axis a training's ranges set
    ],
)  # fmt: skip
def test_the_widest_training_wins_the_most_axes_and_ties_are_shared(bench, carries, winners, widest):
    verdict = bench.widest(carries)
    assert verdict["axis_winners"] == winners and verdict["widest"] == widest
    assert verdict["tie"] == (len(widest) > 1)


def test_a_median_carry_counts_beyond_the_range_as_furthest_out(bench):
    assert bench.median_carry([None, 0.4, None]) is None
    assert bench.median_carry([0.2, 0.4, None]) == 0.4
    assert bench.median_carry([]) is None


def _run(arm: str, seed: int, to_target: float | None, carry: float | None = 0.4) -> dict:
    train = {"reached_target": to_target is not None, "wall_sec_to_target": to_target}
    sweep = {"carry": {"mass_scale": carry}, "goal_shares": {"mass_scale": 1.0}}
    return {"arm": arm, "seed": seed, "train": train, "sweep": sweep}


def test_each_arms_time_is_divided_by_the_same_seeds_preset_run(bench):
    runs = {
        "preset-seed0": _run("preset", 0, 100.0), "wide-seed0": _run("wide", 0, 120.0, carry=None),
        "preset-seed1": _run("preset", 1, 200.0), "wide-seed1": _run("wide", 1, None, carry=None),
    }  # fmt: skip
    assert bench.time_ratios(runs, "wide") == [1.2, None]  # a missed target has no ratio
    summary = bench.summarize(runs)
    assert summary["arms"]["wide"]["reached"] == 1 and summary["arms"]["wide"]["time_ratio_median"] == 1.2
    assert summary["verdict"]["widest"] == ["wide"] and summary["verdict"]["time_ratio_median"] == {"wide": 1.2}


def test_a_rerun_skips_what_the_json_holds_and_refuses_other_settings(bench, tmp_path, monkeypatch):
    calls: list[str] = []

    def train(run_dir, argv, swept_on):
        calls.append(f"train {run_dir.name}")
        run_dir.mkdir()
        return {"reached_target": True, "wall_sec_to_target": 10.0}

    def sweep_run(run_dir, ranges, args):
        calls.append(f"sweep {run_dir.name}")
        return {"carry": {"mass_scale": 0.4}, "goal_shares": {}}

    monkeypatch.setattr(bench, "train", train)
    monkeypatch.setattr(bench, "sweep_run", sweep_run)
    monkeypatch.setattr(bench, "result_record", lambda name, figures: {"figures": figures})  # no git
    (tmp_path / "preset-ranges.json").write_text(RunConfig().to_json())
    argv = ["--out-dir", str(tmp_path), "--json", str(tmp_path / "r.json"), "--episodes", "5"]
    assert bench.main([*argv, "--arms", "preset"]) == 0
    assert bench.main([*argv, "--arms", "preset,wide"]) == 0
    assert calls == ["train preset-seed0", "sweep preset-seed0", "train wide-seed0", "sweep wide-seed0"]
    assert set(json.loads((tmp_path / "r.json").read_text())["figures"]["runs"]) == {"preset-seed0", "wide-seed0"}
    with pytest.raises(SystemExit, match="was made with other episodes"):
        bench.main([*argv[:-1], "10"])
