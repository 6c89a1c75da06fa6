"""Progress: what reaches the target, the learning-curve records, and naming a rejected learner."""

from __future__ import annotations

import dataclasses
import json

from fleet.report.progress import EvalPoint, Progress, Snapshot
from foundation.config import RunConfig, with_overrides


def _snap(wall: float, *, curve=None, full=None, rejected=(), train=0.0) -> Snapshot:
    return Snapshot(
        wall_sec=wall,
        env_steps=int(100 * wall),
        transitions=int(500 * wall),
        version=int(10 * wall),
        curve=curve,
        full=full,
        train_success=train,
        train_episodes=10 if train else 0,
        restarts=0,
        rejected_by_learner=rejected,
    )


def _progress(tmp_path) -> Progress:
    config = with_overrides(RunConfig(), ["eval.episodes=50", "target_success=0.9"])
    return Progress(config, tmp_path, started_at=0.0)


def test_only_a_complete_full_score_reaches_the_target(tmp_path):
    progress = _progress(tmp_path)
    progress.update(_snap(1.0, curve=EvalPoint(5, 1.0, 100, 10)))  # a perfect curve score: not enough
    progress.update(_snap(2.0, full=EvalPoint(6, 1.0, 200, 20)))  # an early-stopped full score: never
    assert not progress.reached_target
    assert progress.best_success == 1.0  # the curve's best is still the best seen
    progress.update(_snap(3.0, full=EvalPoint(7, 0.92, 300, 50)))
    assert progress.reached_target and progress.target is not None and progress.target.full.version == 7
    progress.close()


def test_progress_jsonl_records_the_learning_curve(tmp_path):
    progress = _progress(tmp_path)
    progress.update(_snap(1.0, curve=EvalPoint(5, 0.3, 100, 10), train=0.25))
    progress.close()
    rows = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert rows[-1]["eval_success"] == 0.3 and rows[-1]["train_success"] == 0.25
    assert rows[-1]["env_steps"] == 100 and "updates_per_sec" in rows[-1]


def test_a_learner_whose_pushes_are_rejected_is_named(tmp_path, capsys):
    progress = _progress(tmp_path)
    progress.update(_snap(1.0))
    progress.update(_snap(2.0, rejected=(("learner-3", 2),)))
    progress.update(_snap(3.0, rejected=(("learner-3", 3),)))  # not yet doubled: not repeated
    progress.update(_snap(4.0, rejected=(("learner-3", 4),)))
    progress.close()
    err = capsys.readouterr().err
    assert err.count("learner-3:") == 2
    assert "learner-3: 2 gradient pushes rejected" in err and "learner-3: 4 gradient pushes rejected" in err


def test_the_progress_line_shows_the_target_the_cap_and_the_roles_running(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one log line, unwrapped
    overrides = ["eval.episodes=50", "target_success=0.9", "max_wall_sec=600", "max_env_steps=4000"]
    progress = Progress(with_overrides(RunConfig(), overrides), tmp_path, started_at=0.0)
    progress.update(dataclasses.replace(_snap(1.0), roles=(8, 9)))  # one of nine roles down
    progress.close()
    err = capsys.readouterr().err
    assert "roles 8/9" in err
    assert "target 0.90 over 50 episodes, cap 600 s or 4000 env steps" in err


def test_rates_span_the_last_half_minute_so_a_paused_sampler_does_not_read_zero(tmp_path):
    progress = _progress(tmp_path)
    bursty = [(float(t), 100 * (t // 10) * 10) for t in range(0, 61)]  # 1,000 env steps every 10 s
    for wall, steps in bursty:
        progress.update(dataclasses.replace(_snap(wall), env_steps=steps))
        if wall >= 10:
            assert progress.rates.env_steps_per_sec > 0, wall  # a 1 s window read 0 here
    assert 80 <= progress.rates.env_steps_per_sec <= 110  # about 100/s over the last 30 s
    assert progress.rates.updates_per_sec == 10.0  # steady counts: exact
    progress.close()
