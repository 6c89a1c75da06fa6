"""The aggregator over real gRPC on loopback, driven by the real AggregatorClient."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable

import grpc
import numpy as np
import pytest

from aggregator.client import AggregatorClient
from aggregator.core import AggregatorCore
from aggregator.service import AggregatorServer
from aggregator.servicer import AggregatorServicer
from foundation.checkpoint import load_checkpoint
from foundation.config import AggregatorConfig
from foundation.policy import GRADIENT_GROUPS, GROUPS
from foundation.proto import fleetrl_pb2 as pb
from foundation.proto import fleetrl_pb2_grpc as pb_grpc
from foundation.shm import SharedWeightsWriter
from foundation.transport import GRPC_OPTIONS
from foundation.wire import WIRE_DTYPES, from_tensor, to_tensor
from tests.conftest import wait_until
from tests.helpers import CONFIG, SPEC, make_core, push


@pytest.fixture
def server(tmp_path):
    with AggregatorServer(make_core(), CONFIG, run_dir=tmp_path) as srv:
        yield srv


@pytest.fixture
def client(server):
    with AggregatorClient(server.address, timeout_sec=5.0) as agg:
        yield agg


@pytest.fixture
def stub(server):
    channel = grpc.insecure_channel(server.address, options=GRPC_OPTIONS)
    yield pb_grpc.AggregatorStub(channel)
    channel.close()


def test_pushes_increment_the_version_and_watchers_see_each_new_version(server, client):
    core = server.servicer.core
    with client.watch("sampler-0") as watcher:
        first = watcher.wait_newer_than(-1, timeout=10)
        assert first is not None and first.version == 0
        assert first.spec == SPEC
        assert set(first.tensors) == set(GROUPS)
        for version in range(3):
            ack = client.push_gradients(push(core, version, seed=version))
            assert (ack.applied, ack.version) == (True, version + 1)
            snapshot = watcher.wait_newer_than(version, timeout=10)
            assert snapshot is not None and snapshot.version == version + 1
        for group in GROUPS:
            np.testing.assert_array_equal(snapshot.tensors[group], core.weights()[group])
        assert not np.array_equal(snapshot.tensors["actor"], first.tensors["actor"])
        stats = client.stats()
        assert (stats.version, stats.gradients_applied, stats.subscribers) == (3, 3, 1)
    assert server.servicer.metrics == {"loss/critic": 0.5}


def test_async_push_is_acked_and_a_stale_push_is_reported(server, client):
    core = server.servicer.core
    pending = [client.push_gradients_async(push(core, v, seed=v)) for v in (0,)]
    assert pending[0].result().version == 1
    client.push_gradients(push(core, 1))
    client.push_gradients(push(core, 2))
    before = core.weights()
    ack = client.push_gradients(push(core, 0, seed=5))  # 3 versions behind, max_staleness 1
    assert (ack.applied, ack.version) == (False, 3)
    assert "stale" in ack.reason
    np.testing.assert_array_equal(core.weights()["actor"], before["actor"])
    stats = client.stats()
    assert (stats.gradients_applied, stats.gradients_stale, stats.gradients_rejected) == (3, 1, 0)


def test_a_waiting_stream_is_counted_so_new_versions_wake_it(server, client):
    with client.watch("sampler-0", ("actor",)) as watcher:
        watcher.wait_newer_than(-1, timeout=10)
        wait_until(lambda: server.servicer._waiters == 1, 10.0, "a stream waiting", interval_sec=0.01)  # for version 1
        client.push_gradients(push(server.servicer.core, 0))
        assert watcher.wait_newer_than(0, timeout=10).version == 1
    wait_until(lambda: server.servicer._waiters == 0, 10.0, "no stream waiting", interval_sec=0.01)


def test_a_watcher_of_some_groups_gets_only_those(server, client):
    with client.watch("evaluator-0", groups=("actor", "obs_norm")) as watcher:
        client.push_gradients(push(server.servicer.core, 0))
        snapshot = watcher.wait_newer_than(0, timeout=10)
    assert snapshot is not None and snapshot.version == 1
    assert set(snapshot.tensors) == {"actor", "obs_norm"}
    weights = server.servicer.core.weights()
    np.testing.assert_array_equal(snapshot.tensors["actor"], weights["actor"])
    np.testing.assert_array_equal(snapshot.tensors["obs_norm"], weights["obs_norm"])


def test_min_interval_conflates_versions(server, client):
    core = server.servicer.core
    versions = 12
    with client.watch("slow", min_interval_sec=0.3) as slow:
        assert slow.wait_newer_than(-1, timeout=10).version == 0
        start = time.monotonic()
        for v in range(versions):
            client.push_gradients(push(core, v, seed=v))
        newest = slow.wait_newer_than(versions - 1, timeout=10)
        elapsed = time.monotonic() - start
        assert newest is not None and newest.version == versions
        received = slow.received
    assert received < versions  # the 13 versions (0..12) arrived in fewer messages
    assert received <= 2 + elapsed / 0.3 + 1


def test_a_same_host_watcher_reads_weights_from_shared_memory(server, client):
    core, groups = server.servicer.core, ("actor", "critic", "log_alpha", "obs_norm")
    with client.watch("learner-0", groups, shared_memory=True) as watcher:
        assert watcher.wait_newer_than(-1, timeout=10).version == 0  # over gRPC, offering the segment
        wait_until(
            lambda: watcher.shared_memory, 10.0, "shared memory", interval_sec=0.01
        )  # mapped, watching with the key
        for v in range(5):
            client.push_gradients(push(core, v, seed=v))
            snapshot = watcher.wait_newer_than(v, timeout=10)
            assert snapshot is not None
            weights = core.weights(groups)
            if snapshot.version == v + 1:
                for g in groups:
                    np.testing.assert_array_equal(snapshot.tensors[g], weights[g])
        assert watcher.wait_newer_than(4, timeout=10).version == 5
        assert watcher.shared_reads >= 5
        assert server.servicer._waiters == 0  # nothing waits to be woken on each version: none is
    assert server.servicer.counts["weights_sent"] == 1  # only the offer carried tensors
    segment = server.servicer._cache.segments[groups]
    server.servicer.close()
    assert not os.path.exists(segment.path)


def test_a_shared_memory_watcher_falls_back_to_grpc_when_the_segment_is_unreadable(server, client):
    core, groups = server.servicer.core, ("actor", "obs_norm")
    with client.watch("learner-0", groups, shared_memory=True) as watcher:
        watcher.wait_newer_than(-1, timeout=10)
        wait_until(lambda: watcher.shared_memory, 10.0, "shared memory", interval_sec=0.01)
        segment = server.servicer._cache.segments[groups]
        segment._header[1] += 1  # a write that never ends, as a wedged or foreign writer would leave it
        client.push_gradients(push(core, 0))
        client.push_gradients(push(core, 1, seed=1))
        snapshot = watcher.wait_newer_than(1, timeout=10)
        assert snapshot is not None and snapshot.version == 2
        np.testing.assert_array_equal(snapshot.tensors["actor"], core.weights()["actor"])
        assert watcher.shared_reads == 0 and not watcher.shared_memory
    assert server.servicer.counts["weights_sent"] >= 2  # the offer, then weights over gRPC again


def test_a_shared_memory_watcher_follows_a_restarted_aggregator_to_its_new_segment(tmp_path):
    with AggregatorServer(make_core(), CONFIG, run_dir=tmp_path) as first:
        port = first.port
        client = AggregatorClient(first.address, timeout_sec=5.0)
        watcher = client.watch("learner-0", ("actor",), shared_memory=True)
        watcher.wait_newer_than(-1, timeout=10)
        client.push_gradients(push(first.servicer.core, 0))
        assert watcher.wait_newer_than(0, timeout=10).version == 1
        old_key = first.servicer._cache.segments[("actor",)].key
    try:
        with AggregatorServer(make_core(), CONFIG, run_dir=tmp_path, port=port) as second:
            core = second.servicer.core
            assert core.version == 1
            client.push_gradients(push(core, 1, seed=1))
            snapshot = watcher.wait_newer_than(1, timeout=30)
            assert snapshot is not None and snapshot.version == 2
            np.testing.assert_array_equal(snapshot.tensors["actor"], core.weights()["actor"])
            wait_until(lambda: watcher.shared_memory, 10.0, "shared memory", interval_sec=0.01)
            client.push_gradients(push(core, 2, seed=2))
            assert watcher.wait_newer_than(2, timeout=10).version == 3
            assert second.servicer.counts["weights_shared"] >= 1
            assert second.servicer._cache.segments[("actor",)].key != old_key
    finally:
        watcher.close()
        client.close()


def _tensor(msg: pb.Gradients, name: str) -> pb.Tensor:
    return next(t for t in msg.tensors if t.name == name)


def _set_first(msg: pb.Gradients, name: str, value: float) -> None:
    tensor = _tensor(msg, name)
    data = np.frombuffer(tensor.data, np.float32).copy()
    data[0] = value
    tensor.data = data.tobytes()


def _float64(msg: pb.Gradients) -> None:
    tensor = _tensor(msg, "actor")
    tensor.dtype = "float64"
    tensor.data = np.frombuffer(tensor.data, np.float32).astype(np.float64).tobytes()


def _short_shape(msg: pb.Gradients) -> None:
    tensor = _tensor(msg, "critic")
    tensor.shape[:] = [tensor.shape[0] - 1]
    tensor.data = tensor.data[:-4]


def _drop(msg: pb.Gradients, name: str) -> None:
    del msg.tensors[[t.name for t in msg.tensors].index(name)]


def _norm(msg: pb.Gradients) -> np.ndarray:
    return np.frombuffer(_tensor(msg, "norm_stats").data, np.float32).copy()


def _set_norm(msg: pb.Gradients, values: np.ndarray) -> None:
    tensor = _tensor(msg, "norm_stats")
    tensor.data = values.astype(np.float32).tobytes()
    tensor.shape[:] = [len(values)]


def _huge_norm_sums(msg: pb.Gradients) -> None:
    values = _norm(msg)
    values[1:] = 3e38
    _set_norm(msg, values)


def _inconsistent_norm(msg: pb.Gradients) -> None:
    values = _norm(msg)
    values[1 + SPEC.input_dim :] = 0.0
    values[1 : 1 + SPEC.input_dim] = 5.0
    _set_norm(msg, values)


def _short_norm(msg: pb.Gradients) -> None:
    _set_norm(msg, _norm(msg)[:-1])


def _duplicate_actor(msg: pb.Gradients) -> None:
    msg.tensors.append(_tensor(msg, "actor"))


def _extra_group(msg: pb.Gradients) -> None:
    extra = pb.Tensor()
    extra.CopyFrom(_tensor(msg, "critic"))
    extra.name = "critic_target"
    msg.tensors.append(extra)


def _many_groups(msg: pb.Gradients) -> None:
    for i in range(3000):
        msg.tensors.append(pb.Tensor(name=f"junk{i}", dtype="float32", shape=[1], data=b"\0" * 4))


def _huge_name(msg: pb.Gradients) -> None:
    msg.tensors.append(pb.Tensor(name="g" * 2**20, dtype="float32", shape=[1], data=b"\0" * 4))


def _shape_overflow(msg: pb.Gradients) -> None:
    _tensor(msg, "actor").shape[:] = [2**32, 2**32]


def _negative_dim(msg: pb.Gradients) -> None:
    _tensor(msg, "critic").shape[:] = [-1]


def _five_dims(msg: pb.Gradients) -> None:
    _tensor(msg, "log_alpha").shape[:] = [1, 1, 1, 1, 1]


def _two_d_actor(msg: pb.Gradients) -> None:
    tensor = _tensor(msg, "actor")
    tensor.shape[:] = [1, tensor.shape[0]]


def _scalar_log_alpha(msg: pb.Gradients) -> None:
    _tensor(msg, "log_alpha").shape[:] = []


def _garbage_bytes(msg: pb.Gradients) -> None:
    _tensor(msg, "actor").data = b"\x01\x02\x03\x04\x05"


def _float64_stats(msg: pb.Gradients) -> None:
    tensor = _tensor(msg, "norm_stats")
    tensor.dtype = "float64"
    tensor.data = np.frombuffer(tensor.data, np.float32).astype(np.float64).tobytes()


def _bfloat16_stats(msg: pb.Gradients) -> None:
    tensor = _tensor(msg, "norm_stats")
    tensor.CopyFrom(to_tensor("norm_stats", np.frombuffer(tensor.data, np.float32), "bfloat16"))


def _bfloat16_short(msg: pb.Gradients) -> None:
    tensor = _tensor(msg, "critic")
    tensor.CopyFrom(to_tensor("critic", np.frombuffer(tensor.data, np.float32), "bfloat16"))
    tensor.data = tensor.data[:-2]


def _float16_actor(msg: pb.Gradients) -> None:
    tensor = _tensor(msg, "actor")
    tensor.dtype, tensor.data = "float16", np.frombuffer(tensor.data, np.float32).astype(np.float16).tobytes()


# One row per bad push: (case, mutate(Gradients) in place, expected in details, rejected field).
BAD_PUSHES: list[tuple[str, Callable[[pb.Gradients], None], str, str]] = [
    ("bad dtype", _float64, "tensors[actor].dtype: 'float64'", "tensors[actor].dtype"),
    (
        "byte count mismatch",
        lambda m: setattr(_tensor(m, "log_alpha"), "data", b"\0" * 3),
        "tensors[log_alpha].data: 3 bytes, shape [1] needs 4",
        "tensors[log_alpha].data",
    ),
    ("missing norm_stats", lambda m: _drop(m, "norm_stats"), "tensors: missing norm_stats", "tensors"),
    ("missing group", lambda m: _drop(m, "critic"), "tensors: missing group(s) ['critic']", "tensors"),
    ("wrong shape", _short_shape, "tensors[critic].shape: [", "tensors[critic].shape"),
    ("NaN", lambda m: _set_first(m, "actor", float("nan")), "tensors[actor].data: contains NaN", "tensors[actor].data"),
    (
        "inf stats",
        lambda m: _set_first(m, "norm_stats", float("inf")),
        "tensors[norm_stats].data",
        "tensors[norm_stats].data",
    ),
    ("version ahead", lambda m: setattr(m, "base_version", 7), "base_version: 7 is ahead", "base_version"),
    ("no incarnation", lambda m: setattr(m, "incarnation", 0), "incarnation: 0: every learner", "incarnation"),
    ("seq 0", lambda m: setattr(m, "seq", 0), "seq: 0: a learner's pushes are numbered from 1", "seq"),
    ("batch_size 0", lambda m: setattr(m, "batch_size", 0), "batch_size: 0", "batch_size"),
    (
        "inf critic",
        lambda m: _set_first(m, "critic", float("inf")),
        "tensors[critic].data: contains",
        "tensors[critic].data",
    ),
    (
        "-inf log_alpha",
        lambda m: _set_first(m, "log_alpha", float("-inf")),
        "tensors[log_alpha].data: contains",
        "tensors[log_alpha].data",
    ),
    (
        "norm count 0",
        lambda m: _set_first(m, "norm_stats", 0.0),
        "count 0 must be a whole number",
        "tensors[norm_stats].data",
    ),
    (
        "norm count over the batch",
        lambda m: _set_first(m, "norm_stats", 9.0),
        "count 9 must be a whole number >= 1 and <= batch_size (8)",
        "tensors[norm_stats].data",
    ),
    ("3e38 norm sums", _huge_norm_sums, "implies inputs beyond max_input_abs", "tensors[norm_stats].data"),
    ("squares below sums", _inconsistent_norm, "sums of squares are inconsistent", "tensors[norm_stats].data"),
    (
        "norm_stats wrong length",
        _short_norm,
        "tensors[norm_stats].shape: [10], expected [11]",
        "tensors[norm_stats].shape",
    ),
    ("duplicate tensor", _duplicate_actor, "tensors[4].name: duplicate tensor 'actor'", "tensors[4].name"),
    ("unknown group", _extra_group, "tensors: unknown group(s) ['critic_target']", "tensors"),
    ("thousands of unknown tensors", _many_groups, "tensors: unknown group(s)", "tensors"),
    ("1 MB tensor name", _huge_name, "unknown group(s) ['ggggggggggggggg... (1048576 chars)']", "tensors"),
    ("shape 2**32 x 2**32", _shape_overflow, "needs 73786976294838206464", "tensors[actor].data"),
    ("negative dimension", _negative_dim, "at most 4 dimensions, none negative", "tensors[critic].shape"),
    ("5-D tensor", _five_dims, "at most 4 dimensions", "tensors[log_alpha].shape"),
    ("2-D actor", _two_d_actor, "tensors[actor].shape: [1, ", "tensors[actor].shape"),
    ("scalar log_alpha", _scalar_log_alpha, "tensors[log_alpha].shape: [], expected [1]", "tensors[log_alpha].shape"),
    ("empty message", lambda m: m.Clear(), "incarnation: 0", "incarnation"),
    ("garbage float bytes", _garbage_bytes, "tensors[actor].data: 5 bytes", "tensors[actor].data"),
    ("bad dtype on stats", _float64_stats, "tensors[norm_stats].dtype: 'float64'", "tensors[norm_stats].dtype"),
    (
        "bfloat16 stats",
        _bfloat16_stats,
        "tensors[norm_stats].dtype: 'bfloat16' is not 'float32'",
        "tensors[norm_stats].dtype",
    ),
    ("bfloat16 one value short", _bfloat16_short, "tensors[critic].data: ", "tensors[critic].data"),
    ("float16 gradient", _float16_actor, "tensors[actor].dtype: 'float16' is not one of", "tensors[actor].dtype"),
]


def test_bfloat16_gradients_step_as_their_rounded_float32_values(server, client):
    """Half the bytes on the wire; the aggregator applies exactly the bf16-rounded gradient."""
    core = server.servicer.core
    reference = make_core()
    sent = dataclasses.replace(push(core, 0), wire_dtype="bfloat16")
    msg = sent.to_proto(incarnation=3, seq=1)
    plain = push(core, 0).to_proto(incarnation=3, seq=1)
    assert msg.ByteSize() < 0.6 * plain.ByteSize()
    assert client.push_gradients(sent).applied
    rounded = {g: from_tensor(to_tensor(g, v, "bfloat16"), allowed=WIRE_DTYPES) for g, v in sent.grads.items()}
    for g, v in sent.grads.items():  # 8 significant bits: within 2**-8 of each value
        np.testing.assert_allclose(rounded[g], v, rtol=2.0**-8, atol=0)
    reference.submit(0, rounded, sent.norm_stats, "learner-0", sent.batch_size)
    for group in GROUPS:
        np.testing.assert_array_equal(core.weights()[group], reference.weights()[group])


@pytest.mark.parametrize("case,mutate,details,field", BAD_PUSHES, ids=[r[0] for r in BAD_PUSHES])
def test_bad_push_is_invalid_argument_and_the_server_keeps_serving(case, mutate, details, field, server, client, stub):
    core = server.servicer.core
    client.push_gradients(push(core, 0))
    before = core.weights()
    bad = push(core, 1, seed=1).to_proto(incarnation=7, seq=1)
    mutate(bad)
    with pytest.raises(grpc.RpcError) as err:
        stub.PushGradients(bad, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details in err.value.details()
    assert core.version == 1
    for group in GROUPS:
        np.testing.assert_array_equal(core.weights()[group], before[group])
    stats = client.stats()
    assert (stats.version, stats.gradients_applied, stats.gradients_rejected) == (1, 1, 1)
    assert server.servicer.rejected_by_field == {field: 1}
    assert client.push_gradients(push(core, 1, seed=2)).version == 2


def _grads_only(msg: pb.Gradients) -> dict[str, np.ndarray]:
    return {t.name: from_tensor(t) for t in msg.tensors if t.name != "norm_stats"}


def _shared_push(segment: SharedWeightsWriter, msg: pb.Gradients, written_seq: int | None = None) -> None:
    """msg's gradients into `segment` (as push `written_seq`, default msg.seq), msg naming it."""
    segment.write(msg.seq if written_seq is None else written_seq, _grads_only(msg))
    del msg.tensors[:-1]  # norm_stats stays inline
    msg.shared.CopyFrom(pb.SharedSegment(path=segment.path, key=segment.key))


