"""Flow control (buffer/ratelimit.py): Reverb's SampleToInsertRatio semantics, in rows."""

from __future__ import annotations

import threading
import time

import pytest

from buffer.ratelimit import SampleLimiter, SampleToInsertRatio, longest_push_rows, rate_limit, tolerance_problem
from foundation.config import RunConfig, with_overrides

LIMIT = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=100, error_buffer=50.0)


def test_sampling_waits_for_the_minimum_size_then_for_inserts():
    assert not LIMIT.sample_ok(inserted=99, sampled=0, n=1)
    assert LIMIT.sample_ok(inserted=100, sampled=0, n=50)  # the error buffer's worth ahead
    assert not LIMIT.sample_ok(inserted=100, sampled=0, n=51)
    assert LIMIT.sample_ok(inserted=110, sampled=50, n=20)  # 10 more rows: 20 more samples
    assert not LIMIT.sample_ok(inserted=110, sampled=50, n=21)


def test_inserts_wait_once_they_are_a_tolerance_ahead_of_sampling():
    # diff + n*SPI <= SPI*M + E: with nothing sampled, 100 + 25 rows may go in.
    assert LIMIT.insert_ok(inserted=0, sampled=0, n=125)
    assert not LIMIT.insert_ok(inserted=0, sampled=0, n=126)
    assert LIMIT.inserts_allowed(inserted=0, sampled=0) == 125
    assert not LIMIT.insert_ok(inserted=125, sampled=0, n=1)
    assert LIMIT.insert_ok(inserted=125, sampled=2, n=1)  # two rows sampled: one more insert
    assert LIMIT.inserts_allowed(inserted=125, sampled=2) == 1


def test_the_run_ratio_is_the_replay_ratio_of_the_config():
    config = with_overrides(
        RunConfig(),
        [
            "learner.batch_size=256",
            "sampler.max_env_steps_per_update=2.0",
            "sampler.her_k=4",
            "sampler.random_steps=500",
            "sampler.num_samplers=2",
            "learner.min_replay_transitions=1000",
        ],
    )
    limit = rate_limit(config)
    assert limit is not None
    assert limit.samples_per_insert == pytest.approx(256 / (2.0 * 5))
    assert limit.min_size_to_sample == 1000
    # The samplers' warm-up (500 env steps each, 5 rows per step) goes in before any sampling,
    # plus one episode's slack.
    assert limit.inserts_allowed(0, 0) == 500 * 2 * 5 + 250
    assert rate_limit(with_overrides(config, ["sampler.max_env_steps_per_update=0"])) is None
    fixed = rate_limit(with_overrides(config, ["buffer.samples_per_insert=8", "buffer.rate_tolerance_rows=400"]))
    assert fixed == SampleToInsertRatio(8.0, 1000, 8.0 * 400)


def test_both_sides_turning_as_allowed_keep_the_ratio_and_never_deadlock():
    """Samplers insert 250-row episodes, learners sample 256-row batches, each whenever the
    limiter lets it: the run's replay ratio holds and both keep moving."""
    config = with_overrides(RunConfig(), ["sampler.max_env_steps_per_update=1.0", "learner.batch_size=256"])
    limit = rate_limit(config)
    assert limit is not None
    inserted = sampled = gradients = episodes = 0
    for _ in range(20_000):
        moved = False
        if limit.insert_ok(inserted, sampled, 250):
            inserted, episodes, moved = inserted + 250, episodes + 1, True
        if limit.sample_ok(inserted, sampled, 256):
            sampled, gradients, moved = sampled + 256, gradients + 1, True
        assert moved, (inserted, sampled)  # one side can always go on
    env_steps = episodes * 50
    warmup = config.sampler.random_steps * config.sampler.num_samplers
    # One gradient per env step past the warm-up, within an episode's slack.
    assert abs((env_steps - warmup) - gradients * config.sampler.max_env_steps_per_update) <= 100


def _turns(limit: SampleToInsertRatio, push_rows: int, batch: int, turns: int) -> tuple[int, int]:
    """Samplers push `push_rows` and learners draw `batch`, each whenever allowed; asserts one side
    can always go on and returns (pushes, gradients)."""
    inserted = sampled = pushes = gradients = 0
    for _ in range(turns):
        moved = False
        if limit.insert_ok(inserted, sampled, push_rows):
            inserted, pushes, moved = inserted + push_rows, pushes + 1, True
        if limit.sample_ok(inserted, sampled, batch):
            sampled, gradients, moved = sampled + batch, gradients + 1, True
        assert moved, (inserted, sampled)
    return pushes, gradients


@pytest.mark.parametrize(
    "overrides",
    [
        # A shaped Meta-World reward: 150-step episodes pushed whole, 1 row per step, 1 env step per
        # gradient. An error buffer of 50 rows let learners and samplers wait on each other for ever.
        ["sim.task=MetaWorld-push-v3", "sim.reward=shaped", "sampler.her_k=0", "sampler.max_env_steps_per_update=1.0"],
        [
            "sim.task=MetaWorld-push-v3",
            "sampler.her_k=4",
            "sampler.max_env_steps_per_update=4.0",
            "sampler.random_steps=0",
        ],
        [
            'sim.tasks=["FetchPush-v4","MetaWorld-door-open-v3"]',
            "sim.task=FetchPush-v4",
            "sampler.her_k=0",
            "sampler.max_env_steps_per_update=2.0",
        ],
    ],
)
def test_the_error_buffer_holds_the_longest_episode_so_whole_episode_pushes_never_deadlock(overrides):
    config = with_overrides(RunConfig(), overrides)
    limit = rate_limit(config)
    assert limit is not None
    push = longest_push_rows(config)
    assert push == 150 * (1 + config.sampler.her_k)
    pushes, gradients = _turns(limit, push, config.learner.batch_size, 5000)
    assert pushes > 20 and gradients > 20


