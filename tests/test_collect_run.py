"""benchmarks/collect_run.py: a run's directory as a raw result."""

from __future__ import annotations

import importlib
import json
import pathlib

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
