"""A run's lives: a resumed run's progress and summary count the whole run, however its earlier
lives ended (a clean stop, or killed whole with no summary written)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fleet.report import summary as summary_module
from fleet.report.lives import KILLED, RunHistory
from fleet.report.progress import EvalPoint, Progress, Snapshot
from fleet.report.summary import Ending, write_summary
from foundation.config import RunConfig, with_overrides

CONFIG = with_overrides(RunConfig(), ["eval.episodes=50", "target_success=0.9"])


@pytest.fixture(autouse=True)
def _no_git(monkeypatch):
    monkeypatch.setattr(summary_module, "code_provenance", dict)  # the summary's code: no git process here


def _snap(wall: float, env_steps: int, version: int, curve: EvalPoint | None = None) -> Snapshot:
    return Snapshot(wall, env_steps, 5 * env_steps, version, curve, None, 0.0, 0, 0)


def _life(run_dir, buffer_kept: bool, snaps: list[Snapshot], ended: str | None) -> RunHistory:
    """One start of the launcher: its snapshots as the launcher takes them (the run's wall-clock,
    the earlier lives' counts carried), then its summary, or none when `ended` is None (killed)."""
    history = RunHistory.begin(run_dir, buffer_kept=buffer_kept)
    progress = Progress(CONFIG, run_dir, started_at=0.0, life=history.life)
    for snap in snaps:
        progress.update(history.carried.onto(snap))
    progress.close()  # its last progress.jsonl line, as the 5-second line a killed launcher left
    if ended is not None:
        write_summary(CONFIG, run_dir, progress, Ending(ended, snaps[-1].wall_sec), history=history)
    return history


def test_a_run_killed_whole_and_resumed_on_its_kept_buffer_counts_both_lives(tmp_path):
    _life(tmp_path, False, [_snap(1.0, 100, 5), _snap(30.0, 3000, 120)], ended=None)
    (tmp_path / "evals.jsonl").write_text(json.dumps({"version": 100, "episodes": 10, "success_rate": 0.8,
                                                      "kind": "curve"}) + "\n")  # fmt: skip
    history = RunHistory.begin(tmp_path, buffer_kept=True)  # the durable buffer kept its counters
    assert (history.life, history.carried.wall_sec, history.carried.env_steps) == (1, 30.0, 0)
    progress = Progress(CONFIG, tmp_path, started_at=0.0, life=history.life)
    assert progress.best_success == 0.8  # the earlier life's best score
    progress.update(_snap(31.0, 3000, 131, curve=EvalPoint(131, 0.5, 3000, 10)))
    progress.update(_snap(50.0, 5000, 400))
    progress.close()
    summary = write_summary(CONFIG, tmp_path, progress, Ending("max_wall_sec 50 reached", 50.0), history=history)
    assert summary.resumes == 1 and summary.best_success == 0.8
    assert (summary.wall_sec, summary.final_env_steps, summary.final_version) == (50.0, 5000, 400)
    first, second = summary.lives
    assert (first["ended"], first["wall_sec"], first["env_steps_at_end"], first["version_at_end"]) == (
        KILLED, 30.0, 3000, 120
    )  # fmt: skip
    assert (second["ended"], second["wall_sec"], second["version_at_end"]) == ("max_wall_sec 50 reached", 20.0, 400)
    assert summary.started_unix == first["started_unix"]
    assert summary.updates_per_sec == round((400 - 131) / 20.0, 2)  # this life's versions over its own seconds
    rows = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [r["life"] for r in rows] == [0, 0, 1, 1]


def test_an_empty_buffer_after_a_resume_adds_the_earlier_lives_env_steps(tmp_path):
    _life(tmp_path, False, [_snap(20.0, 2000, 80)], ended="max_wall_sec 20 reached")
    history = _life(tmp_path, False, [_snap(25.0, 300, 90)], ended="interrupted (Ctrl-C or SIGTERM)")
    assert (history.carried.env_steps, history.carried.transitions) == (2000, 10_000)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["final_env_steps"] == 2300 and summary["transitions_stored"] == 11_500
    assert [life["ended"] for life in summary["lives"]] == [
        "max_wall_sec 20 reached",
        "interrupted (Ctrl-C or SIGTERM)",
    ]
    assert summary["resumes"] == 1


def test_a_fresh_run_has_one_life_and_no_resume(tmp_path):
    _life(tmp_path, False, [_snap(5.0, 500, 10)], ended="max_wall_sec 5 reached")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["resumes"] == 0 and len(summary["lives"]) == 1
    assert summary["lives"][0]["wall_sec"] == 5.0


def test_a_summary_written_twice_in_one_life_records_its_end_once(tmp_path):
    """A signalled fleet's aggregator host writes summary.json at once and completes it after."""
    history = _life(tmp_path, True, [_snap(5.0, 500, 10)], ended="interrupted (Ctrl-C or SIGTERM)")
    history.lives("interrupted (Ctrl-C or SIGTERM)", _snap(6.0, 600, 11))
    ends = [json.loads(line) for line in (tmp_path / "lives.jsonl").read_text().splitlines()]
    assert [e["event"] for e in ends] == ["start", "end"]


def test_the_target_of_a_resume_on_an_empty_buffer_counts_the_earlier_lives_env_steps(tmp_path):
    """A score of the resumed life counts env steps from its own, empty buffer; the earlier life's
    last score, which the aggregator answers with until the resumed life scores, counts them all."""
    _life(tmp_path, False, [_snap(30.0, 3000, 120)], ended=None)
    (tmp_path / "evals.jsonl").write_text(json.dumps({"version": 110, "episodes": 10, "success_rate": 0.4,
                                                      "env_steps": 2900, "kind": "curve"}) + "\n")  # fmt: skip
    history = RunHistory.begin(tmp_path, buffer_kept=False)
    earlier = history.carried.onto(_snap(31.0, 0, 121, curve=EvalPoint(110, 0.4, 2900, 10)))
    assert earlier.curve == EvalPoint(110, 0.4, 2900, 10) and earlier.env_steps == 3000
    progress = Progress(CONFIG, tmp_path, started_at=0.0, life=history.life)
    reached = dataclasses.replace(_snap(60.0, 900, 400), full=EvalPoint(390, 0.94, 800, 50))
    progress.update(history.carried.onto(reached))
    progress.close()
    summary = write_summary(CONFIG, tmp_path, progress, Ending("target", 60.0), history=history)
    assert (summary.env_steps_to_target, summary.version_to_target, summary.wall_sec_to_target) == (3800, 390, 60.0)
    assert summary.final_env_steps == 3900


def test_a_routing_statistic_that_fails_leaves_the_summary_written_and_says_why(tmp_path, monkeypatch):
    def unreadable(checkpoints):
        raise ValueError("flat vector of 12 values, the spec's layout reads 10")

    monkeypatch.setattr("fleet.report.summary._expert_routing", unreadable)
    progress = Progress(CONFIG, tmp_path, started_at=0.0)
    progress.update(_snap(5.0, 500, 20))
    progress.close()
    summary = write_summary(CONFIG, tmp_path, progress, Ending("max_wall_sec 5 reached", 5.0))
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["final_version"] == summary.final_version == 20
    assert written["expert_routing"] == {}
    assert written["expert_routing_error"] == "flat vector of 12 values, the spec's layout reads 10"