def _another(path: str) -> str:
    """A segment name that differs from `path` in its last hex digit: no such file."""
    return path[:-1] + ("1" if path.endswith("0") else "0")


SHARED_BAD_PUSHES = [  # (case, mutate(msg, segment), details, field)
    ("path outside /dev/shm", lambda m, s: (_shared_push(s, m), setattr(m.shared, "path", "/etc/passwd")),
     "is not a /dev/shm/fleetrl-", "shared"),
    ("no such segment", lambda m, s: (_shared_push(s, m), setattr(m.shared, "path", _another(s.path))),
     "no such segment on the aggregator's host", "shared.path"),
    ("wrong key", lambda m, s: (_shared_push(s, m), setattr(m.shared, "key", s.key ^ 1)), "key or size differ",
     "shared"),
    ("segment holds another push", lambda m, s: _shared_push(s, m, written_seq=5), "holds push 5, not seq 1",
     "shared"),
    ("inline and shared", lambda m, s: m.shared.CopyFrom(pb.SharedSegment(path=s.path, key=s.key)),
     "as well as shared", "tensors"),
]  # fmt: skip


@pytest.mark.parametrize("case,mutate,details,field", SHARED_BAD_PUSHES, ids=[r[0] for r in SHARED_BAD_PUSHES])
def test_a_bad_shared_memory_push_is_invalid_argument_and_the_server_keeps_serving(
    case, mutate, details, field, server, client, stub
):
    core = server.servicer.core
    client.push_gradients(push(core, 0))
    segment = SharedWeightsWriter({g: core.sizes[g] for g in GRADIENT_GROUPS}, kind="grads")
    try:
        bad = push(core, 1, seed=1).to_proto(incarnation=7, seq=1)
        mutate(bad, segment)
        with pytest.raises(grpc.RpcError) as err:
            stub.PushGradients(bad, timeout=5)
    finally:
        segment.close()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details in err.value.details()
    assert core.version == 1
    assert server.servicer.rejected_by_field == {field: 1}
    assert client.push_gradients(push(core, 1, seed=2)).version == 2


