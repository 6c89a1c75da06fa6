"""Client classes: the learner's ReplaySampler on the real cluster, the sampler's IngestClient
over real gRPC."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time

import numpy as np
import pytest

from buffer.client import EmptyBufferError, ReplaySampler
from buffer.ingest_client import MAX_MESSAGE_BYTES, IngestClient, IngestUnavailable, PushRejected
from buffer.ratelimit import SampleToInsertRatio
from buffer.service import IngestServer
from buffer.storage import PushKey, TemporalStorage
from foundation.config import BufferConfig
from foundation.wire import Transitions, TransitionSchema

SCHEMA = TransitionSchema(obs_dim=3, goal_dim=2, act_dim=2)  # make_transitions' default
CONFIG = BufferConfig(window_size_transitions=8, capacity_transitions=32)
RUN = "run1"


@pytest.fixture
def storage(redis_client):
    return TemporalStorage(redis_client, RUN, SCHEMA, CONFIG)


@pytest.fixture
def sampler(redis_client):
    return ReplaySampler(redis_client, RUN, SCHEMA, CONFIG, seed=0, refresh_interval_sec=0.0)


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sampled_ids(batch) -> set[int]:
    return {int(i) for i in batch.transitions.reward}


def test_sample_has_the_requested_shapes(storage, sampler, make_transitions):
    storage.write(make_transitions(20), task_id=3, policy_version=9)
    batch = sampler.sample(64)
    assert len(batch) == 64
    t = batch.transitions
    assert t.obs.shape == (64, 3) and t.next_obs.shape == (64, 3)
    assert t.goal.shape == (64, 2) and t.action.shape == (64, 2)
    assert t.reward.shape == (64,) and t.done.shape == (64,)
    assert all(a.dtype == np.float32 for a in t.columns().values())
    assert batch.policy_version.tolist() == [9] * 64
    assert batch.task_id.tolist() == [3] * 64


def test_sampled_rows_are_rows_that_were_pushed(storage, sampler, make_transitions):
    pushed = make_transitions(20, first_id=100)
    storage.write(pushed, task_id=0, policy_version=1)
    batch = sampler.sample(500)
    expected = {int(row[7]): row for row in pushed.pack()}  # reward (the id) is column 7
    for row in batch.transitions.pack():
        np.testing.assert_array_equal(row, expected[int(row[7])])
    assert sampled_ids(batch) == set(range(100, 120))  # uniform: 500 draws hit all 20


def test_partial_newest_window_is_read_incrementally(storage, sampler, make_transitions, redis_client):
    storage.write(make_transitions(3, first_id=0), task_id=0, policy_version=0)
    assert sampler.refresh() and sampler.size() == 3
    # Overwrite a slot the sampler already holds: a re-read would bring task_id 77 in.
    records = storage.layout.encode(make_transitions(1, first_id=0), task_id=77, policy_version=0)
    redis_client.setrange(storage.layout.window_key(0), 0, records.tobytes())
    storage.write(make_transitions(4, first_id=3), task_id=0, policy_version=1)
    assert sampler.refresh() and sampler.size() == 7
    batch = sampler.sample(300)
    assert sampled_ids(batch) == set(range(7))
    assert 77 not in batch.task_id


def test_refresh_without_new_data_changes_nothing(storage, sampler, make_transitions):
    storage.write(make_transitions(10), task_id=0, policy_version=0)
    assert sampler.refresh()
    assert not sampler.refresh()
    assert sampler.size() == 10


def test_nothing_past_a_reservation_in_flight_is_seen_until_it_is_written(storage, sampler, make_transitions):
    slow = PushKey(sampler_id=1, incarnation=5, seq=1)
    storage._reserve_positions(2, slow)  # positions 0, 1 reserved by a slow writer
    storage.write(make_transitions(4, first_id=10), task_id=0, policy_version=0)  # positions 2..5
    sampler.refresh()
    assert sampler.size() == 0  # the committed head waits for positions 0, 1
    # The slow writer (or its sampler's retry) lands: everything is visible, each row once.
    storage.write(make_transitions(2, first_id=20), task_id=0, policy_version=0, key=slow)
    sampler.refresh()
    assert sampler.size() == 6
    assert sampled_ids(sampler.sample(300)) == {10, 11, 12, 13, 20, 21}


def test_a_skipped_range_stays_invalid_even_if_written_late(storage, sampler, make_transitions, redis_client):
    fast = ReplaySampler(redis_client, RUN, SCHEMA, dataclasses.replace(CONFIG, stalled_write_timeout_sec=0.1), seed=0)
    slow = PushKey(sampler_id=1, incarnation=5, seq=1)
    storage._reserve_positions(2, slow)
    storage.write(make_transitions(4, first_id=10), task_id=0, policy_version=0)
    time.sleep(0.2)
    fast.refresh()  # advances past the stalled reservation
    assert fast.size() == 4 and fast.ring.read_upto == 6
    late = storage.layout.encode(make_transitions(2, first_id=20), task_id=0, policy_version=0)
    redis_client.setrange(storage.layout.window_key(0), 0, late.tobytes())  # the stalled writer wakes up
    fresh = ReplaySampler(redis_client, RUN, SCHEMA, CONFIG, seed=1)
    fresh.refresh()
    assert sampled_ids(fresh.sample(300)) == {10, 11, 12, 13}  # a new reader ignores it too


def test_sampler_drops_evicted_windows(storage, sampler, make_transitions):
    storage.write(make_transitions(16, first_id=0), task_id=0, policy_version=0)
    sampler.refresh()
    storage.write(make_transitions(32, first_id=16), task_id=0, policy_version=1)  # head 48, capacity 32
    sampler.refresh()
    assert list(storage.live_windows()) == [2, 3, 4, 5]
    assert sampler.size() == 32
    assert sampled_ids(sampler.sample(1000)) == set(range(16, 48))


def test_sample_on_an_empty_buffer_says_what_to_do(sampler):
    with pytest.raises(EmptyBufferError, match="wait_for"):
        sampler.sample(4)
    with pytest.raises(TimeoutError, match="holds 0 valid transitions"):
        sampler.wait_for(1, timeout_sec=0.1)


def test_wait_for_returns_once_enough_is_stored(storage, sampler, make_transitions):
    timer = threading.Timer(0.2, storage.write, args=(make_transitions(5),), kwargs=dict(task_id=0, policy_version=0))
    timer.start()
    assert sampler.wait_for(5, timeout_sec=5.0) == 5
    timer.join()


def test_push_waits_for_a_service_that_starts_late(storage, make_transitions):
    port = _unused_port()
    server = IngestServer(storage, task_ids=(0,), schema=SCHEMA, run_id=RUN, config=CONFIG, port=port)
    timer = threading.Timer(0.5, server.start)
    timer.start()
    try:
        with IngestClient(f"127.0.0.1:{port}", sampler_id=1, run_id=RUN, push_timeout_sec=1.0) as client:
            ack = client.push(make_transitions(3), seq=1, policy_version=0, task_id=0, env_steps=3, max_retry_sec=20)
        assert ack.stored == 3 and storage.head() == 3
    finally:
        timer.join()
        server.close()


def test_push_gives_up_after_max_retry_sec(make_transitions):
    with IngestClient(f"127.0.0.1:{_unused_port()}", sampler_id=1, run_id=RUN, push_timeout_sec=0.2) as client:
        start = time.monotonic()
        with pytest.raises(IngestUnavailable, match="not acked after 0.5s"):
            client.push(make_transitions(1), seq=1, policy_version=0, task_id=0, env_steps=1, max_retry_sec=0.5)
        assert time.monotonic() - start < 3.0


def test_batch_over_the_message_limit_fails_instead_of_retrying_forever():
    n = MAX_MESSAGE_BYTES // (4 * SCHEMA.row_floats) + 1
    big = Transitions(
        obs=np.zeros((n, 3), np.float32),
        goal=np.zeros((n, 2), np.float32),
        action=np.zeros((n, 2), np.float32),
        reward=np.zeros(n, np.float32),
        next_obs=np.zeros((n, 3), np.float32),
        done=np.zeros(n, np.float32),
    )
    with IngestClient(f"127.0.0.1:{_unused_port()}", sampler_id=1, run_id=RUN) as client:
        with pytest.raises(ValueError, match="smaller batches"):
            client.push(big, seq=1, policy_version=0, task_id=0, env_steps=n)


def test_invalid_push_raises_at_once_without_retry(storage, make_transitions):
    with IngestServer(storage, task_ids=(0,), schema=SCHEMA, run_id=RUN, config=CONFIG) as server:
        with IngestClient(server.address, sampler_id=1, run_id=RUN, push_timeout_sec=1.0) as client:
            with pytest.raises(PushRejected, match="task_id: 4") as err:
                client.push(make_transitions(2), seq=1, policy_version=0, task_id=4, env_steps=2)
        assert err.value.details.startswith("task_id")
        assert server.servicer.counters().rejected == 1  # one attempt, no retries


BIG = BufferConfig(window_size_transitions=64, capacity_transitions=4096)


def _versioned(storage: TemporalStorage, make_transitions, batches: int, rows: int) -> None:
    """`batches` pushes of `rows` rows; batch i has policy version i and ids i*rows..."""
    for i in range(batches):
        storage.write(make_transitions(rows, first_id=i * rows), task_id=0, policy_version=i)


def test_recency_sampling_halves_a_rows_weight_every_half_life(redis_client, make_transitions):
    storage = TemporalStorage(redis_client, RUN, SCHEMA, BIG)
    _versioned(storage, make_transitions, batches=16, rows=100)  # ids 0..1599, newest last
    sampler = ReplaySampler(redis_client, RUN, SCHEMA, BIG, seed=0, refresh_interval_sec=0.0, sampling="recency",
                            half_life=400)  # fmt: skip
    ages = 1599 - np.concatenate([sampler.sample(1000).transitions.reward for _ in range(40)]).astype(np.int64)
    assert ages.min() >= 0 and ages.max() <= 1599
    # Weight 2^(-age/400) truncated at 1600: P(age < 400) = 0.5 / (1 - 2^-4) = 0.533.
    assert abs(np.mean(ages < 400) - 0.5 / (1 - 2**-4)) < 0.02
    assert abs(np.mean((ages >= 400) & (ages < 800)) - 0.25 / (1 - 2**-4)) < 0.02
    uniform = ReplaySampler(redis_client, RUN, SCHEMA, BIG, seed=0, refresh_interval_sec=0.0)
    uniform_ages = 1599 - uniform.sample(20000).transitions.reward.astype(np.int64)
    assert abs(np.mean(uniform_ages < 400) - 0.25) < 0.02  # the contrast: uniform is not


def test_version_sampling_draws_only_rows_within_the_policy_lag(redis_client, make_transitions):
    storage = TemporalStorage(redis_client, RUN, SCHEMA, BIG)
    _versioned(storage, make_transitions, batches=16, rows=100)  # versions 0..15
    sampler = ReplaySampler(redis_client, RUN, SCHEMA, BIG, seed=0, refresh_interval_sec=0.0, sampling="version",
                            max_policy_lag=3)  # fmt: skip
    batch = sampler.sample(2000, version=15)
    assert set(batch.policy_version.tolist()) == {12, 13, 14, 15}
    assert sampled_ids(batch) >= {1200, 1599}  # the whole eligible range, its ends included
    assert sampler.lag_fallbacks == 0
    assert min(sampler.sample(500, version=5).policy_version.tolist()) == 2
    # The learner far ahead of every row: the newest rows stand in, counted.
    stale = sampler.sample(50, version=100)  # from the newest 4 x 50 rows
    assert set(stale.policy_version.tolist()) <= {14, 15} and sampler.lag_fallbacks == 1


def test_balanced_sampling_gives_every_task_its_share_whatever_the_buffer_holds(redis_client, make_transitions):
    storage = TemporalStorage(redis_client, RUN, SCHEMA, BIG)
    storage.write(make_transitions(1800, first_id=0), task_id=0, policy_version=0)  # 90% of the rows
    storage.write(make_transitions(150, first_id=1800), task_id=2, policy_version=0)
    storage.write(make_transitions(50, first_id=1950), task_id=5, policy_version=0)  # 2.5%
    balanced = ReplaySampler(redis_client, RUN, SCHEMA, BIG, seed=0, refresh_interval_sec=0.0, balance_tasks=(0, 2, 5))
    batch = balanced.sample(256)
    assert np.bincount(batch.task_id, minlength=6)[[0, 2, 5]].tolist() == [86, 85, 85]
    ids = batch.transitions.reward.astype(np.int64)  # make_transitions: reward = the row's id
    assert np.all((batch.task_id == 5) == (ids >= 1950))  # each row is its task's own
    assert len(set(ids[batch.task_id == 5].tolist())) > 40  # drawn over the task's rows, not one
    uniform = ReplaySampler(redis_client, RUN, SCHEMA, BIG, seed=0, refresh_interval_sec=0.0)
    assert np.mean(uniform.sample(4000).task_id == 0) > 0.85  # the contrast: the buffer's own shares


def test_balanced_sampling_gives_an_absent_tasks_share_to_the_others(redis_client, make_transitions):
    storage = TemporalStorage(redis_client, RUN, SCHEMA, BIG)
    storage.write(make_transitions(600, first_id=0), task_id=0, policy_version=0)
    storage.write(make_transitions(600, first_id=600), task_id=1, policy_version=0)
    balanced = ReplaySampler(redis_client, RUN, SCHEMA, BIG, seed=0, refresh_interval_sec=0.0, balance_tasks=(0, 1, 2))
    batch = balanced.sample(300)  # task 2 has no row yet
    counts = np.bincount(batch.task_id, minlength=3)
    assert len(batch) == 300 and counts[2] == 0 and counts[0] >= 100 and counts[1] >= 100


def test_task_shares_set_each_tasks_rows_in_a_batch_and_a_bad_set_is_refused(redis_client, make_transitions):
    storage = TemporalStorage(redis_client, RUN, SCHEMA, BIG)
    for task in range(3):
        storage.write(make_transitions(500, first_id=500 * task), task_id=task, policy_version=0)
    sampler = ReplaySampler(redis_client, RUN, SCHEMA, BIG, seed=0, refresh_interval_sec=0.0, balance_tasks=(0, 1, 2))
    sampler.set_task_shares(np.array([0.1, 0.3, 0.6]))
    assert np.bincount(sampler.sample(256).task_id, minlength=3).tolist() == [26, 77, 153]  # sums to 256
    sampler.set_task_shares(None)
    assert np.bincount(sampler.sample(256).task_id, minlength=3).tolist() == [86, 85, 85]
    for bad in ([0.5, 0.5], [0.5, -0.1, 0.6], [0.0, 0.0, 0.0]):
        with pytest.raises(ValueError, match="need 3 values >= 0 with a positive sum"):
            sampler.set_task_shares(np.array(bad))


def test_an_unknown_sampling_strategy_is_refused(redis_client):
    with pytest.raises(ValueError, match="sampling 'newest': expected one of"):
        ReplaySampler(redis_client, RUN, SCHEMA, BIG, seed=0, sampling="newest")


def test_flow_control_holds_a_push_back_until_a_learner_has_sampled(storage, redis_client, make_transitions):
    """One sampled row per stored row, 10 rows of tolerance: 20 rows go in unsampled; the next
    push is answered 'rate limited' (counted, retried, never stored early) until a learner's
    ReplaySampler draws and reports rows; then it is stored once."""
    limit = SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=10, error_buffer=10.0)
    server = IngestServer(storage, task_ids=(0,), schema=SCHEMA, run_id=RUN, config=BIG, limit=limit)
    stop = threading.Event()
    with server, IngestClient(server.address, sampler_id=1, run_id=RUN) as client:
        client.push(make_transitions(20), seq=1, policy_version=0, task_id=0, env_steps=20)

        def second() -> None:
            client.push(make_transitions(5, first_id=20), seq=2, policy_version=0, task_id=0, env_steps=5)

        pusher = threading.Thread(target=second)
        pusher.start()
        deadline = time.monotonic() + 60  # a bound against hanging, not a timing check
        while server.servicer.counters().rate_limited < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert pusher.is_alive() and storage.head() == 20  # held back, nothing stored early
        learner = ReplaySampler(redis_client, RUN, SCHEMA, BIG, seed=0, refresh_interval_sec=0.0, limit=limit)
        learner.refresh()
        stop.set()
        beats: list[int] = []
        # 40 > 20 stored + 10 tolerance: it would wait, beating at each poll
        assert not learner.wait_to_sample(40, stop, on_wait=lambda: beats.append(1)) and beats
        assert learner.wait_to_sample(15, stop, on_wait=lambda: pytest.fail("room at once: no beat"))
        learner.sample(15)
        learner.refresh()  # reports the 15 rows: the push may go in now
        pusher.join(60)
        assert not pusher.is_alive() and storage.head() == 25
    assert client.rate_limited_sec > 0
