"""The sampler's side of the buffer with a fake ingest client and a fake weights watcher: what
it pushes, in which order, tagged with which weights version, and what it drops when stopped."""

from __future__ import annotations

import threading
import time

import pytest

import sampler.worker as worker
from buffer.ingest_client import PushRejected
from foundation.acting import WeightsSnapshot
from foundation.config import RunConfig, with_overrides
from foundation.ledger import AckLedger, read_ledgers
from foundation.policy import ACTOR_GROUPS, model_spec
from foundation.process import Heartbeat
from foundation.transport import NO_SECURITY
from foundation.wire import batch_from_proto
from nets.models import SACModel
from sampler.pusher import Pusher, row_fingerprint
from sampler.worker import SamplerEndpoints, run_sampler
from sim.registry import get_task
from sim.tasks import TaskSet
from tests.conftest import wait_until
from tests.fakes import FakeIngestClient, FakeWeightsWatcher

TASK = get_task("FetchReach-v4")
SCHEMA = TaskSet.of((TASK.name,)).schema()


def test_the_pusher_stores_each_batch_once_in_order_and_ledgers_what_was_acked(make_transitions, tmp_path):
    ingest = FakeIngestClient(SCHEMA, (TASK.task_id,))
    ledger = AckLedger(tmp_path, "sampler-0", ingest.incarnation)
    pusher = Pusher(ingest, TASK, max_pending=2, ledger=ledger)
    for i in range(5):
        pusher.put(make_transitions(10, 10 * i, SCHEMA), policy_version=i, env_steps=10, successes=i % 2)
    pusher.close(timeout=10.0)
    ledger.close()
    ingest.assert_stored(5)
    stored = ingest.stored()
    assert [b.policy_version for b in stored] == [0, 1, 2, 3, 4]
    assert [(b.episodes, b.successes) for b in stored] == [(1, 0), (1, 1), (1, 0), (1, 1), (1, 0)]
    assert (pusher.acked_transitions, pusher.acked_env_steps, pusher.dropped) == (50, 50, 0)
    rows = read_ledgers(tmp_path, "sampler-0")
    assert [r["seq"] for r in rows] == [1, 2, 3, 4, 5]
    # an auditor finds each acked batch in the buffer by the fingerprint of its first row
    firsts = [row_fingerprint(batch_from_proto(b, SCHEMA).pack()[0]) for b in stored]
    assert [r["fingerprint"] for r in rows] == firsts


def test_a_batch_the_buffer_refuses_fails_the_samplers_next_put(make_transitions):
    ingest = FakeIngestClient(SCHEMA, (TASK.task_id,), reject=frozenset({2}))
    pusher = Pusher(ingest, TASK)
    pusher.put(make_transitions(10, 0, SCHEMA), policy_version=0, env_steps=10)
    pusher.put(make_transitions(10, 10, SCHEMA), policy_version=0, env_steps=10)
    wait_until(lambda: pusher.error is not None, 10, "the pusher thread's error")
    with pytest.raises(RuntimeError, match="pusher thread failed") as failed:
        pusher.put(make_transitions(10, 20, SCHEMA), policy_version=0, env_steps=10)
    assert isinstance(failed.value.__cause__, PushRejected)
    pusher.close(timeout=1.0)
    ingest.assert_stored(1)
    assert pusher.acked_transitions == 10


def test_a_pusher_thread_that_fails_while_put_waits_fails_that_put(make_transitions):
    """A put() waiting on a full queue raises the pusher thread's error once the thread dies
    (a dead thread never drains the queue), with no stop set: the sampler fails, never goes silent."""
    ingest = FakeIngestClient(SCHEMA, (TASK.task_id,), away_from=1, reject=frozenset({1}))
    pusher = Pusher(ingest, TASK, max_pending=1)
    pusher.put(make_transitions(10, 0, SCHEMA), policy_version=0, env_steps=10)  # in flight, unacked
    pusher.put(make_transitions(10, 10, SCHEMA), policy_version=0, env_steps=10)  # queued
    failed: list[BaseException] = []

    def put_while_full() -> None:
        try:
            pusher.put(make_transitions(10, 20, SCHEMA), policy_version=0, env_steps=10)
        except RuntimeError as err:
            failed.append(err)

    blocked = threading.Thread(target=put_while_full)
    blocked.start()
    blocked.join(1.0)
    assert blocked.is_alive()  # the queue is full: put() waits
    ingest.back()  # the buffer answers the push in flight: it refuses the batch, the pusher thread dies
    blocked.join(5.0)
    assert not blocked.is_alive()  # ... and the waiting put() fails
    (err,) = failed
    assert "pusher thread failed" in str(err) and isinstance(err.__cause__, PushRejected)
    pusher.close(timeout=0.5)
    assert [p.outcome for p in ingest.pushes] == ["rejected"]
    assert not ingest.violations and pusher.acked_transitions == 0


def test_batches_wait_while_the_buffer_is_away_and_are_stored_in_order_once_it_is_back(make_transitions):
    ingest = FakeIngestClient(SCHEMA, (TASK.task_id,), away_from=1)
    pusher = Pusher(ingest, TASK, max_pending=2)
    for i in range(3):
        pusher.put(make_transitions(10, 10 * i, SCHEMA), policy_version=0, env_steps=10)
    time.sleep(0.3)
    assert pusher.acked_transitions == 0  # nothing is acked while the buffer is away
    ingest.back()
    pusher.close(timeout=10.0)
    ingest.assert_stored(3)
    assert (pusher.acked_transitions, pusher.dropped) == (30, 0)