def test_gradients_through_shared_memory_step_exactly_as_gradients_in_the_message(server, client):
    core, reference = server.servicer.core, make_core()
    assert client.share_gradients({g: core.sizes[g] for g in GRADIENT_GROUPS})
    for v in range(3):
        sent = push(core, v, seed=v)
        ack = client.push_gradients_async(sent).result() if v else client.push_gradients(sent)
        assert (ack.applied, ack.version) == (True, v + 1)
        reference.submit(v, sent.grads, sent.norm_stats, "learner-0", sent.batch_size)
    for group in GROUPS:
        np.testing.assert_array_equal(core.weights()[group], reference.weights()[group])
    assert server.servicer.counts["gradients_shared"] == 3
    assert client.shares_gradients


def test_a_learner_whose_segment_the_aggregator_cannot_read_sends_the_bytes_instead(server, client):
    core = server.servicer.core
    assert client.share_gradients({g: core.sizes[g] for g in GRADIENT_GROUPS})
    os.unlink(client._gradients.path)  # as if the aggregator were on another host
    ack = client.push_gradients_async(push(core, 0)).result()
    assert (ack.applied, ack.version) == (True, 1)
    assert not client.shares_gradients
    assert client.push_gradients(push(core, 1, seed=1)).version == 2
    assert server.servicer.counts["gradients_shared"] == 0
    assert server.servicer.rejected_by_field == {"shared.path": 1}  # counted, then sent again with its bytes


