"""The ingest service over real gRPC on loopback, storing into the real Redis Cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest

from buffer.ingest_client import IngestClient, IngestUnavailable
from buffer.service import IngestServer
from buffer.storage import TemporalStorage
from foundation.config import BufferConfig
from foundation.proto import fleetrl_pb2 as pb
from foundation.proto import fleetrl_pb2_grpc as pb_grpc
from foundation.transport import GRPC_OPTIONS
from foundation.wire import TransitionSchema, batch_to_proto

SCHEMA = TransitionSchema(obs_dim=3, goal_dim=2, act_dim=2)  # make_transitions' default
CONFIG = BufferConfig(window_size_transitions=8, capacity_transitions=1024, max_batch_transitions=64)
RUN, TASK = "run1", 5
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def server(redis_client):
    storage = TemporalStorage(redis_client, RUN, SCHEMA, CONFIG)
    with IngestServer(storage, task_ids=(TASK,), schema=SCHEMA, run_id=RUN, config=CONFIG) as srv:
        yield srv


@pytest.fixture
def stub(server):
    channel = grpc.insecure_channel(server.address, options=GRPC_OPTIONS)
    yield pb_grpc.ReplayIngestStub(channel)
    channel.close()


def stored_bytes(storage: TemporalStorage) -> tuple[int, list[bytes]]:
    head = storage.head()
    keys = [storage.layout.window_key(w) for w in range(storage.layout.windows_below(head))]
    return head, [storage.client.get(k) or b"" for k in keys]


INCARNATION = 4242


def good_batch(make_transitions, n: int = 4, seq: int = 1, first_id: int = 0) -> pb.TransitionBatch:
    return batch_to_proto(
        make_transitions(n, first_id=first_id),
        run_id=RUN,
        sampler_id=1,
        seq=seq,
        policy_version=2,
        task_id=TASK,
        env_steps=n,
        incarnation=INCARNATION,
    )


def _column(batch: pb.TransitionBatch, name: str) -> pb.Tensor:
    return next(c for c in batch.columns if c.name == name)


def _set_values(batch: pb.TransitionBatch, name: str, index: int, value: float) -> None:
    column = _column(batch, name)
    values = np.frombuffer(column.data, np.float32).copy()
    values[index] = value
    column.data = values.tobytes()


def _wrong_dtype(b: pb.TransitionBatch, make) -> None:
    column = _column(b, "obs")
    column.dtype = "float64"
    column.data = np.frombuffer(column.data, np.float32).astype(np.float64).tobytes()


def _wrong_shape(b: pb.TransitionBatch, make) -> None:
    column = _column(b, "reward")
    column.shape[:] = [3]
    column.data = column.data[:12]


def _remove_done(b: pb.TransitionBatch, make) -> None:
    del b.columns[[c.name for c in b.columns].index("done")]


def _unknown_column(b: pb.TransitionBatch, make) -> None:
    b.columns.append(pb.Tensor(name="foo", dtype="float32", shape=[4], data=b"\0" * 16))


def _shape_overflow(b: pb.TransitionBatch, make) -> None:
    _column(b, "obs").shape[:] = [2**32, 2**32]  # wraps to 0 bytes in int64 arithmetic


def _negative_dim(b: pb.TransitionBatch, make) -> None:
    _column(b, "reward").shape[:] = [-4]


def _five_dims(b: pb.TransitionBatch, make) -> None:
    _column(b, "goal").shape[:] = [4, 2, 1, 1, 1]


def _float64_done(b: pb.TransitionBatch, make) -> None:
    column = _column(b, "done")
    column.dtype = "float64"
    column.data = np.frombuffer(column.data, np.float32).astype(np.float64).tobytes()


def _many_unknown_columns(b: pb.TransitionBatch, make) -> None:
    for i in range(5000):
        b.columns.append(pb.Tensor(name=f"junk{i:05d}", dtype="float32", shape=[4], data=b"\0" * 16))


def _huge_column_name(b: pb.TransitionBatch, make) -> None:
    b.columns.append(pb.Tensor(name="x" * 2**20, dtype="float32", shape=[4], data=b"\0" * 16))


# One row per bad input: (case, mutate(batch, make_transitions) in place, expected in details).
BAD_INPUTS: list[tuple[str, Callable[..., None], str]] = [
    ("wrong run_id", lambda b, make: setattr(b, "run_id", "other"), "run_id: 'other'"),
    ("unknown task id", lambda b, make: setattr(b, "task_id", 99), "task_id: 99"),
    ("zero rows", lambda b, make: b.CopyFrom(good_batch(make, n=0)), "num_transitions: 0"),
    (
        "oversize",
        lambda b, make: b.CopyFrom(good_batch(make, n=CONFIG.max_batch_transitions + 1)),
        "num_transitions: 65 is outside [1, max_batch_transitions=64]",
    ),
    ("version past uint32", lambda b, make: setattr(b, "policy_version", 2**32), "policy_version: "),
    ("wrong dtype", _wrong_dtype, "columns[obs].dtype: 'float64'"),
    (
        "byte count mismatch",
        lambda b, make: setattr(_column(b, "goal"), "data", b"\0" * 5),
        "columns[goal].data: 5 bytes",
    ),
    ("wrong shape", _wrong_shape, "columns[reward].shape: [3], expected [4]"),
    ("NaN", lambda b, make: _set_values(b, "reward", 1, float("nan")), "columns[reward].data: contains NaN"),
    ("inf", lambda b, make: _set_values(b, "obs", 2, float("inf")), "columns[obs].data: contains NaN or inf"),
    ("missing column", _remove_done, "columns: missing column 'done'"),
    (
        "duplicate column",
        lambda b, make: b.columns.append(_column(b, "reward")),
        "columns[6].name: duplicate column 'reward'",
    ),
    ("unknown column", _unknown_column, "columns: unknown column(s) ['foo']"),
    ("more episodes than rows", lambda b, make: setattr(b, "episodes", 5), "episodes: 5 episodes cannot end in 4"),
    ("no incarnation", lambda b, make: setattr(b, "incarnation", 0), "incarnation: 0: every sampler process start"),
    ("seq 0", lambda b, make: setattr(b, "seq", 0), "seq: 0: a sampler incarnation numbers its batches from 1"),
    ("3e38 observation", lambda b, make: _set_values(b, "obs", 0, 3e38), "columns[obs].data: magnitude 3e+38 beyond"),
    ("3e38 reward", lambda b, make: _set_values(b, "reward", 3, -3e38), "columns[reward].data: magnitude 3e+38"),
    ("done of 7", lambda b, make: _set_values(b, "done", 1, 7.0), "columns[done].data: must be 0 or 1, got 7"),
    ("action beyond 1", lambda b, make: _set_values(b, "action", 2, 1.5), "columns[action].data: magnitude 1.5"),
    ("-inf action", lambda b, make: _set_values(b, "action", 0, float("-inf")), "columns[action].data: contains NaN"),
    ("NaN goal", lambda b, make: _set_values(b, "goal", 0, float("nan")), "columns[goal].data: contains NaN"),
    ("inf next_obs", lambda b, make: _set_values(b, "next_obs", 5, float("inf")), "columns[next_obs].data"),
    ("shape 2**32 x 2**32", _shape_overflow, "columns[obs].data: 48 bytes, shape [4294967296, 4294967296] needs"),
    ("negative dimension", _negative_dim, "columns[reward].shape: [-4]: at most 4 dimensions, none negative"),
    ("5-D column", _five_dims, "columns[goal].shape: [4, 2, 1, 1, 1]: at most 4 dimensions"),
    ("float64 done", _float64_done, "columns[done].dtype: 'float64' is not one of"),
    ("env_steps beyond rows", lambda b, make: setattr(b, "env_steps", 10**12), "env_steps: 1000000000000 env steps"),
    ("1 MB run id", lambda b, make: setattr(b, "run_id", "r" * 2**20), "run_id: 'rrrrrrrr"),
    ("thousands of unknown columns", _many_unknown_columns, "and 4997 more; expected"),
    ("1 MB column name", _huge_column_name, "unknown column(s) ['xxxxxxxxxxxxxxx... (1048576 chars)']"),
    (
        "more successes than episodes",
        lambda b, make: (setattr(b, "episodes", 1), setattr(b, "successes", 2)),
        "successes: 2 exceeds episodes (1)",
    ),
    (
        "a demonstration that ends a training episode",
        lambda b, make: (setattr(b, "demonstration", True), setattr(b, "episodes", 1)),
        "episodes: 1: a demonstration ends no training episode",
    ),
]


@pytest.mark.parametrize("case,mutate,details", BAD_INPUTS, ids=[row[0] for row in BAD_INPUTS])
def test_bad_input_is_rejected_and_the_service_keeps_serving(case, mutate, details, server, stub, make_transitions):
    storage = server.servicer.storage
    assert stub.Push(good_batch(make_transitions, seq=1), timeout=5).stored == 4
    before = stored_bytes(storage)
    bad = good_batch(make_transitions, seq=2, first_id=100)
    mutate(bad, make_transitions)
    with pytest.raises(grpc.RpcError) as err:
        stub.Push(bad, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details in err.value.details()
    assert stored_bytes(storage) == before
    assert server.servicer.counters().rejected == 1
    ack = stub.Push(good_batch(make_transitions, seq=2, first_id=200), timeout=5)
    assert (ack.stored, ack.duplicate, ack.head) == (4, False, 8)


def test_an_n_step_episode_without_its_last_rows_is_stored_and_only_that_many_missing_rows_pass(
    redis_client, make_transitions
):
    """With learner.n_step 3 a truncated 10-step episode stores 8 rows (its last 2 steps have no
    n-step return): the run's ingest takes it, one with n_step 1 or a batch short by more does
    not. (A sampler with n_step 3 once died on its first push: the check assumed a row per step.)"""
    storage = TemporalStorage(redis_client, RUN, SCHEMA, CONFIG)

    def episode(rows: int, env_steps: int, seq: int) -> pb.TransitionBatch:
        batch = good_batch(make_transitions, n=rows, seq=seq, first_id=100 * seq)
        batch.env_steps, batch.episodes, batch.successes = env_steps, 1, 0
        return batch

    with IngestServer(storage, task_ids=(TASK,), schema=SCHEMA, run_id=RUN, config=CONFIG, n_step=3) as srv:
        with grpc.insecure_channel(srv.address, options=GRPC_OPTIONS) as channel:
            stub = pb_grpc.ReplayIngestStub(channel)
            assert stub.Push(episode(8, 10, seq=1), timeout=5).stored == 8
            with pytest.raises(grpc.RpcError) as err:
                stub.Push(episode(7, 10, seq=2), timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "env_steps: 10 env steps cannot yield 7 transitions (n-step 3: at most 2" in err.value.details()
            assert srv.servicer.counters().env_steps == 10
    with IngestServer(storage, task_ids=(TASK,), schema=SCHEMA, run_id=RUN, config=CONFIG) as one_step:
        with grpc.insecure_channel(one_step.address, options=GRPC_OPTIONS) as channel:
            with pytest.raises(grpc.RpcError) as err:
                pb_grpc.ReplayIngestStub(channel).Push(episode(8, 10, seq=3), timeout=5)
            assert err.value.details() == "env_steps: 10 env steps cannot yield 8 transitions"


def test_duplicate_seq_is_acked_without_writing(server, stub, make_transitions):
    stub.Push(good_batch(make_transitions, seq=7), timeout=5)
    before = stored_bytes(server.servicer.storage)
    ack = stub.Push(good_batch(make_transitions, seq=7, first_id=50), timeout=5)
    assert (ack.seq, ack.stored, ack.duplicate, ack.head) == (7, 0, True, 4)
    assert stored_bytes(server.servicer.storage) == before


def test_concurrent_retries_of_one_seq_store_it_once(server, make_transitions):
    batch = good_batch(make_transitions, seq=3)
    acks: list[pb.PushAck] = []

    def push() -> None:
        with grpc.insecure_channel(server.address) as channel:
            acks.append(pb_grpc.ReplayIngestStub(channel).Push(batch, timeout=5))

    threads = [threading.Thread(target=push) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(a.duplicate for a in acks) == [False] + [True] * 5
    assert server.servicer.storage.head() == 4


def test_stats_count_batches_steps_rejections_and_duplicates(server, stub, make_transitions):
    for seq in range(1, 4):
        stub.Push(good_batch(make_transitions, n=5, seq=seq, first_id=5 * seq), timeout=5)
    stub.Push(good_batch(make_transitions, n=5, seq=3), timeout=5)
    for name in ("run_id", "run_id"):
        bad = good_batch(make_transitions, seq=9)
        setattr(bad, name, "nope")
        with pytest.raises(grpc.RpcError):
            stub.Push(bad, timeout=5)
    bad = good_batch(make_transitions, seq=9)
    _set_values(bad, "obs", 0, float("nan"))
    with pytest.raises(grpc.RpcError):
        stub.Push(bad, timeout=5)
    stats = stub.Stats(pb.BufferStatsRequest(), timeout=5)
    assert (stats.head, stats.env_steps, stats.batches) == (15, 15, 3)
    assert (stats.rejected, stats.duplicates) == (3, 1)
    assert (stats.oldest_window, stats.newest_window) == (0, 1)
    assert server.servicer.counters().rejected_by_reason == {"run_id": 2, "columns.data": 1}


def test_ingest_client_pushes_and_reads_stats(server, make_transitions):
    with IngestClient(server.address, sampler_id=4, run_id=RUN, push_timeout_sec=5.0) as client:
        ack = client.push(make_transitions(6), seq=1, policy_version=1, task_id=TASK, env_steps=6)
        assert (ack.stored, ack.head) == (6, 6)
        assert client.stats().env_steps == 6


def test_a_demonstration_is_stored_marked_and_counted_once_per_sampler(server, redis_client, make_transitions):
    """A demonstration's rows come back marked from Redis, beside unmarked rows of a policy's
    episode; the run counts it once for its sampler, its retry included, and its env steps."""
    from buffer.client import ReplaySampler

    with IngestClient(server.address, sampler_id=3, run_id=RUN, push_timeout_sec=5.0) as client:
        tags = dict(policy_version=0, task_id=TASK, env_steps=5)
        for seq in (1, 1):  # a retry of the same push: stored and counted once
            client.push(make_transitions(5), seq=seq, demonstration=True, **tags)
        client.push(make_transitions(5, first_id=100), seq=2, episodes=1, successes=1, **tags)
        stats = client.stats()
    assert (stats.env_steps, stats.episodes, dict(stats.demo_episodes_by_sampler)) == (10, 1, {3: 1})
    records = server.servicer.storage.read_window(0)
    assert records["demo"].tolist() == [1] * 5 + [0] * 3 and records["valid"].tolist() == [1] * 8
    replay = ReplaySampler(redis_client, RUN, SCHEMA, CONFIG, seed=0)
    replay.wait_for(10, timeout_sec=5.0)
    batch = replay.sample(200)
    assert batch.demo is not None and batch.demo.any() and not batch.demo.all()
    np.testing.assert_array_equal(batch.demo, batch.transitions.reward < 100)  # exactly the demonstration's rows


def test_a_restarted_service_reports_the_env_steps_acked_before_it(redis_client, make_transitions):
    """The proto's env_steps are "env steps ever acked": an ingest service that starts over the
    run's Redis (after a crash, or beside another) reports what was acked before it, and a
    retried push it answers as a duplicate adds nothing."""

    def serve() -> IngestServer:
        return IngestServer(TemporalStorage(redis_client, RUN, SCHEMA, CONFIG), task_ids=(TASK,), schema=SCHEMA,
                            run_id=RUN, config=CONFIG)  # fmt: skip

    with serve() as first, grpc.insecure_channel(first.address, options=GRPC_OPTIONS) as channel:
        for seq in (1, 2):
            pb_grpc.ReplayIngestStub(channel).Push(good_batch(make_transitions, n=4, seq=seq), timeout=5)
    with serve() as second, grpc.insecure_channel(second.address, options=GRPC_OPTIONS) as channel:
        stub = pb_grpc.ReplayIngestStub(channel)
        assert stub.Push(good_batch(make_transitions, n=4, seq=2), timeout=5).duplicate  # acked by the first
        stub.Push(good_batch(make_transitions, n=3, seq=3), timeout=5)
        stats = stub.Stats(pb.BufferStatsRequest(), timeout=5)
        assert (stats.env_steps, stats.batches, dict(stats.env_steps_by_task)) == (11, 3, {TASK: 11})
        assert (stats.head, stats.duplicates) == (11, 1)
        assert (second.servicer.counters().env_steps, second.servicer.counters().batches) == (11, 3)


def test_run_ingest_service_serves_until_sigterm(clean_redis_cluster, tmp_path, make_transitions):
    ready = tmp_path / "ready"
    script = textwrap.dedent(
        f"""
        from buffer.service import IngestService, serve_ingest
        from foundation.config import BufferConfig
        from foundation.process import Heartbeat, stop_event
        from foundation.transport import NO_SECURITY
        from foundation.wire import TransitionSchema
        service = IngestService(BufferConfig(), {RUN!r}, ({TASK},), TransitionSchema(3, 2, 2), "127.0.0.1:0")
        addresses, ready = {clean_redis_cluster.addresses!r}, {str(ready)!r}
        serve_ingest(service, addresses, ready, NO_SECURITY, stop_event(), Heartbeat(None))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env)
    try:
        deadline = time.monotonic() + 120  # a bound against hanging, not a timing check
        while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        address = ready.read_text()
        with IngestClient(address, sampler_id=0, run_id=RUN, push_timeout_sec=5.0) as client:
            ack = client.push(make_transitions(3), seq=1, policy_version=0, task_id=TASK, env_steps=3)
        assert ack.stored == 3
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_redis_failure_is_unavailable_and_the_retry_is_stored(server, redis_client, make_transitions):
    window_key = server.servicer.storage.layout.window_key(0)
    redis_client.rpush(window_key, "not a string")  # SETRANGE on it fails with WRONGTYPE
    with IngestClient(server.address, sampler_id=1, run_id=RUN, push_timeout_sec=1.0) as client:
        with pytest.raises(IngestUnavailable, match="redis write failed"):
            client.push(make_transitions(3), seq=1, policy_version=0, task_id=TASK, env_steps=3, max_retry_sec=0.3)
        redis_client.delete(window_key)
        ack = client.push(make_transitions(3), seq=1, policy_version=0, task_id=TASK, env_steps=3)
    assert (ack.stored, ack.duplicate) == (3, False)  # the failed attempts were never acked
    assert server.servicer.counters().batches == 1


