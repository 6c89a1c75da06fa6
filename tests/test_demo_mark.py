"""The demonstration mark of a TransitionBatch (sampler.demo_episodes) on its way to the learner:
proto bytes, the ingest servicer, the buffer's record layout, the learner's batch."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from buffer.layout import RecordLayout
from buffer.servicer import ReplayIngestServicer
from buffer.storage import PushKey, RunCounters, WriteResult
from foundation.config import BufferConfig
from foundation.proto import fleetrl_pb2 as pb
from foundation.wire import Transitions, batch_to_proto
from learner.algorithm import Batch
from learner.batches import Batches
from tests.conftest import SMALL_SCHEMA
from tests.fakes import FakeBatchSource

RUN, TASK = "run1", 5


class RecordingWriter:
    """A TransitionWriter (buffer/api.py) that keeps what the servicer asked it to store."""

    def __init__(self) -> None:
        self.layout = RecordLayout(RUN, SMALL_SCHEMA, BufferConfig())
        self.records: list[np.ndarray] = []
        self.keys: list[PushKey | None] = []

    def write(self, transitions: Transitions, *, task_id, policy_version, key=None, env_steps=0, demonstration=False):
        self.records.append(
            self.layout.encode(transitions, task_id=task_id, policy_version=policy_version, demonstration=demonstration)
        )
        self.keys.append(key)
        return WriteResult(committed=sum(map(len, self.records)), stored=len(transitions), duplicate=False)


class NoAbort:
    def abort(self, code, details):
        raise AssertionError(f"the servicer refused the batch: {code} {details}")


def _batch(transitions: Transitions, seq: int, demonstration: bool, episodes: int = 0) -> pb.TransitionBatch:
    return batch_to_proto(
        transitions, run_id=RUN, sampler_id=2, seq=seq, policy_version=0, task_id=TASK,
        env_steps=len(transitions), episodes=episodes, incarnation=7, demonstration=demonstration,
    )  # fmt: skip


def test_the_mark_survives_the_wire_the_servicer_and_the_record_layout(make_transitions):
    writer = RecordingWriter()
    servicer = ReplayIngestServicer(writer, task_ids=(TASK,), schema=SMALL_SCHEMA, run_id=RUN, config=BufferConfig())  # type: ignore[arg-type]
    for seq, demonstration in ((1, True), (2, False)):
        wire = _batch(make_transitions(4, first_id=10 * seq), seq, demonstration, episodes=int(not demonstration))
        sent = pb.TransitionBatch.FromString(wire.SerializeToString())  # what the service receives
        assert sent.demonstration is demonstration
        assert servicer.Push(sent, NoAbort()).stored == 4  # type: ignore[arg-type]
    stored = writer.layout.decode(b"".join(r.tobytes() for r in writer.records))  # the bytes Redis holds
    assert stored["demo"].tolist() == [1] * 4 + [0] * 4
    assert stored["valid"].tolist() == [1] * 8 and stored["task_id"].tolist() == [TASK] * 8
    assert writer.layout.transitions(stored).reward.tolist() == [10, 11, 12, 13, 20, 21, 22, 23]
    assert (
        servicer.counters(RunCounters(8, 2, {TASK: 8})).episodes == 1
    )  # the policy's episode only: a demonstration is none


def test_a_record_stored_before_the_mark_reads_back_valid_and_not_a_demonstration(make_transitions):
    layout = RecordLayout(RUN, SMALL_SCHEMA, BufferConfig())
    older = np.dtype(
        [("row", "<f4", (SMALL_SCHEMA.row_floats,)), ("task_id", "<u4"), ("policy_version", "<u4"), ("valid", "<u4")]
    )
    assert older.itemsize == layout.record_bytes  # the mark took no byte: a stored buffer keeps its layout
    records = np.zeros(3, older)
    records["row"], records["valid"], records["task_id"] = make_transitions(3).pack(), 1, TASK
    back = layout.decode(records.tobytes())
    assert back["valid"].tolist() == [1, 1, 1] and back["demo"].tolist() == [0, 0, 0]


def test_the_learners_batch_carries_the_mark_as_a_float_per_row():
    batches = Batches(FakeBatchSource(demo_every=4), 8, torch.device("cpu"), prefetch=False)
    batch = batches.next(threading.Event())
    assert batch is not None and batch.demo is not None
    assert batch.demo.dtype == torch.float32 and batch.demo.tolist() == [1, 0, 0, 0, 1, 0, 0, 0]
    plain = Batch.from_numpy(*(np.zeros((2, 1), np.float32),) * 3, np.zeros(2), np.zeros((2, 1)), np.zeros(2))
    assert plain.demo is None  # no mark given: no row is a demonstration


@pytest.mark.parametrize("episodes", [1, 3])
def test_a_demonstration_that_claims_training_episodes_is_refused(make_transitions, episodes):
    from buffer.servicer import validate_batch
    from foundation.wire import WireError

    with pytest.raises(WireError, match="a demonstration ends no training episode"):
        validate_batch(
            _batch(make_transitions(4), 1, True, episodes), run_id=RUN, task_ids=(TASK,), schema=SMALL_SCHEMA,
            max_batch_transitions=64,
        )  # fmt: skip
