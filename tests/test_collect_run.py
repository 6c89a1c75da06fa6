"""benchmarks/collect_run.py: one run's directory, or the seeds of one recipe, as one raw result."""

from __future__ import annotations

import importlib
import json
import pathlib
import re

import pytest

from foundation.config import RunConfig, with_overrides

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
STARTED = 1_000_000.0  # the runs' started_unix
ONE_RUN_FIGURES = {
    "summary",
    "config_changed",
    "best_curve_success_by_minute",
    "curve",
    "full_scores",
    "train_success_last",
    "note",
}


@pytest.fixture
def collect_run(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    module = importlib.import_module("collect_run")
    monkeypatch.setattr(
        module, "result_record", lambda benchmark, figures: {"benchmark": benchmark, "figures": figures}
    )
    return module  # no git: the record's provenance is harness.py's (tests/test_benchmark_harness.py)


def _write_jsonl(path: pathlib.Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _run_dir(
    root: pathlib.Path, seed: int, sec_to_target: float | None, target: float = 0.9, summary: bool = True
) -> pathlib.Path:
    """A run directory as `fleetrl train` leaves it: curve scores every 5 minutes, at 1.0 from the
    target's time on (0.5 before), and summary.json unless its launcher died."""
    run_dir = root / f"seed{seed}"
    run_dir.mkdir()
    overrides = ["sim.task=FetchPush-v4", f"sampler.seed={seed}", f"target_success={target}"]
    (run_dir / "config.json").write_text(with_overrides(RunConfig(), overrides).to_json())
    last_sec = sec_to_target if sec_to_target is not None else 1800.0
    evals = [
        {"time": STARTED + sec, "kind": "curve", "env_steps": int(sec) * 100, "version": int(sec), "success_rate": rate}
        for sec in range(300, int(last_sec) + 1, 300)
        for rate in [1.0 if sec_to_target is not None and sec >= sec_to_target else 0.5]
    ]
    _write_jsonl(run_dir / "evals.jsonl", evals)
    _write_jsonl(
        run_dir / "progress.jsonl", [{"wall_sec": last_sec, "version": 9, "env_steps": 90, "train_success": 0.7}]
    )
    if summary:
        reached = sec_to_target is not None
        (run_dir / "summary.json").write_text(
            json.dumps(
                {
                    "task": "FetchPush-v4",
                    "target_success": target,
                    "reached_target": reached,
                    "wall_sec_to_target": sec_to_target,
                    "env_steps_to_target": int(sec_to_target) * 100 if reached else None,
                    "stop_reason": "evaluation success reached the target" if reached else "max_wall_sec reached",
                    "best_success": max(e["success_rate"] for e in evals),
                    "final_env_steps": 90,
                    "started_unix": STARTED,
                }
            )
        )
    return run_dir


def _main(collect_run, tmp_path, run_dirs, *flags: str) -> dict:
    out = tmp_path / "result.json"
    argv = [*map(str, run_dirs), "--command", "fleetrl train --task FetchPush-v4", "--out", str(out), *flags]
    assert collect_run.main(argv) == 0
    return json.loads(out.read_text())


def test_one_run_directory_gives_a_record_of_that_runs_figures(collect_run, tmp_path):
    run_dir = _run_dir(tmp_path, seed=3, sec_to_target=900.0)
    scores = '{"30": {"success_rate": 0.94}}'
    record = _main(collect_run, tmp_path, [run_dir], "--minutes", "10,20", "--note", "n", "--scores", scores)
    figures = record["figures"]
    assert (record["benchmark"], record["command"]) == ("training_run", "fleetrl train --task FetchPush-v4")
    assert set(figures) == ONE_RUN_FIGURES | {"scores"}
    assert figures["summary"]["wall_sec_to_target"] == 900.0
    assert figures["best_curve_success_by_minute"] == {"10.0": 0.5, "20.0": 1.0}
    assert figures["config_changed"] == {"sim.task": "FetchPush-v4", "sampler.seed": 3}
    assert [e["wall_sec"] for e in figures["curve"]] == [300.0, 600.0, 900.0]
    assert (figures["note"], figures["scores"]) == ("n", {"30": {"success_rate": 0.94}})


def test_the_seeds_of_one_recipe_give_each_runs_figures_with_the_median_and_worst_time_to_target(
    collect_run, tmp_path, capsys
):
    run_dirs = [_run_dir(tmp_path, seed, sec) for seed, sec in [(0, 750.0), (1, 954.0), (2, 888.0)]]
    record = _main(collect_run, tmp_path, run_dirs, "--note", "three seeds")
    figures = record["figures"]
    assert record["benchmark"] == "training_runs"
    assert [run["run_dir"] for run in figures["runs"]] == [str(d) for d in run_dirs]  # in the order given
    for run, run_dir in zip(figures["runs"], run_dirs, strict=True):
        assert set(run) == ONE_RUN_FIGURES - {"note"} | {"run_dir"}
        assert run["summary"] == json.loads((run_dir / "summary.json").read_text())
    assert figures["across_runs"] == {
        "target_success": 0.9,
        "reached_target": 3,
        "minutes_to_target": [12.5, 15.9, 14.8],
        "median_minutes_to_target": 14.8,
        "worst_minutes_to_target": 15.9,
        "env_steps_to_target": [75000, 95400, 88800],
        "median_env_steps_to_target": 88800,
        "worst_env_steps_to_target": 95400,
    }
    assert figures["note"] == "three seeds"
    assert "3 of 3 runs reached 0.9: median 14.8 min, worst 15.9 min" in capsys.readouterr().out


@pytest.mark.parametrize("summary", [True, False], ids=["missed-the-target", "launcher-died"])
def test_a_run_without_a_time_to_target_leaves_the_median_and_worst_unset(collect_run, tmp_path, summary):
    run_dirs = [_run_dir(tmp_path, 0, 750.0), _run_dir(tmp_path, 1, None, summary=summary)]
    across = _main(collect_run, tmp_path, run_dirs)["figures"]["across_runs"]
    assert (across["reached_target"], across["minutes_to_target"]) == (1, [12.5, None])
    assert across["env_steps_to_target"] == [75000, None]
    assert across["median_minutes_to_target"] is None and across["worst_minutes_to_target"] is None
    assert across["median_env_steps_to_target"] is None and across["worst_env_steps_to_target"] is None


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("not-a-run", "neither summary.json nor progress.jsonl: not a run directory"),
        ("named-twice", "a run directory is named twice: it would count twice in the median"),
        ("scores-of-two", "--scores holds one run's held-out scores, and 2 run directories are given"),
        ("two-targets", r"the runs have different target_success \(\[0.8, 0.9\]\): no time to one target"),
    ],
)
def test_runs_that_make_no_one_record_are_refused_at_the_door(collect_run, tmp_path, capsys, case, says):
    seed0 = _run_dir(tmp_path, 0, 750.0)
    run_dirs, flags = {
        "not-a-run": lambda: ([seed0, tmp_path], []),
        "named-twice": lambda: ([seed0, seed0], []),
        "scores-of-two": lambda: ([seed0, _run_dir(tmp_path, 1, 900.0)], ["--scores", "{}"]),
        "two-targets": lambda: ([seed0, _run_dir(tmp_path, 1, 900.0, target=0.8)], []),
    }[case]()
    out = tmp_path / "result.json"
    with pytest.raises(SystemExit):
        collect_run.main([*map(str, run_dirs), "--command", "c", "--out", str(out), *flags])
    assert re.search(says, capsys.readouterr().err)
    assert not out.exists()
