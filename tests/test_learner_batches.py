"""The learner's batch source: prefetch in a thread, bounded waits, errors surfaced; devices."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from foundation.wire import Transitions
from learner.worker import Batches, resolve_device


class FakeReplay:
    """ReplaySampler's sample() and size(); row i of call k has reward k (the call's number)."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.calls = 0
        self.fail_after = fail_after

    def size(self) -> int:
        return 1000

    def wait_to_sample(self, n: int, stop) -> bool:  # no flow control here
        return True

    def sample(self, n: int, version: int = 0):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise ConnectionError("redis went away")
        self.calls += 1
        f = np.full
        rows = Transitions(
            obs=f((n, 3), 0.5, np.float32),
            goal=f((n, 2), 0.25, np.float32),
            action=f((n, 2), 0.1, np.float32),
            reward=f(n, float(self.calls), np.float32),
            next_obs=f((n, 3), 0.75, np.float32),
            done=np.zeros(n, np.float32),
        )
        return type("Sampled", (), {"transitions": rows})()


@pytest.mark.parametrize("prefetch", [False, True])
def test_batches_come_in_order_with_the_right_shapes(prefetch):
    batches = Batches(FakeReplay(), 8, torch.device("cpu"), prefetch)  # type: ignore[arg-type]
    stop = threading.Event()
    try:
        got = [batches.next(stop) for _ in range(3)]
    finally:
        batches.close()
    assert [float(b.reward[0]) for b in got if b is not None] == [1.0, 2.0, 3.0]
    first = got[0]
    assert first is not None and first.obs_goal.shape == (8, 5) and first.obs_goal.dtype == torch.float32


def test_a_prefetch_failure_reaches_the_learner_loop():
    batches = Batches(FakeReplay(fail_after=1), 4, torch.device("cpu"), prefetch=True)  # type: ignore[arg-type]
    stop = threading.Event()
    try:
        assert batches.next(stop) is not None
        with pytest.raises(RuntimeError, match="prefetch thread failed") as err:
            batches.next(stop)
        assert isinstance(err.value.__cause__, ConnectionError)
    finally:
        batches.close()


def test_next_returns_none_once_stopped_even_with_nothing_to_take():
    batches = Batches(FakeReplay(fail_after=0), 4, torch.device("cpu"), prefetch=True)  # type: ignore[arg-type]
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
    from learner.models import SACModel
    from learner.worker import _load

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