def test_async_pushes_share_one_stream_and_are_acked_in_order(server, client):
    core, reference = server.servicer.core, make_core()
    sent = [push(core, v, seed=v) for v in range(4)]
    pending = [client.push_gradients_async(p) for p in sent[:3]]  # three in flight on one call
    stream = client._stream
    assert [(p.result().applied, p.result().version) for p in pending] == [(True, 1), (True, 2), (True, 3)]
    assert client.push_gradients_async(sent[3]).result().version == 4
    assert client._stream is stream and not stream.broken
    for v, p in enumerate(sent):
        reference.submit(v, p.grads, p.norm_stats, "learner-0", p.batch_size)
    for group in GROUPS:
        np.testing.assert_array_equal(core.weights()[group], reference.weights()[group])


def test_a_refused_push_on_the_stream_is_invalid_argument_and_the_next_push_opens_a_new_stream(server, client):
    core = server.servicer.core
    assert client.push_gradients_async(push(core, 0)).result().applied
    bad = push(core, 1, seed=1)
    bad.grads["actor"] = bad.grads["actor"][:-1]
    with pytest.raises(grpc.RpcError) as err:
        client.push_gradients_async(bad).result()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "tensors[actor].shape: [83], expected [84]"
    assert server.servicer.rejected_by_field == {"tensors[actor].shape": 1}
    assert client._stream.broken
    assert client.push_gradients_async(push(core, 1, seed=2)).result().version == 2  # a new stream
    assert server.servicer.counts["applied"] == 2


