"""The learner role with a fake aggregator client and a fake batch source: which weights its
gradients are computed on, one push in flight, how it waits when its weights fall behind, and
that it keeps beating while flow control holds its batches back."""

from __future__ import annotations

import threading
import time

import learner.worker as worker
from foundation.config import RunConfig, with_overrides
from foundation.process import Heartbeat
from foundation.transport import NO_SECURITY
from learner.worker import LearnerEndpoints, run_learner
from tests.conftest import wait_until
from tests.fakes import FakeAggregatorClient, FakeBatchSource
from tests.helpers import SPEC, RecordingHeartbeat

CONFIG = ["learner.batch_size=8", "learner.min_replay_transitions=8", 'learner.device="cpu"', "learner.prefetch=false"]


class _Replay(FakeBatchSource):
    """The replay sampler's counters the learner reads besides its batches."""

    lag_fallbacks = 0
    rate_limited_sec = 0.0

    def size(self) -> int:
        return 1000

    def try_refresh(self) -> None:
        pass


class _Redis:
    def close(self) -> None:
        pass


class _Learner:
    """run_learner in a thread, on `agg` and a fake replay buffer; stop() returns its result."""

    def __init__(
        self,
        monkeypatch,
        agg: FakeAggregatorClient,
        overrides: list[str],
        heartbeat: Heartbeat | None = None,
        stalled: bool = False,
    ) -> None:
        self.replay, self.result = _Replay(), -1
        if stalled:  # the samplers store nothing: flow control holds every batch back until room.set()
            self.replay.room.clear()
        monkeypatch.setattr(worker, "connect", lambda addresses, security: _Redis())
        monkeypatch.setattr(worker, "AggregatorClient", lambda *args, **kwargs: agg)
        monkeypatch.setattr(worker, "ReplaySampler", lambda *args, **kwargs: self.replay)
        config = with_overrides(RunConfig(), [*CONFIG, *overrides])
        self.stop_event = threading.Event()
        endpoints = LearnerEndpoints("127.0.0.1:1", "127.0.0.1:2")
        args = (config, 0, endpoints, NO_SECURITY, self.stop_event, heartbeat or Heartbeat(None))
        self.thread = threading.Thread(target=self._run, args=args)
        self.thread.start()

    def _run(self, *args) -> None:
        self.result = run_learner(*args)

    def stop(self) -> int:
        self.stop_event.set()
        self.thread.join(30)
        assert not self.thread.is_alive()
        return self.result


def test_a_learner_differentiates_the_newest_weights_and_keeps_one_push_in_flight(monkeypatch):
    agg = FakeAggregatorClient(SPEC)
    learner = _Learner(monkeypatch, agg, [])
    try:
        wait_until(lambda: len(agg.pushes) >= 6, 60, "six gradient pushes", interval_sec=0.01)
    finally:
        pushed = learner.stop()
    agg.assert_pushes(at_least=6)
    assert pushed == len(agg.pushes)  # every gradient it counts was pushed, the last one too
    # each push was applied at once: every gradient after the first is of the version it made
    assert [p.base_version for p in agg.pushes] == list(range(len(agg.pushes)))
    # each batch was sampled for the version its gradient is computed on (bounds the rows' lag)
    sampled = [c.version for c in learner.replay.calls if c.method == "sample"]
    assert sampled[: len(agg.pushes)] == [p.base_version for p in agg.pushes], sampled
    assert agg.closed


def test_a_learner_whose_weights_fall_behind_its_acks_waits_for_newer_weights(monkeypatch):
    agg = FakeAggregatorClient(SPEC, broadcast=False)  # versions move, watchers see none of them
    learner = _Learner(monkeypatch, agg, ["learner.max_grad_staleness=1"])
    try:
        # acks say v1 and v2 while the learner still holds v0: with staleness 1 it pushes three
        # gradients of v0 (one acked at v2 allows v1 at worst) and then waits for weights
        wait_until(lambda: len(agg.pushes) == 3, 60, "three gradient pushes", interval_sec=0.01)
        time.sleep(1.5)
        assert len(agg.pushes) == 3, [p.base_version for p in agg.pushes]
        agg.broadcast()  # v3 arrives: three more, then it waits again
        wait_until(lambda: len(agg.pushes) == 6, 60, "six gradient pushes", interval_sec=0.01)
        time.sleep(1.5)
    finally:
        learner.stop()
    assert [p.base_version for p in agg.pushes] == [0, 0, 0, 3, 3, 3]
    assert not agg.violations, agg.violations


def test_a_learner_process_draws_its_batches_and_noise_from_its_incarnation():
    """A restarted or resumed learner (a new incarnation) draws neither its previous life's
    batches nor its noise again; the same incarnation gives the same streams."""
    import torch

    config = RunConfig()
    with torch.random.fork_rng():
        draws = {}
        for name, incarnation in (("first", 11), ("again", 11), ("restarted", 12)):
            replay_seed = worker.seed_learner_process(config, 0, incarnation)
            draws[name] = (replay_seed, torch.rand(4))
    assert draws["first"][0] == draws["again"][0] and torch.equal(draws["first"][1], draws["again"][1])
    assert draws["first"][0] != draws["restarted"][0]
    assert not torch.equal(draws["first"][1], draws["restarted"][1])


def test_a_learner_held_back_by_flow_control_keeps_beating_then_pushes_once_samplers_catch_up(monkeypatch):
    """Samplers that stall (one restarting, Redis failing over) hold the learner's batches back:
    it keeps its heartbeat fresh, saying how long it has waited, so the watchdog leaves it be."""
    agg, heartbeat = FakeAggregatorClient(SPEC), RecordingHeartbeat()
    learner = _Learner(monkeypatch, agg, [], heartbeat, stalled=True)
    try:
        wait_until(lambda: max(heartbeat.values("flow_control_wait_sec"), default=0) >= 0.5, 60, "waiting beats")
        assert not agg.pushes and learner.replay.samples == 0
        learner.replay.room.set()
        wait_until(lambda: len(agg.pushes) >= 2, 60, "two gradient pushes", interval_sec=0.01)
    finally:
        learner.stop()
    assert heartbeat.counters["flow_control_wait_sec"] == 0.0  # no longer waiting
    assert learner.thread in heartbeat.threads()
    agg.assert_pushes(at_least=2)