def test_a_sampler_halted_while_its_buffer_is_away_stops_at_once_and_counts_what_it_dropped(make_transitions):
    ingest = FakeIngestClient(SCHEMA, (TASK.task_id,), away_from=1)
    halt = threading.Event()
    pusher = Pusher(ingest, TASK, max_pending=1, halt=halt)
    pusher.put(make_transitions(10, 0, SCHEMA), policy_version=0, env_steps=10)  # in flight, unacked
    pusher.put(make_transitions(10, 10, SCHEMA), policy_version=0, env_steps=10)  # queued
    blocked = threading.Thread(target=pusher.put, args=(make_transitions(10, 20, SCHEMA), 0, 10))
    blocked.start()
    blocked.join(1.0)
    assert blocked.is_alive()  # backpressure: a full queue makes the acting thread wait
    halt.set()
    blocked.join(2.0)
    assert not blocked.is_alive()  # ... but never past the role's stop flag
    pusher.close(timeout=0.5)
    assert (pusher.acked_transitions, pusher.dropped) == (0, 3)
    assert [p.outcome for p in ingest.pushes] == ["unacked"]
    assert not ingest.violations


WAITS = [  # why the queue stays full, the fake's keyword, whether the wait calls on_held
    ("flow control holds the pushes back", "held_from", True),
    ("the buffer is away", "away_from", False),
]


@pytest.mark.parametrize("why,fault,beats", WAITS, ids=[w[0] for w in WAITS])
def test_a_full_queue_calls_on_held_only_while_flow_control_holds_the_push_back(why, fault, beats, make_transitions):
    """on_held is the sampler's heartbeat while put() waits: called again and again while flow
    control holds the push in flight back (its rate_limited_sec growing each time), never while
    the buffer is away, so a sampler stuck on a buffer that never answers still goes silent."""
    ingest = FakeIngestClient(SCHEMA, (TASK.task_id,), **{fault: 1})
    pusher = Pusher(ingest, TASK, max_pending=1)
    pusher.put(make_transitions(10, 0, SCHEMA), policy_version=0, env_steps=10)  # in flight, waiting
    pusher.put(make_transitions(10, 10, SCHEMA), policy_version=0, env_steps=10)  # queued
    held: list[float] = []
    kwargs = {"on_held": lambda: held.append(pusher.rate_limited_sec)}
    blocked = threading.Thread(target=pusher.put, args=(make_transitions(10, 20, SCHEMA), 0, 10), kwargs=kwargs)
    blocked.start()
    blocked.join(2.0)
    if beats:
        wait_until(lambda: len(held) >= 3, 10, "three calls of on_held")
        assert held[0] > 0 and held == sorted(set(held)), held  # each call after more time held back
    else:
        assert held == [] and pusher.rate_limited_sec == 0.0
    assert blocked.is_alive()  # the queue is still full: put() waits
    ingest.back()
    blocked.join(5.0)
    assert not blocked.is_alive()
    pusher.close(timeout=10.0)
    ingest.assert_stored(3)


class _Aggregator:
    """The sampler's aggregator client: it only hands out the test's weights watcher."""

    def __init__(self, watcher: FakeWeightsWatcher) -> None:
        self.watcher = watcher

    def __enter__(self) -> _Aggregator:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def watch(self, subscriber: str, groups: tuple[str, ...] = (), *args: object) -> FakeWeightsWatcher:
        assert groups == ACTOR_GROUPS, groups  # a sampler needs the actor and its normalizer only
        return self.watcher


def test_a_sampler_tags_each_batch_with_the_weights_version_it_acted_with(monkeypatch):
    config = with_overrides(RunConfig(), ["sampler.random_steps=0", "sampler.pin_cpus=false", "sampler.mlock=false"])
    tasks = TaskSet.for_run(config)
    model = SACModel(model_spec(config, tasks))
    weights = FakeWeightsWatcher(ACTOR_GROUPS)
    ingest = FakeIngestClient(tasks.schema(), tasks.ids)
    monkeypatch.setattr(worker, "AggregatorClient", lambda *args, **kwargs: _Aggregator(weights))
    monkeypatch.setattr(worker, "IngestClient", lambda *args, **kwargs: ingest)
    stop = threading.Event()
    endpoints = SamplerEndpoints("127.0.0.1:1", "127.0.0.1:2")
    role = threading.Thread(target=run_sampler, args=(config, 0, endpoints, NO_SECURITY, stop, Heartbeat(None)))
    role.start()
    try:
        wait_until(lambda: len(ingest.stored()) >= 2, 60, "two batches before any weights")
        for version in (3, 4):
            weights.publish(WeightsSnapshot(version, {g: model.get_flat(g) for g in ACTOR_GROUPS}, model.spec))
            wait_until(
                lambda v=version: any(b.policy_version == v for b in ingest.stored()), 60, f"a batch of v{version}"
            )
    finally:
        stop.set()
        role.join(30)
    assert not role.is_alive()
    versions = [b.policy_version for b in ingest.stored()]
    assert versions[:2] == [0, 0] and versions == sorted(versions), versions  # never an older version than before
    assert set(versions) <= {0, 3, 4}, versions  # only versions the watcher held
    assert "wait_newer_than" not in weights.asked  # acting never waits for weights
    ingest.assert_stored(len(versions))