def test_a_push_whose_ack_never_comes_on_the_stream_is_sent_again_and_applied_once(tmp_path, monkeypatch):
    """An aggregator whose stream takes pushes but never acks (wedged): after the client's
    timeout the stream is cancelled and the push goes again by PushGradients, applied once."""
    swallowed = []

    async def never_ack(self, requests, context):
        async for request in requests:
            swallowed.append(request.seq)
        yield pb.GradientAck()  # pragma: no cover - the client cancels first

    monkeypatch.setattr(AggregatorServicer, "PushGradientsStream", never_ack)  # bound as the server starts
    with AggregatorServer(make_core(), CONFIG, run_dir=tmp_path) as srv:
        with AggregatorClient(srv.address, timeout_sec=2.0) as agg:
            waits = []
            ack = agg.push_gradients_async(push(srv.servicer.core, 0)).result(on_wait=lambda: waits.append(1))
        assert (ack.applied, ack.version, ack.duplicate) == (True, 1, False)
        assert swallowed == [1] and len(waits) >= 2
        assert srv.servicer.counts["applied"] == 1


def test_watch_with_an_unknown_group_is_invalid_argument(stub):
    with pytest.raises(grpc.RpcError) as err:
        next(iter(stub.WatchWeights(pb.WatchRequest(subscriber="x", groups=["actor", "bogus"]), timeout=5)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "groups: unknown ['bogus']" in err.value.details()


def test_watch_with_a_negative_interval_is_invalid_argument(stub):
    with pytest.raises(grpc.RpcError) as err:
        next(iter(stub.WatchWeights(pb.WatchRequest(subscriber="x", min_interval_sec=-1), timeout=5)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "min_interval_sec" in err.value.details()


@pytest.mark.parametrize(
    "report,details",
    [
        (pb.EvalReport(version=0, success_rate=1.5), "success_rate: 1.5 not in [0, 1]"),
        (pb.EvalReport(version=0, success_rate=-0.1), "success_rate: -0.1 not in [0, 1]"),
        (pb.EvalReport(version=0, success_rate=float("nan")), "success_rate: nan"),
        (pb.EvalReport(version=5, success_rate=0.5), "version: 5 > 0"),
        (
            pb.EvalReport(version=0, success_rate=0.5, kind="quick"),
            "kind: 'quick' not one of ('curve', 'full', 'swa_curve')",
        ),
        (pb.EvalReport(version=0, success_rate=0.5), "kind: '' not one of"),
        (
            pb.EvalReport(version=0, success_rate=0.5, kind="curve", task_success={"FetchPush-v4": 2.0}),
            "task_success['FetchPush-v4']: 2.0 not in [0, 1]",
        ),
    ],
    ids=["above 1", "below 0", "NaN", "future version", "unknown kind", "no kind", "task success"],
)
def test_bad_eval_report_is_invalid_argument(report, details, server, client, tmp_path):
    with pytest.raises(grpc.RpcError) as err:
        client.report_eval(report)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details in err.value.details()
    assert client.stats().last_eval.episodes == 0
    assert server.servicer.counts["eval_rejected"] == 1
    assert client.stats().gradients_rejected == 0  # a bad report is not a bad gradient
    assert not (tmp_path / "evals.jsonl").exists()


def test_eval_reports_show_in_stats_and_append_to_evals_jsonl(server, client, tmp_path):
    core = server.servicer.core
    for v in range(2):
        client.push_gradients(push(core, v, seed=v))
    client.report_eval(
        pb.EvalReport(
            version=2,
            episodes=20,
            success_rate=0.75,
            mean_return=-12.5,
            env_steps=4000,
            evaluator="evaluator-0",
            kind="curve",
        )
    )
    client.report_eval(pb.EvalReport(version=1, episodes=20, success_rate=0.5, env_steps=3000, kind="curve"))
    client.report_eval(pb.EvalReport(version=1, episodes=50, success_rate=0.9, env_steps=3000, kind="full"))
    stats = client.stats()
    assert (stats.last_curve.version, stats.last_curve.success_rate, stats.last_curve.episodes) == (2, 0.75, 20)
    assert stats.last_curve.evaluator == "evaluator-0"
    assert (stats.last_full.version, stats.last_full.success_rate, stats.last_full.episodes) == (1, 0.9, 50)
    assert stats.last_eval.version == 2  # the newest of any kind; an older curve report is logged only
    assert stats.env_steps == 4000
    rows = [json.loads(line) for line in (tmp_path / "evals.jsonl").read_text().splitlines()]
    got = [(r["version"], r["success_rate"], r["env_steps"], r["kind"]) for r in rows]
    assert got == [(2, 0.75, 4000, "curve"), (1, 0.5, 3000, "curve"), (1, 0.9, 3000, "full")]
    assert rows[0]["mean_return"] == -12.5 and rows[0]["evaluator"] == "evaluator-0"


def test_a_restarted_aggregator_answers_stats_with_the_run_s_newest_scores(tmp_path):
    """A restarted or resumed aggregator's Stats carry the newest curve and full score of the
    run's evals.jsonl, so task shares and progress go on from them; a weight average's score and
    a torn line are left out."""
    rows = [
        {"version": 4, "episodes": 10, "success_rate": 0.4, "kind": "curve"},
        {"version": 6, "episodes": 10, "success_rate": 0.6, "kind": "curve", "task_success": {"FetchPush-v4": 0.6}},
        {"version": 5, "episodes": 50, "success_rate": 0.5, "env_steps": 900, "kind": "full"},
        {"version": 7, "episodes": 10, "success_rate": 0.9, "kind": "swa_curve"},
    ]
    torn = '{"version": 9, "episodes": 10, "succ'
    (tmp_path / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + torn)
    with AggregatorServer(make_core(), CONFIG, run_dir=tmp_path) as srv:
        with AggregatorClient(srv.address, timeout_sec=5.0) as agg:
            stats = agg.stats()
    assert (stats.last_curve.version, stats.last_curve.success_rate) == (6, 0.6)
    assert dict(stats.last_curve.task_success) == {"FetchPush-v4": 0.6}
    assert (stats.last_full.version, stats.last_full.episodes, stats.last_full.env_steps) == (5, 50, 900)
    assert stats.last_eval.version == 6


def test_versions_and_weights_survive_a_restart_on_the_same_run_dir(tmp_path):
    with AggregatorServer(make_core(), CONFIG, run_dir=tmp_path) as first:
        core = first.servicer.core
        with AggregatorClient(first.address, timeout_sec=5.0) as agg:
            for v in range(3):
                agg.push_gradients(push(core, v, seed=v))
        weights = core.weights()
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["ckpt_0000000003.pt"]
    with AggregatorServer(make_core(), CONFIG, run_dir=tmp_path) as second:
        restored = second.servicer.core
        assert restored.version == 3
        for group in GROUPS:
            np.testing.assert_array_equal(restored.weights()[group], weights[group])
        with AggregatorClient(second.address, timeout_sec=5.0) as agg, agg.watch("learner-0") as watcher:
            assert watcher.wait_newer_than(-1, timeout=10).version == 3
            assert agg.push_gradients(push(restored, 3)).version == 4
            assert agg.stats().version == 4


def test_a_push_the_restored_checkpoint_holds_is_not_applied_again_after_a_restart(tmp_path):
    """The dedup record travels with the weights: an aggregator killed before its ack got out
    answers the learner's retry as a duplicate once it is back, from the checkpoint."""
    with AggregatorServer(make_core(), CONFIG, run_dir=tmp_path) as first:
        core = first.servicer.core
        channel = grpc.insecure_channel(first.address, options=GRPC_OPTIONS)
        stub = pb_grpc.AggregatorStub(channel)
        messages = [push(core, v, seed=v).to_proto(incarnation=7, seq=v + 1) for v in range(3)]
        assert [stub.PushGradients(m, timeout=5).version for m in messages] == [1, 2, 3]
        channel.close()
    saved = load_checkpoint(tmp_path / "checkpoints")
    assert saved["pushes"]["0:7"]["applied"] == 3 and saved["pushes"]["0:7"]["seq"] == 3
    with AggregatorServer(make_core(), CONFIG, run_dir=tmp_path) as second:
        channel = grpc.insecure_channel(second.address, options=GRPC_OPTIONS)
        stub = pb_grpc.AggregatorStub(channel)
        retry = stub.PushGradients(messages[2], timeout=5)  # its first ack was lost with the old process
        assert (retry.duplicate, retry.applied, retry.version) == (True, True, 3)
        assert second.servicer.core.version == 3
        following = push(second.servicer.core, 3).to_proto(incarnation=7, seq=4)
        assert stub.PushGradients(following, timeout=5).version == 4
        channel.close()
    assert load_checkpoint(tmp_path / "checkpoints")["pushes"]["0:7"]["applied"] == 4


def test_checkpoints_are_written_every_n_versions_and_pruned(tmp_path):
    config = AggregatorConfig(lr=1e-2, checkpoint_every_versions=2, keep_checkpoints=2)
    core = AggregatorCore(SPEC, config, grads_per_step=1, max_staleness=1)
    with AggregatorServer(core, config, run_dir=tmp_path) as srv, AggregatorClient(srv.address) as agg:
        for v in range(7):
            agg.push_gradients(push(core, v, seed=v))
        srv.servicer.flush_checkpoints()  # written by a thread: acks never wait on the disk
        names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
        assert names == ["ckpt_0000000004.pt", "ckpt_0000000006.pt"]
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["ckpt_0000000006.pt", "ckpt_0000000007.pt"]  # close() checkpoints the last version


def test_a_retried_push_is_applied_once_and_answered_as_a_duplicate(server, client, stub):
    core = server.servicer.core
    message = push(core, 0).to_proto(incarnation=99, seq=1)
    first = stub.PushGradients(message, timeout=5)
    again = stub.PushGradients(message, timeout=5)  # the client timed out and sent it again
    assert (first.applied, first.version, first.duplicate) == (True, 1, False)
    assert (again.applied, again.version, again.duplicate) == (True, 1, True)
    assert core.version == 1
    stats = client.stats()
    assert (stats.gradients_applied, stats.gradients_duplicate) == (1, 1)
    restarted = push(core, 1).to_proto(incarnation=100, seq=1)  # a restarted learner: new incarnation
    assert stub.PushGradients(restarted, timeout=5).version == 2


def test_rejections_are_counted_per_learner(server, client, stub):
    core = server.servicer.core
    for learner_id in (3, 3, 5):
        bad = push(core, 0).to_proto(incarnation=7, seq=learner_id)
        bad.learner_id = learner_id
        bad.tensors[0].data = b"\0" * 3
        with pytest.raises(grpc.RpcError):
            stub.PushGradients(bad, timeout=5)
    assert dict(client.stats().rejected_by_learner) == {"learner-3": 2, "learner-5": 1}


def _crash(server: AggregatorServer) -> None:
    """Stop serving without the exit checkpoint, as after SIGKILL."""
    server.abandon()


def test_after_a_crash_no_version_number_is_reused(tmp_path):
    config = AggregatorConfig(lr=1e-2, checkpoint_every_versions=4, keep_checkpoints=2)
    first = AggregatorServer(AggregatorCore(SPEC, config, 1, 1), config, run_dir=tmp_path).start()
    core = first.servicer.core
    with AggregatorClient(first.address, timeout_sec=5.0) as agg:
        for v in range(6):  # versions 1..6 published; checkpoint at 4
            agg.push_gradients(push(core, v, seed=v))
    published = core.version
    _crash(first)
    with AggregatorServer(AggregatorCore(SPEC, config, 1, 1), config, run_dir=tmp_path) as second:
        assert second.servicer.core.version > published  # the weights of 4 under a version never used
        with AggregatorClient(second.address, timeout_sec=5.0) as agg, agg.watch("learner-0") as watcher:
            assert watcher.wait_newer_than(-1, timeout=10).version == second.servicer.core.version


def test_after_a_crash_before_the_first_checkpoint_no_version_number_is_reused(tmp_path):
    """Found by the chaos soak (benchmarks/chaos_soak.py): an aggregator SIGKILLed before its
    first checkpoint came back at version 0, naming its fresh weights 1, 2, ... again, and its
    learner's retried push ("base_version 190 is ahead of the aggregator (0)") killed the learner."""
    config = AggregatorConfig(lr=1e-2, checkpoint_every_versions=500)
    first = AggregatorServer(AggregatorCore(SPEC, config, 1, 1), config, run_dir=tmp_path).start()
    core = first.servicer.core
    with AggregatorClient(first.address, timeout_sec=5.0) as agg:
        for v in range(3):  # versions 1..3 published; no checkpoint yet
            agg.push_gradients(push(core, v, seed=v))
    _crash(first)
    assert not list((tmp_path / "checkpoints").glob("*.pt"))
    with AggregatorServer(AggregatorCore(SPEC, config, 1, 1), config, run_dir=tmp_path) as second:
        resumed = second.servicer.core.version
        assert resumed > 3  # the initial weights again, under a version never used
        with AggregatorClient(second.address, timeout_sec=5.0) as agg:
            assert agg.push_gradients(push(second.servicer.core, resumed)).version == resumed + 1


def test_a_corrupt_newest_checkpoint_is_skipped_for_the_one_before(tmp_path):
    config = AggregatorConfig(lr=1e-2, checkpoint_every_versions=2, keep_checkpoints=3)
    with AggregatorServer(AggregatorCore(SPEC, config, 1, 1), config, run_dir=tmp_path) as srv:
        core = srv.servicer.core
        with AggregatorClient(srv.address, timeout_sec=5.0) as agg:
            for v in range(3):
                agg.push_gradients(push(core, v, seed=v))
        srv.servicer.flush_checkpoints()
        at_two = load_checkpoint(tmp_path / "checkpoints" / "ckpt_0000000002.pt")["weights"]
    newest = tmp_path / "checkpoints" / "ckpt_0000000003.pt"
    newest.write_bytes(newest.read_bytes()[:-100])  # torn by a crash mid-write (no fsync'd rename)
    with AggregatorServer(AggregatorCore(SPEC, config, 1, 1), config, run_dir=tmp_path) as again:
        restored = again.servicer.core
        for group in GROUPS:
            np.testing.assert_array_equal(restored.weights()[group], at_two[group])


def test_many_weight_streams_do_not_starve_gradient_pushes(server, client):
    """Streams hold no thread: with more of them than the old pool's 32 threads, pushes and
    stats are still answered and every stream gets the new version."""
    core = server.servicer.core
    watchers = [client.watch(f"sampler-{i}", ("actor", "obs_norm")) for i in range(48)]
    try:
        deadline = time.monotonic() + 60  # a bound against hanging, not a timing check
        while client.stats().subscribers < 48:
            assert time.monotonic() < deadline, f"{client.stats().subscribers} of 48 streams open"
            time.sleep(0.1)
        assert client.push_gradients(push(core, 0)).version == 1
        assert all(w.wait_newer_than(0, timeout=30) is not None for w in watchers)
    finally:
        for w in watchers:
            w.close()


def test_a_step_waiting_for_a_departed_learner_closes_at_its_deadline(tmp_path):
    """K-of-M with M = 2: one learner pushes, the other is gone. The aggregator closes the step
    at its deadline by itself (no further push comes to trigger it) and broadcasts it."""
    config = dataclasses.replace(CONFIG, step_deadline_ms=100.0)
    core = AggregatorCore(SPEC, config, grads_per_step=2, max_staleness=1)
    with (
        AggregatorServer(core, config, run_dir=tmp_path) as srv,
        AggregatorClient(srv.address, timeout_sec=5.0) as agg,
        agg.watch("sampler-0") as watcher,
    ):
        ack = agg.push_gradients(push(core, 0))
        assert (ack.applied, ack.version) == (True, 0)  # folded into the pending step
        snapshot = watcher.wait_newer_than(0, timeout=30)
        assert snapshot is not None and snapshot.version == 1
        assert core.deadline_steps == 1
        ack = agg.push_gradients(push(core, 1, seed=1))  # the next step opens as usual
        assert watcher.wait_newer_than(1, timeout=30).version == 2


def test_a_moe_runs_router_metrics_are_kept_for_the_summary(tmp_path):
    from aggregator.outputs import write_expert_load

    write_expert_load(str(tmp_path), 7, {"loss/critic": 1.0})  # a dense run: nothing to keep
    assert not (tmp_path / "expert_load.json").exists()
    write_expert_load(str(tmp_path), 9, {"loss/critic": 1.0, "moe/actor_beta": 0.5, "moe/actor/l0/share_e1": 0.25})
    kept = json.loads((tmp_path / "expert_load.json").read_text())
    assert kept == {"version": 9, "actor_beta": 0.5, "actor/l0/share_e1": 0.25}


def test_scored_versions_feed_the_weight_average_which_watchers_can_take(tmp_path):
    """aggregator.swa on: a live curve report carries the actor it scored; the aggregator admits
    it (layered: only if it scored at least as well as the average), serves the average as the
    actor_swa group, records the average's own score, and checkpoints both."""
    config = dataclasses.replace(CONFIG, swa="layered")
    core = AggregatorCore(SPEC, config, grads_per_step=1, max_staleness=1)
    with AggregatorServer(core, config, run_dir=tmp_path) as server, AggregatorClient(server.address) as client:
        actors = []
        for v in range(3):
            client.push_gradients(push(core, v, seed=v))
            actors.append(core.weights(("actor",))["actor"])
            rate = (0.5, 0.2, 0.6)[v]
            report = pb.EvalReport(version=v + 1, episodes=10, success_rate=rate, kind="curve")
            report.actor.CopyFrom(to_tensor("actor", actors[-1]))
            client.report_eval(report)
            if v == 0:  # the evaluator scores the average (version 1 alone) at 0.5
                client.report_eval(pb.EvalReport(version=1, episodes=10, success_rate=0.5, kind="swa_curve"))
        assert core.swa.versions == [1, 3]  # version 2 scored 0.2 < 0.5: left out
        expected = (actors[0] + actors[2]) / 2
        with client.watch("evaluator-0", ("actor_swa", "obs_norm")) as watcher:
            snapshot = watcher.wait_newer_than(-1, timeout=5.0)
        np.testing.assert_allclose(snapshot.tensors["actor_swa"], expected, rtol=1e-6)
        assert client.stats().last_curve.success_rate == 0.6  # the average's score is not the live curve
        bad = pb.EvalReport(version=3, episodes=10, success_rate=0.6, kind="curve")
        bad.actor.CopyFrom(to_tensor("actor", np.zeros(5, np.float32)))
        with pytest.raises(grpc.RpcError) as err:
            client.report_eval(bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "actor: shape (5,)" in err.value.details()
    state = core.state()
    assert state["swa"]["versions"] == [1, 3] and state["swa"]["live_score"] == 0.6
    assert state["swa_plain"]["versions"] == [1, 2, 3]  # the plain average of the same offers, for comparison
    np.testing.assert_allclose(state["swa"]["actor"], expected, rtol=1e-6)
    rows = [json.loads(line) for line in (tmp_path / "evals.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows].count("swa_curve") == 1 and rows[1]["swa_versions"] == [1]


def test_closing_finishes_the_deadline_task_instead_of_leaving_it_pending(tmp_path):
    """A task left pending in the stopped loop is logged at exit as "Task was destroyed but it
    is pending"; close() must see it finished."""
    core = AggregatorCore(SPEC, CONFIG, grads_per_step=2, max_staleness=1)  # K-of-M: a deadline task
    with AggregatorServer(core, CONFIG, run_dir=tmp_path) as srv:
        task = srv.servicer.deadline_task
        assert task is not None and not task.done()
    assert task.done() and task.cancelled()


def test_the_server_binds_on_start_as_the_ingest_server_does(tmp_path):
    import threading

    before = {t.name for t in threading.enumerate()}
    server = AggregatorServer(make_core(), CONFIG, run_dir=tmp_path)  # restored, not serving
    assert "aggregator-grpc" not in {t.name for t in threading.enumerate()} - before
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.address
    with server:  # start() by `with`
        with AggregatorClient(server.address, timeout_sec=5.0) as agg:
            assert agg.stats().version == server.servicer.core.version
        with pytest.raises(RuntimeError, match="called twice"):
            server.start()
    assert "aggregator-grpc" not in {t.name for t in threading.enumerate()}


def test_duplicate_gradient_tensor_is_invalid_argument(tmp_path):
    config = AggregatorConfig()
    core = AggregatorCore(SPEC, config, grads_per_step=1, max_staleness=1)
    with AggregatorServer(core, config) as server:
        channel = grpc.insecure_channel(server.address, options=GRPC_OPTIONS)
        msg = push(core, 0).to_proto(incarnation=7, seq=1)
        msg.tensors.append(to_tensor("actor", np.zeros(core.sizes["actor"], np.float32)))
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.AggregatorStub(channel).PushGradients(msg, timeout=5)
        channel.close()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "duplicate" in err.value.details()


def test_after_a_crash_the_restored_version_jumps_past_every_version_that_may_have_been_broadcast(tmp_path):
    server = AggregatorServer(make_core(), CONFIG, run_dir=tmp_path).start()
    with AggregatorClient(server.address, timeout_sec=5.0) as agg:
        for _ in range(3):
            agg.push_gradients(push(server.servicer.core, server.servicer.core.version))
        server.servicer.checkpoint_now()  # a periodic checkpoint at version 3
        for _ in range(4):
            agg.push_gradients(push(server.servicer.core, server.servicer.core.version))
        seen = server.servicer.core.version
    server.abandon()  # a crash: no final checkpoint
    with AggregatorServer(make_core(), CONFIG, run_dir=tmp_path) as restarted:
        assert restarted.servicer.core.version > seen
    with AggregatorServer(make_core(), CONFIG, run_dir=tmp_path) as clean:
        # the previous one closed cleanly: its exact version is restored, no jump
        assert clean.servicer.core.version == restarted.servicer.core.version


def test_a_watcher_reconnects_when_the_aggregator_restarts_gracefully(tmp_path):
    """Watchers outlive an aggregator restart on the same address: they reconnect and resume."""
    first = AggregatorServer(make_core(), CONFIG, run_dir=tmp_path).start()
    port = first.port
    with AggregatorClient(first.address, timeout_sec=10.0) as agg, agg.watch("sampler-0") as watcher:
        assert watcher.wait_newer_than(-1, timeout=10) is not None
        first.close()
        with AggregatorServer(make_core(), CONFIG, run_dir=tmp_path, port=port) as second:
            restored = second.servicer.core.version
            agg.push_gradients(push(second.servicer.core, restored))
            got = watcher.wait_newer_than(restored, timeout=15)
            assert got is not None and got.version == restored + 1
