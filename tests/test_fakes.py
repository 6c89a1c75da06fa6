"""The fakes fail a test at a call that breaks their client's contract (one row per misuse) and
take the arguments their protocol's methods take."""

from __future__ import annotations

import dataclasses
import inspect
import threading

import numpy as np
import pytest

from aggregator.client import GradientPush
from buffer.api import BatchSource
from foundation.acting import WeightsSnapshot
from foundation.policy import GRADIENT_GROUPS
from nets.models import norm_stats
from tests.conftest import SMALL_SCHEMA
from tests.fakes import FakeAggregatorClient, FakeBatchSource, FakeIngestClient, FakeWeightsWatcher
from tests.helpers import SPEC

INGEST_MISUSES = [
    ("a gap in seq", lambda ingest, rows: [ingest.push(rows(), seq=s, **TAGS) for s in (1, 3)], "seq 3 after seq 1"),
    ("seq from 0", lambda ingest, rows: ingest.push(rows(), seq=0, **TAGS), "seq: 0"),
    ("a seq reused", lambda ingest, rows: [ingest.push(rows(first_id=i), seq=1, **TAGS) for i in (0, 9)], "again"),
    ("wrong width", lambda ingest, rows: ingest.push(_wide(rows()), seq=1, **TAGS), r"columns\[obs\].shape"),
    ("unknown task", lambda ingest, rows: ingest.push(rows(), seq=1, **{**TAGS, "task_id": 99}), "task_id"),
    ("NaN reward", lambda ingest, rows: ingest.push(_nan(rows()), seq=1, **TAGS), "NaN"),
]
TAGS = {"policy_version": 0, "task_id": 1, "env_steps": 4}


def _wide(rows):
    return dataclasses.replace(rows, obs=np.zeros((len(rows), SMALL_SCHEMA.obs_dim + 1), np.float32))


def _nan(rows):
    return dataclasses.replace(rows, reward=np.full(len(rows), np.nan, np.float32))


@pytest.mark.parametrize("misuse,call,message", INGEST_MISUSES, ids=[m[0] for m in INGEST_MISUSES])
def test_the_fake_ingest_client_fails_a_push_the_contract_forbids(misuse, call, message, make_transitions):
    ingest = FakeIngestClient(SMALL_SCHEMA, (1,))
    with pytest.raises(AssertionError, match=message):
        call(ingest, lambda n=4, first_id=0: make_transitions(n, first_id))
    assert ingest.violations  # kept, for a pusher thread that swallows the error
    with pytest.raises(AssertionError):
        ingest.assert_stored(len(ingest.stored()))


def test_the_fake_ingest_client_acks_a_re_push_of_the_same_batch_as_a_duplicate(make_transitions):
    ingest = FakeIngestClient(SMALL_SCHEMA, (1,))
    first, again = (ingest.push(make_transitions(4), seq=1, **TAGS) for _ in range(2))
    assert (first.duplicate, first.stored, again.duplicate, again.stored) == (False, 4, True, 0)
    ingest.assert_stored(1)


def _snapshot(version: int, agg: FakeAggregatorClient) -> WeightsSnapshot:
    return WeightsSnapshot(version, agg.watch("test").latest().tensors, SPEC)


def test_the_fake_watcher_refuses_versions_that_go_back_and_waits_without_a_timeout():
    agg = FakeAggregatorClient(SPEC)
    weights = FakeWeightsWatcher()
    weights.publish(_snapshot(2, agg))
    with pytest.raises(AssertionError, match="version 1 after 2: backwards"):
        weights.publish(_snapshot(1, agg))
    with pytest.raises(AssertionError, match="without a timeout"):
        weights.wait_newer_than(2)
    assert weights.wait_newer_than(2, timeout=0.05) is None and weights.wait_newer_than(1, timeout=0).version == 2
    weights.close()
    with pytest.raises(AssertionError, match="closed watcher"):
        weights.latest()


def _push(agg: FakeAggregatorClient, base_version: int = 0, **changes) -> GradientPush:
    rng = np.random.default_rng(0)
    grads = {g: rng.normal(size=agg.watch("test").latest().tensors[g].size).astype(np.float32) for g in GRADIENT_GROUPS}
    push = GradientPush(0, base_version, grads, norm_stats(rng.normal(size=(8, SPEC.input_dim))), batch_size=8)
    return dataclasses.replace(push, **changes)


AGGREGATOR_MISUSES = [
    ("two in flight", lambda agg: [agg.push_gradients_async(_push(agg, v)) for v in (0, 1)], "awaits its ack"),
    ("a version not yet broadcast", lambda agg: agg.push_gradients(_push(agg, 5)), "base_version 5"),
    ("a group missing", lambda agg: agg.push_gradients(_push(agg, grads={})), "gradient shapes"),
    ("NaN gradients", lambda agg: agg.push_gradients(_push(agg, grads=_nan_grads(agg))), "finite"),
    ("more rows than the batch", lambda agg: agg.push_gradients(_push(agg, batch_size=4)), "norm_stats count"),
]


def _nan_grads(agg):
    return {g: np.full_like(v, np.nan) for g, v in _push(agg).grads.items()}


@pytest.mark.parametrize("misuse,call,message", AGGREGATOR_MISUSES, ids=[m[0] for m in AGGREGATOR_MISUSES])
def test_the_fake_aggregator_client_fails_a_push_the_contract_forbids(misuse, call, message):
    agg = FakeAggregatorClient(SPEC)
    with pytest.raises(AssertionError, match=message):
        call(agg)
    with pytest.raises(AssertionError):
        agg.assert_pushes(at_least=0)


def test_each_push_the_fake_aggregator_takes_is_a_new_version_every_watcher_sees():
    agg = FakeAggregatorClient(SPEC)
    weights = agg.watch("learner-0", ("actor",))
    before = weights.latest().tensors["actor"]
    ack = agg.push_gradients(_push(agg, 0))
    assert (ack.applied, ack.version, weights.latest().version) == (True, 1, 1)
    assert set(weights.latest().tensors) == {"actor"} and not np.array_equal(weights.latest().tensors["actor"], before)
    agg.assert_pushes(at_least=1)


@pytest.mark.parametrize("method", ["wait_to_sample", "sample"])
def test_the_fake_batch_source_takes_the_protocols_arguments(method):
    """The learner's code is tested against FakeBatchSource: its methods take the arguments of
    buffer.api.BatchSource's, by the same names and kinds, each optional one optional there too."""

    def params(f):
        return [
            (p.name, p.kind, p.default is inspect.Parameter.empty) for p in inspect.signature(f).parameters.values()
        ]

    assert params(getattr(FakeBatchSource, method)) == params(getattr(BatchSource, method))


def test_the_fake_batch_source_holds_batches_back_beating_until_there_is_room():
    source, stop, beats = FakeBatchSource(), threading.Event(), []
    source.room.clear()  # stalled samplers
    threading.Timer(0.1, source.room.set).start()
    assert source.wait_to_sample(4, stop, on_wait=lambda: beats.append(1)) and len(beats) >= 2
    source.sample(4)
    with pytest.raises(AssertionError, match="a callable"):
        source.wait_to_sample(4, stop, on_wait=None)  # type: ignore[arg-type]  # the misuse under test
    source.room.clear()
    stop.set()
    assert not source.wait_to_sample(4, stop, on_wait=lambda: None)
    with pytest.raises(AssertionError, match="flow control bypassed"):
        source.sample(4)
