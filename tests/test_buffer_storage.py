"""TemporalStorage against a real Redis Cluster."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from buffer.storage import Snapshot, TemporalStorage
from fleetrl.config import BufferConfig
from fleetrl.wire import TransitionSchema

SMALL_SCHEMA = TransitionSchema(obs_dim=3, goal_dim=2, act_dim=2)  # make_transitions' default

WINDOW = 8


def storage(client, capacity: int = 10_000, run_id: str = "run1") -> TemporalStorage:
    config = BufferConfig(window_size_transitions=WINDOW, capacity_transitions=capacity)
    return TemporalStorage(client, run_id, SMALL_SCHEMA, config)


def ids_in(store: TemporalStorage, window: int) -> list[int]:
    records = store.read_window(window)
    return [int(r) for r in store.layout.transitions(records[records["valid"] == 1]).reward]


def test_write_then_read_back_is_exact(redis_client, make_transitions):
    store = storage(redis_client)
    t = make_transitions(5, first_id=100)
    assert store.write(t, task_id=3, policy_version=42) == 5
    records = store.read_window(0)
    assert len(records) == 5
    np.testing.assert_array_equal(records["row"], t.pack())
    assert records["task_id"].tolist() == [3] * 5
    assert records["policy_version"].tolist() == [42] * 5
    assert records["valid"].tolist() == [1] * 5
    assert store.snapshot() == Snapshot(head=5, oldest_window=0)


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
    head, oldest = store.snapshot()
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


def test_reserved_but_unwritten_slots_read_as_invalid(redis_client, make_transitions):
    store = storage(redis_client)
    redis_client.incrby(store.layout.head_key, 3)  # a writer reserved [0, 3) and is still writing
    store.write(make_transitions(2, first_id=50), task_id=0, policy_version=0)
    records = store.read_window(0)
    assert records["valid"].tolist() == [0, 0, 0, 1, 1]
    assert ids_in(store, 0) == [50, 51]


def test_capacity_below_two_windows_is_refused(redis_client):
    with pytest.raises(ValueError, match="capacity_transitions"):
        storage(redis_client, capacity=WINDOW)