def test_stats_report_training_success_over_the_last_100_episodes(server, stub, make_transitions):
    def push(seq: int, episodes: int, successes: int) -> None:
        batch = good_batch(make_transitions, seq=seq)
        batch.episodes, batch.successes = episodes, successes
        stub.Push(batch, timeout=5)

    push(1, 0, 0)  # a batch that ends no episode leaves the rate alone
    stats = stub.Stats(pb.BufferStatsRequest(), timeout=5)
    assert (stats.episodes, stats.train_success) == (0, 0.0)
    for seq in range(2, 52):  # 50 single-episode batches, all failures
        push(seq, 1, 0)
    for seq in range(52, 77):  # 25 batches of 2 episodes, both successes
        push(seq, 2, 2)
    stats = stub.Stats(pb.BufferStatsRequest(), timeout=5)
    assert stats.episodes == 100 and stats.train_success == pytest.approx(0.5)
    for seq in range(77, 127):  # 50 more successes: the 50 failures fall out of the window
        push(seq, 1, 1)
    stats = stub.Stats(pb.BufferStatsRequest(), timeout=5)
    assert stats.episodes == 150 and stats.train_success == pytest.approx(1.0)


def test_garbage_bytes_are_refused_and_the_service_keeps_serving(server, make_transitions):
    with grpc.insecure_channel(server.address, options=GRPC_OPTIONS) as channel:
        raw = channel.unary_unary("/fleetrl.v1.ReplayIngest/Push")  # no serializer: bytes as they are
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\xff\xfe not a protobuf \x00\x01", timeout=5)
        # gRPC itself answers a request it cannot parse (the servicer never sees it).
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert pb_grpc.ReplayIngestStub(channel).Push(good_batch(make_transitions), timeout=5).stored == 4
    assert server.servicer.storage.head() == 4
