"""TemporalStorage against a real Redis Cluster."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from buffer.storage import PushKey, RunCounters, Snapshot, TemporalStorage, WriteResult
from foundation.config import BufferConfig
from foundation.wire import TransitionSchema

SMALL_SCHEMA = TransitionSchema(obs_dim=3, goal_dim=2, act_dim=2)  # make_transitions' default

WINDOW = 8


def storage(client, capacity: int = 10_000, run_id: str = "run1", stalled_sec: float = 30.0) -> TemporalStorage:
    config = BufferConfig(
        window_size_transitions=WINDOW, capacity_transitions=capacity, stalled_write_timeout_sec=stalled_sec
    )
    return TemporalStorage(client, run_id, SMALL_SCHEMA, config)


def ids_in(store: TemporalStorage, window: int) -> list[int]:
    records = store.read_window(window)
    return [int(r) for r in store.layout.transitions(records[records["valid"] == 1]).reward]


def test_write_then_read_back_is_exact(redis_client, make_transitions):
    store = storage(redis_client)
    t = make_transitions(5, first_id=100)
    assert store.write(t, task_id=3, policy_version=42) == WriteResult(committed=5, stored=5, duplicate=False)
    records = store.read_window(0)
    assert len(records) == 5
    np.testing.assert_array_equal(records["row"], t.pack())
    assert records["task_id"].tolist() == [3] * 5
    assert records["policy_version"].tolist() == [42] * 5
    assert records["valid"].tolist() == [1] * 5
    assert store.snapshot() == Snapshot(committed=5, oldest_window=0)


def test_batches_straddling_windows_are_split(redis_client, make_transitions):
    store = storage(redis_client)
    store.write(make_transitions(5, first_id=0), task_id=0, policy_version=0)
    store.write(make_transitions(20, first_id=5), task_id=0, policy_version=1)
    assert store.head() == 25
    assert list(store.live_windows()) == [0, 1, 2, 3]
    assert ids_in(store, 0) == list(range(0, 8))
    assert ids_in(store, 1) == list(range(8, 16))
    assert ids_in(store, 2) == list(range(16, 24))
    assert ids_in(store, 3) == [24]
    assert store.read_window(0)["policy_version"].tolist() == [0] * 5 + [1] * 3


def test_eviction_drops_oldest_whole_windows_and_keeps_capacity(redis_client, make_transitions):
    store = storage(redis_client, capacity=3 * WINDOW)
    for i in range(10):
        store.write(make_transitions(7, first_id=7 * i), task_id=0, policy_version=i)
    head, oldest, _ = store.snapshot()
    assert head == 70
    # Windows wholly older than head - capacity = 46 are gone: windows 0..4 (positions < 40).
    assert oldest == 5
    assert list(store.live_windows()) == [5, 6, 7, 8]
    for window in range(oldest):
        assert redis_client.exists(store.layout.window_key(window)) == 0
    live = sum(len(ids_in(store, w)) for w in store.live_windows())
    assert live >= 3 * WINDOW  # at least the newest `capacity` transitions stay
    assert ids_in(store, 5)[0] == 40
    assert ids_in(store, 8)[-1] == 69


def test_consecutive_windows_spread_over_nodes(redis_client):
    store = storage(redis_client)
    ports = {redis_client.get_node_from_key(store.layout.window_key(w)).port for w in range(12)}
    assert len(ports) >= 3


def test_runs_do_not_share_keys(redis_client, make_transitions):
    a, b = storage(redis_client, run_id="a"), storage(redis_client, run_id="b")
    a.write(make_transitions(3), task_id=0, policy_version=0)
    assert b.head() == 0 and list(b.live_windows()) == []


def test_concurrent_writers_store_every_row_exactly_once(redis_client, make_transitions):
    store = storage(redis_client)
    writers, batches, rows = 4, 10, 5

    def write(w: int) -> None:
        own = storage(redis_client)  # one storage per writer, as with several ingest servers
        for b in range(batches):
            own.write(make_transitions(rows, first_id=(w * batches + b) * rows), task_id=0, policy_version=w)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = writers * batches * rows
    assert store.head() == total
    stored = sorted(i for w in store.live_windows() for i in ids_in(store, w))
    assert stored == list(range(total))


def test_the_committed_head_waits_for_a_reservation_still_being_written(redis_client, make_transitions):
    store = storage(redis_client)
    status, start, _, _ = store._reserve_positions(3, PushKey(1, 11, 1))  # a writer reserved [0, 3) ...
    assert (status, start) == (0, 0)
    assert store.write(make_transitions(2, first_id=50), task_id=0, policy_version=0).committed == 0
    assert store.advance() == 0  # ... and is still within stalled_write_timeout_sec
    records = store.read_window(0)
    assert records["valid"].tolist() == [0, 0, 0, 1, 1]  # written, but not yet visible to readers


def test_a_stalled_reservation_is_skipped_and_its_late_retry_is_stored_elsewhere_once(redis_client, make_transitions):
    store = storage(redis_client, stalled_sec=0.2)
    key = PushKey(1, 11, 1)
    store._reserve_positions(3, key)  # its ingest died after reserving [0, 3), before writing
    store.write(make_transitions(2, first_id=50), task_id=0, policy_version=0)
    time.sleep(0.3)
    assert store.advance() == 5
    assert store.snapshot().skipped == ((0, 3),)
    late = store.write(make_transitions(3, first_id=10), task_id=0, policy_version=0, key=key)  # the retry
    assert late == WriteResult(committed=8, stored=3, duplicate=False)
    again = store.write(make_transitions(3, first_id=10), task_id=0, policy_version=0, key=key)
    assert again.duplicate and again.stored == 0
    assert ids_in(store, 0)[-3:] == [10, 11, 12]  # positions 5..7


def test_a_resumed_run_abandons_the_reservations_its_dead_writers_left_at_once(redis_client, make_transitions):
    store = storage(redis_client)  # stalled_write_timeout_sec 30 s
    store._reserve_positions(3, PushKey(1, 11, 1))  # the whole fleet died after reserving [0, 3)
    store.write(make_transitions(2, first_id=50), task_id=0, policy_version=0)
    assert store.advance() == 0  # within the timeout, readers still wait for it
    assert store.advance(abandon=True) == 5  # every writer is known dead: skipped now
    assert store.snapshot().skipped == ((0, 3),)
    assert store.write(make_transitions(1, first_id=9), task_id=0, policy_version=0).committed == 6


def test_a_retried_key_is_stored_once_even_through_a_new_storage_object(redis_client, make_transitions):
    first = storage(redis_client)
    key = PushKey(2, 99, 1)
    assert first.write(make_transitions(4), task_id=0, policy_version=0, key=key).stored == 4
    restarted = storage(redis_client)  # an ingest restart, or a second ingest service
    retry = restarted.write(make_transitions(4), task_id=0, policy_version=0, key=key)
    assert retry == WriteResult(committed=4, stored=0, duplicate=True)
    older = restarted.write(make_transitions(4), task_id=0, policy_version=0, key=key._replace(seq=0 + 1))
    assert older.duplicate
    assert first.head() == 4


def test_a_half_written_batch_retried_rewrites_the_same_positions(redis_client, make_transitions):
    store = storage(redis_client)
    key = PushKey(3, 5, 1)
    batch = make_transitions(5, first_id=20)
    status, start, _, _ = store._reserve_positions(5, key)  # reserved; the write then failed midway
    records = store.layout.encode(batch, task_id=0, policy_version=0)
    redis_client.setrange(store.layout.window_key(0), 0, records[:2].tobytes())  # two of five landed
    result = store.write(batch, task_id=0, policy_version=0, key=key)
    assert result == WriteResult(committed=5, stored=5, duplicate=False)
    assert ids_in(store, 0) == [20, 21, 22, 23, 24]  # no row twice
    assert store.write(batch, task_id=0, policy_version=0, key=key).duplicate


def test_a_restarted_sampler_is_a_new_incarnation_and_its_seq_1_is_new_data(redis_client, make_transitions):
    store = storage(redis_client)
    store.write(make_transitions(2, first_id=0), task_id=0, policy_version=0, key=PushKey(4, 1001, 1))
    restarted = store.write(make_transitions(2, first_id=2), task_id=0, policy_version=0, key=PushKey(4, 2002, 1))
    assert restarted.stored == 2 and not restarted.duplicate
    assert ids_in(store, 0) == [0, 1, 2, 3]


def test_dedup_state_is_small_and_expires(redis_client, make_transitions):
    store = storage(redis_client)
    key = PushKey(5, 77, 1)
    for seq in range(1, 51):
        store.write(make_transitions(1, first_id=seq), task_id=0, policy_version=0, key=key._replace(seq=seq))
    assert 0 < store.dedup_bytes(key) < 512  # one small hash per incarnation, whatever it pushed
    ttl = redis_client.ttl(store.layout.dedup_key(5, 77))
    assert 0 < ttl <= store.dedup_ttl_sec


def test_an_unlink_that_failed_is_retried_by_the_next_write(redis_client, make_transitions):
    store = storage(redis_client, capacity=2 * WINDOW)
    redis_client.set(store.layout.window_key(40), b"left over")  # evicted, but its UNLINK failed
    redis_client.sadd(store.layout.evict_key, 40)
    store.write(make_transitions(1), task_id=0, policy_version=0)
    assert redis_client.exists(store.layout.window_key(40)) == 0
    assert redis_client.scard(store.layout.evict_key) == 0


def test_capacity_below_two_windows_is_refused(redis_client):
    with pytest.raises(ValueError, match="capacity_transitions"):
        storage(redis_client, capacity=WINDOW)


def test_the_run_counters_count_each_push_once_through_retries_and_restarts(redis_client, make_transitions):
    first = storage(redis_client)
    first.write(make_transitions(4), task_id=0, policy_version=0, key=PushKey(1, 7, 1), env_steps=3)
    first.write(make_transitions(4), task_id=0, policy_version=0, key=PushKey(1, 7, 1), env_steps=3)  # a retry
    restarted = storage(redis_client)  # an ingest restart: the counters are in Redis, not in the process
    assert restarted.counters() == RunCounters(env_steps=3, batches=1, env_steps_by_task={0: 3})
    restarted.write(make_transitions(4), task_id=0, policy_version=0, key=PushKey(1, 7, 1), env_steps=3)
    restarted.write(make_transitions(2), task_id=5, policy_version=0, key=PushKey(1, 7, 2), env_steps=2)
    restarted.write(make_transitions(1), task_id=5, policy_version=0, env_steps=1)  # no key: every call counts
    assert first.counters() == RunCounters(env_steps=6, batches=3, env_steps_by_task={0: 3, 5: 3})
    assert storage(redis_client, run_id="other").counters() == RunCounters(0, 0, {})


def test_a_push_skipped_as_stalled_counts_once_when_its_retry_is_stored(redis_client, make_transitions):
    store = storage(redis_client, stalled_sec=0.2)
    key = PushKey(1, 11, 1)
    store._reserve_positions(3, key)  # its ingest died after reserving, before writing: never acked
    time.sleep(0.3)
    assert store.advance() == 3 and store.counters().batches == 0  # skipped: nothing counted
    store.write(make_transitions(3, first_id=10), task_id=0, policy_version=0, key=key, env_steps=3)  # the retry
    store.write(make_transitions(3, first_id=10), task_id=0, policy_version=0, key=key, env_steps=3)
    assert store.counters() == RunCounters(env_steps=3, batches=1, env_steps_by_task={0: 3})


def test_the_same_pushes_through_concurrent_writers_count_once(redis_client, make_transitions):
    """Every writer retries every push of two sampler incarnations at once, as several ingest
    services behind one cluster could: each push is counted once, as it is stored once."""
    pushes = [PushKey(sampler, 100 + sampler, seq) for sampler in range(2) for seq in range(1, 9)]

    def write() -> None:
        own = storage(redis_client)
        for key in pushes:
            own.write(make_transitions(2), task_id=key.sampler_id, policy_version=0, key=key, env_steps=key.seq)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    steps = sum(range(1, 9))
    assert storage(redis_client).counters() == RunCounters(2 * steps, len(pushes), {0: steps, 1: steps})
    assert storage(redis_client).head() == 2 * len(pushes)
