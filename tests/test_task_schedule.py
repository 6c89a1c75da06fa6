"""learner.task_sampling: a solved task keeps its floor, the unsolved ones get
the rest of every batch and of the samplers' env steps; the schedule follows the evaluator's
newest curve; samplers divide env steps, not episodes."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from foundation.config import ConfigError, RunConfig, with_overrides
from foundation.proto import fleetrl_pb2 as pb
from foundation.task_schedule import TaskPicker, TaskSchedule, focus_shares, success_shares

NAMES = ["FetchReach-v4", "FetchPush-v4", "MetaWorld-push-v3"]


@pytest.mark.parametrize(
    ("success", "min_share", "expected"),
    [
        ([1.0, 0.0, 0.0], 0.1, [0.1, 0.45, 0.45]),  # solved: its floor; the rest split by need
        ([1.0, 0.5, 0.0], 0.1, [0.1, 0.1 + 0.7 / 3, 0.1 + 1.4 / 3]),
        ([0.0, 0.0, 0.0], 0.1, [1 / 3, 1 / 3, 1 / 3]),  # nothing solved: even
        ([1.0, 1.0, 1.0], 0.1, [1 / 3, 1 / 3, 1 / 3]),  # everything solved: even, not undefined
        ([1.0, 0.0, 0.0], 0.0, [0.0, 0.5, 0.5]),
    ],
)
def test_success_shares(success, min_share, expected):
    shares = success_shares(success, min_share)
    np.testing.assert_allclose(shares, expected, atol=1e-12)
    assert shares.sum() == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("success", "expected"),
    [
        ([0.0, 0.0, 0.0], [0.8, 0.1, 0.1]),  # nothing solved: the first task listed
        ([0.95, 0.3, 0.0], [0.1, 0.8, 0.1]),  # the first solved: the next below target
        ([0.9, 0.0, 0.5], [0.1, 0.8, 0.1]),  # at target counts as solved; the order, not the score, picks
        ([0.3, 1.0, 0.0], [0.8, 0.1, 0.1]),  # a task that fell below target again gets it back
        ([1.0, 1.0, 0.9], [1 / 3, 1 / 3, 1 / 3]),  # everything solved: even
    ],
)
def test_focus_shares_give_the_rest_to_the_first_unsolved_task_in_order(success, expected):
    shares = focus_shares(success, 0.1, target=0.9)
    np.testing.assert_allclose(shares, expected, atol=1e-12)
    assert shares.sum() == pytest.approx(1.0)


def test_a_floor_the_tasks_cannot_all_keep_is_refused_at_launch_and_by_the_math():
    with pytest.raises(ValueError, match=r"min_share \(0.4\) must be in \[0, 1/3\]"):
        success_shares([0.0, 0.0, 0.0], 0.4)
    with pytest.raises(ValueError, match=r"min_share \(0.4\) must be in \[0, 1/3\]"):
        focus_shares([0.0, 0.0, 0.0], 0.4, 0.9)
    config = with_overrides(RunConfig(), [f"sim.tasks={NAMES!r}".replace("'", '"'), "learner.task_min_share=0.4"])
    with pytest.raises(ConfigError, match="learner.task_min_share"):
        config.validate()
    with pytest.raises(ConfigError, match="learner.task_sampling"):
        with_overrides(RunConfig(), ['learner.task_sampling="hardest"']).validate()


class FakeReplay:
    def __init__(self) -> None:
        self.calls: list[np.ndarray | None] = []

    def set_task_shares(self, shares: np.ndarray | None) -> None:
        self.calls.append(shares)


class FakeAggregator:
    """Answers stats() from a script of curve scores (None: the aggregator is away)."""

    def __init__(self, script: list[pb.EvalReport | None]) -> None:
        self.script, self.calls = script, 0

    def stats(self, timeout_sec: float = 5.0) -> pb.AggregatorStats:
        assert 0 < timeout_sec <= 5.0  # a learner never blocks long on it
        report = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if report is None:
            raise _Unavailable()
        return pb.AggregatorStats(last_curve=report)


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE


def _curve(version: int, *rates: float) -> pb.EvalReport:
    return pb.EvalReport(version=version, kind="curve", task_success=dict(zip(NAMES, rates, strict=True)))


def test_the_schedule_follows_each_new_curve_score_and_keeps_its_shares_otherwise():
    replay = FakeReplay()
    agg = FakeAggregator(
        [pb.EvalReport(), None, _curve(10, 1.0, 0.0, 0.0), _curve(10, 0.0, 0.0, 0.0), _curve(20, 1.0, 1.0, 0.0)]
    )
    schedule = TaskSchedule(NAMES, agg, min_share=0.1, apply=replay.set_task_shares, refresh_sec=0.0)
    schedule.refresh()  # no score yet: nothing set
    schedule.refresh()  # aggregator away: nothing set, no error
    assert replay.calls == [] and schedule.scored_version == -1
    schedule.refresh()
    np.testing.assert_allclose(replay.calls[-1], [0.1, 0.45, 0.45])
    schedule.refresh()  # the same version again: ignored
    assert len(replay.calls) == 1
    schedule.refresh()
    np.testing.assert_allclose(replay.calls[-1], [0.1, 0.1, 0.8])
    assert schedule.scored_version == 20 and agg.calls == 5


def test_a_focus_schedule_moves_on_once_its_task_reaches_the_target():
    replay = FakeReplay()
    agg = FakeAggregator([_curve(10, 0.2, 0.0, 0.0), _curve(20, 0.9, 0.1, 0.0), _curve(30, 1.0, 0.95, 0.0)])
    schedule = TaskSchedule(NAMES, agg, 0.1, replay.set_task_shares, refresh_sec=0.0, mode="focus", target=0.9)
    for _ in range(3):
        schedule.refresh()
    np.testing.assert_allclose(np.array(replay.calls), [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    with pytest.raises(ValueError, match="'hardest'"):
        TaskSchedule(NAMES, agg, 0.1, replay.set_task_shares, mode="hardest")


def test_the_schedule_asks_at_most_every_refresh_sec():
    agg = FakeAggregator([_curve(1, 0.0, 0.0, 0.0)])
    schedule = TaskSchedule(NAMES, agg, min_share=0.1, apply=FakeReplay().set_task_shares, refresh_sec=3600.0)
    for _ in range(5):
        schedule.refresh()
    assert agg.calls == 1


def _take(picker: TaskPicker, lengths: list[int], episodes: int) -> list[int]:
    picks = []
    for _ in range(episodes):
        turn = picker.pick()
        picker.record(turn, lengths[turn])
        picks.append(turn)
    return picks


def test_a_sampler_divides_env_steps_not_episodes():
    # Fetch episodes are 50 steps, Meta-World's 150: three Fetch episodes per Meta-World one.
    picker = TaskPicker(2)
    picks = _take(picker, [50, 150], 400)
    assert picks[:2] == [0, 1]  # ties in order: the first episodes still take every task
    assert abs(int(picker.steps[0]) - int(picker.steps[1])) <= 150, picker.steps
    assert picks.count(0) == pytest.approx(3 * picks.count(1), rel=0.05)


def test_a_sampler_follows_new_shares_and_never_takes_a_zero_share():
    picker = TaskPicker(3)
    _take(picker, [50, 50, 50], 30)  # even so far: 500 steps each
    picker.set_shares(np.array([0.1, 0.45, 0.45]) * 2)  # renormalized
    np.testing.assert_allclose(picker.shares, [0.1, 0.45, 0.45])
    _take(picker, [50, 50, 50], 600)
    share = picker.steps / picker.steps.sum()
    np.testing.assert_allclose(share, [0.1, 0.45, 0.45], atol=0.01)  # the early even steps count too
    picker.set_shares(np.array([0.0, 0.5, 0.5]))
    assert 0 not in _take(picker, [50, 50, 50], 50)


@pytest.mark.parametrize("shares", [[0.5, 0.5, 0.0], [0.0, 0.0], [-0.1, 1.1]])
def test_shares_that_do_not_fit_the_samplers_tasks_are_refused(shares):
    picker = TaskPicker(2)
    with pytest.raises(ValueError, match="do not fit 2 tasks"):
        picker.set_shares(np.array(shares))


def test_a_run_gets_the_schedule_its_config_names():
    agg, apply = FakeAggregator([_curve(1, 0.0, 0.0, 0.0)]), FakeReplay().set_task_shares
    tasks = f"sim.tasks={NAMES!r}".replace("'", '"')
    assert TaskSchedule.for_run(with_overrides(RunConfig(), [tasks]), NAMES, agg, apply) is None  # 'even'
    config = with_overrides(RunConfig(), [tasks, 'learner.task_sampling="focus"', "target_success=0.8"])
    schedule = TaskSchedule.for_run(config, NAMES, agg, apply)
    assert schedule is not None and (schedule.mode, schedule.target, schedule.min_share) == ("focus", 0.8, 0.1)
