"""The learner's batch source: prefetch in a thread, bounded waits, errors surfaced, the heartbeat
while flow control holds a batch back; devices."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import learner.batches as batches_module
from learner.algorithm import Batch
from learner.batches import Batches
from learner.worker import resolve_device
from tests.conftest import wait_until
from tests.fakes import FakeBatchSource
from tests.helpers import RecordingHeartbeat


@pytest.mark.parametrize("prefetch", [False, True])
def test_batches_come_in_order_with_the_right_shapes(prefetch):
    source = FakeBatchSource()
    batches = Batches(source, 8, torch.device("cpu"), prefetch)
    stop = threading.Event()
    try:
        got = [batches.next(stop) for _ in range(3)]
    finally:
        batches.close()
    source.assert_calls(samples=3, batch_size=8)  # each batch after flow control said yes
    assert [float(b.reward[0]) for b in got if b is not None] == [1.0, 2.0, 3.0]
    first = got[0]
    assert first is not None and first.obs_goal.shape == (8, 5) and first.obs_goal.dtype == torch.float32


def test_a_prefetch_failure_reaches_the_learner_loop():
    batches = Batches(FakeBatchSource(fail_after=1), 4, torch.device("cpu"), prefetch=True)
    stop = threading.Event()
    try:
        assert batches.next(stop) is not None
        with pytest.raises(RuntimeError, match="prefetch thread failed") as err:
            batches.next(stop)
        assert isinstance(err.value.__cause__, ConnectionError)
    finally:
        batches.close()


def test_next_returns_none_once_stopped_even_with_nothing_to_take():
    batches = Batches(FakeBatchSource(fail_after=0), 4, torch.device("cpu"), prefetch=True)
    batches.close()  # the thread is gone: nothing will ever arrive
    stop = threading.Event()
    stop.set()
    assert batches.next(stop) is None


def test_device_auto_is_cpu_without_cuda_and_cuda_without_a_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(RuntimeError, match="learner.device is 'cuda' but torch sees no CUDA device"):
        resolve_device("cuda")


def test_a_learner_keeps_its_own_target_critics_like_the_aggregators_polyak_update():
    from foundation.acting import WeightsSnapshot
    from foundation.policy import ModelSpec
    from learner.worker import _load
    from nets.models import SACModel

    spec = ModelSpec(3, 2, 2, (8,))
    source = SACModel(spec)
    full = WeightsSnapshot(
        0, {g: source.get_flat(g) for g in ("actor", "critic", "critic_target", "log_alpha", "obs_norm")}, spec
    )
    learner = SACModel(spec)
    _load(learner, full, tau=0.25, versions=0)
    np.testing.assert_array_equal(learner.get_flat("critic_target"), source.get_flat("critic_target"))
    target = source.get_flat("critic_target").astype(np.float64)
    for version in (1, 2):  # one version at a time: exactly the aggregator's update
        critic = np.random.default_rng(version).normal(size=target.shape).astype(np.float32)
        partial = {**{g: full.tensors[g] for g in ("actor", "log_alpha", "obs_norm")}, "critic": critic}
        _load(learner, WeightsSnapshot(version, partial, spec), tau=0.25, versions=1)
        target = 0.75 * target + 0.25 * critic
        np.testing.assert_allclose(learner.get_flat("critic_target"), target, rtol=1e-5, atol=1e-6)
    critic = np.zeros(target.shape, np.float32)
    _load(learner, WeightsSnapshot(5, {"critic": critic}, spec), tau=0.25, versions=3)  # 3 versions at once
    np.testing.assert_allclose(learner.get_flat("critic_target"), target * 0.75**3, rtol=1e-5, atol=1e-6)


def test_a_learner_takes_a_snapshots_own_vectors_as_its_parameters_and_copies_a_read_only_one():
    from foundation.acting import WeightsSnapshot
    from foundation.policy import ModelSpec
    from learner.worker import _load
    from nets.models import SACModel

    spec = ModelSpec(3, 2, 2, (8,))
    source, learner = SACModel(spec), SACModel(spec)
    tensors = {g: source.get_flat(g) for g in ("actor", "critic", "critic_target", "log_alpha", "obs_norm")}
    _load(learner, WeightsSnapshot(1, tensors, spec), tau=0.25, versions=0)
    weight = learner.actor.body.net[0].weight
    assert np.shares_memory(weight.detach().numpy(), tensors["actor"])  # no copy
    assert not np.shares_memory(learner.get_flat("critic_target"), tensors["critic_target"])
    for group in ("actor", "critic", "critic_target", "log_alpha"):
        np.testing.assert_array_equal(learner.get_flat(group), tensors[group])
    frozen = {g: v.copy() * 2 for g, v in tensors.items()}
    for v in frozen.values():
        v.flags.writeable = False  # a vector decoded from gRPC bytes: read-only, copied in
    _load(learner, WeightsSnapshot(2, frozen, spec), tau=0.25, versions=0)
    weight = learner.actor.body.net[0].weight
    assert not np.shares_memory(weight.detach().numpy(), frozen["actor"])
    np.testing.assert_array_equal(learner.get_flat("actor"), frozen["actor"])
    assert weight.requires_grad


def test_batches_sample_at_the_learners_version_and_never_past_flow_control():
    source = FakeBatchSource()
    batches = Batches(source, 4, torch.device("cpu"), prefetch=False)
    batches.version = 7  # 'version' sampling bounds the rows' lag by the learner's weights
    stop = threading.Event()
    assert batches.next(stop) is not None
    source.assert_calls(samples=1, batch_size=4, version=7)
    stop.set()
    assert batches.next(stop) is None and source.samples == 1  # flow control said no: nothing sampled
    with pytest.raises(AssertionError, match="flow control bypassed"):
        source.sample(4)  # the fake refuses what a broken loop would do


@pytest.mark.parametrize("prefetch", [False, True])
def test_a_learner_held_back_by_flow_control_beats_from_its_own_thread_saying_how_long_it_waits(prefetch):
    """Stalled samplers must not make a waiting learner look hung to the watchdog: while flow
    control holds its batch back, the thread that asked for it beats, with the wait so far."""
    source, heartbeat, stop = FakeBatchSource(), RecordingHeartbeat(), threading.Event()
    source.room.clear()  # samplers stalled: no room for a batch
    batches = Batches(source, 4, torch.device("cpu"), prefetch, heartbeat=heartbeat)
    got: list[Batch | None] = []
    learner = threading.Thread(target=lambda: got.append(batches.next(stop)))
    try:
        learner.start()
        wait_until(lambda: max(heartbeat.values("flow_control_wait_sec"), default=0) >= 0.3, 30, "waiting beats")
        assert not got and source.samples == 0  # still held back
        source.room.set()
        learner.join(30)
    finally:
        stop.set()
        batches.close()
    assert got and got[0] is not None
    waits = heartbeat.values("flow_control_wait_sec")
    assert waits[-1] == 0.0 and waits[:-1] == sorted(waits[:-1]) and min(waits[:-1]) > 0  # growing, then over
    assert heartbeat.threads() == {learner}  # never the prefetch thread: one writer of the heartbeat


def test_no_beat_with_room_at_once_nor_without_a_heartbeat():
    heartbeat = RecordingHeartbeat()
    batches = Batches(FakeBatchSource(), 4, torch.device("cpu"), prefetch=False, heartbeat=heartbeat)
    assert batches.next(threading.Event()) is not None and heartbeat.beats == []
    stalled = FakeBatchSource()
    stalled.room.clear()
    threading.Timer(0.1, stalled.room.set).start()
    assert Batches(stalled, 4, torch.device("cpu"), prefetch=False).next(threading.Event()) is not None


class _StuckWait(FakeBatchSource):
    """Flow control that polls once, finding no room, then hangs (a refresh that never returns)."""

    def __init__(self) -> None:
        super().__init__()
        self.polled, self.release = threading.Event(), threading.Event()

    def wait_to_sample(self, batch_size, stop, on_wait=lambda: None):
        if not self.polled.is_set():
            on_wait()
            self.polled.set()
            self.release.wait(30)
        return super().wait_to_sample(batch_size, stop, on_wait)


def test_a_prefetch_thread_stuck_in_its_wait_stops_the_beats_so_the_watchdog_still_sees_it(monkeypatch):
    monkeypatch.setattr(batches_module, "FLOW_CONTROL_POLL_FRESH_SEC", 0.2)
    source, heartbeat, stop = _StuckWait(), RecordingHeartbeat(), threading.Event()
    batches = Batches(source, 4, torch.device("cpu"), prefetch=True, heartbeat=heartbeat)
    learner = threading.Thread(target=lambda: batches.next(stop))
    try:
        learner.start()
        assert source.polled.wait(30)
        time.sleep(0.6)  # past the poll's freshness (0.2 s here): no beat after that
        beats = len(heartbeat.beats)
        time.sleep(0.8)
        assert len(heartbeat.beats) == beats, heartbeat.beats  # silent: the watchdog would restart it
    finally:
        source.release.set()
        learner.join(30)
        stop.set()
        batches.close()