def test_a_tolerance_set_below_one_push_is_refused_naming_the_field():
    base = ["sim.task=MetaWorld-push-v3", "sampler.her_k=0", "sampler.max_env_steps_per_update=1.0"]
    small = with_overrides(RunConfig(), [*base, "buffer.rate_tolerance_rows=50"])
    problem = tolerance_problem(small)
    assert problem is not None and "buffer.rate_tolerance_rows (50) must be at least 76" in problem
    # The refusal is right: at that tolerance both sides stop.
    limit = rate_limit(small)
    assert limit is not None
    with pytest.raises(AssertionError):
        _turns(limit, 150, small.learner.batch_size, 5000)
    assert tolerance_problem(with_overrides(RunConfig(), [*base, "buffer.rate_tolerance_rows=76"])) is None
    assert tolerance_problem(with_overrides(RunConfig(), base)) is None  # the derived tolerance


def test_the_ratio_counts_rows_so_episodes_stored_without_her_copies_come_up_to_1_plus_her_k_times_faster():
    """max_env_steps_per_update is kept in rows of 1 + her_k per env step. An episode that moved
    nothing under sampler.her_k_unmoved 0 stores 1 row per step, so its env steps count a fifth
    (her_k 4): the FetchPush-v4 preset (4 per gradient) measured 7.1-8.0 env steps per version to 90%,
    MetaWorld-push alone about 20. The docs say so; this pins the arithmetic."""
    config = with_overrides(
        RunConfig(), ["sampler.max_env_steps_per_update=4.0", "learner.batch_size=1024", "sampler.her_k=4"]
    )
    limit = rate_limit(config)
    assert limit is not None

    def env_steps_per_gradient(rows_per_step: int) -> float:
        inserted = sampled = gradients = steps = 0
        for _ in range(40_000):
            if limit.insert_ok(inserted, sampled, 50 * rows_per_step):  # one 50-step episode
                inserted, steps = inserted + 50 * rows_per_step, steps + 50
            if limit.sample_ok(inserted, sampled, 1024):
                sampled, gradients = sampled + 1024, gradients + 1
        warmup = config.sampler.random_steps * config.sampler.num_samplers
        return (steps - warmup * 5 / rows_per_step) / gradients

    assert env_steps_per_gradient(5) == pytest.approx(4.0, rel=0.02)  # every episode moved: 4 as named
    assert env_steps_per_gradient(1) == pytest.approx(20.0, rel=0.02)  # none moved: 5x


def test_a_learners_limiter_waits_for_inserts_refreshing_and_counts_the_wait():
    """SampleLimiter: a batch the ratio does not allow waits, refreshing every poll; each
    refresh here stores 10 more rows, so a 20-row batch goes once 110 rows are in."""
    limiter = SampleLimiter(LIMIT)
    inserted = [100]
    refreshes = []

    def refresh() -> None:
        refreshes.append(inserted[0])
        inserted[0] += 10

    limiter.report(lambda rows: 50 + rows)  # the run's total comes back: 50 sampled by others
    assert limiter.sampled == 50 and limiter.unreported == 0
    assert limiter.wait(lambda: inserted[0], 20, threading.Event(), refresh)
    assert refreshes == [100] and inserted[0] == 110 and limiter.rate_limited_sec > 0
    limiter.drawn(20)
    reported: list[int] = []
    limiter.report(lambda rows: reported.append(rows) or 70)
    assert reported == [20] and (limiter.sampled, limiter.unreported) == (70, 0)


def test_a_learners_limiter_gives_up_once_stopped_without_waiting_more():
    limiter = SampleLimiter(LIMIT)
    stop = threading.Event()
    stop.set()
    start = time.monotonic()
    assert not limiter.wait(lambda: 0, 1, stop, lambda: pytest.fail("no refresh once stopped"))
    assert time.monotonic() - start < 1.0 and limiter.rate_limited_sec == 0.0
    assert limiter.wait(lambda: 200, 1, stop, lambda: None)  # allowed: no wait, even when stopped


def test_a_learners_limiter_beats_at_every_poll_that_finds_no_room_and_never_with_room_at_once():
    """on_wait is the learner's heartbeat: it runs once per poll that finds no room (here two,
    at 100 and 105 rows stored), so a learner held back by stalled samplers is not taken for hung."""
    limiter = SampleLimiter(LIMIT)
    inserted, beats = [100], []
    stop = threading.Event()
    limiter.report(lambda rows: 50 + rows)

    def refresh() -> None:
        inserted[0] += 5

    def beat() -> None:
        beats.append(inserted[0])

    assert limiter.wait(lambda: inserted[0], 20, stop, refresh, on_wait=beat)
    assert beats == [100, 105] and inserted[0] == 110
    assert limiter.wait(lambda: 200, 20, stop, lambda: None, on_wait=lambda: pytest.fail("room at once: no beat"))


def test_a_beating_limiter_still_gives_up_once_stopped():
    limiter = SampleLimiter(LIMIT)
    stop, beats = threading.Event(), []
    threading.Timer(0.2, stop.set).start()
    start = time.monotonic()
    assert not limiter.wait(lambda: 0, 1, stop, lambda: None, on_wait=lambda: beats.append(time.monotonic()))
    assert time.monotonic() - start < 5.0 and len(beats) >= 2  # beat while it waited, then stopped
    assert limiter.rate_limited_sec == 0.0
