"""Regression tests for bugs found in review: each failed before its fix."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import grpc
import numpy as np
import pytest

from aggregator.client import AggregatorClient
from aggregator.core import AggregatorCore
from aggregator.service import AggregatorServer
from foundation.config import AggregatorConfig, ConfigError, EvalConfig, RunConfig, with_overrides
from foundation.proto import fleetrl_pb2_grpc as pb_grpc
from foundation.transport import GRPC_OPTIONS
from foundation.wire import to_tensor
from sampler.evaluator import evaluate
from sim.registry import make_env
from tests.helpers import SPEC, push

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "override,message",
    [
        ("sim.randomization.mass_scale=[0.5]", "RandomizationConfig.mass_scale must be a list of 2"),
        (
            "sim.randomization.action_latency_steps=[0, 1, 2]",
            "RandomizationConfig.action_latency_steps must be a list of 2",
        ),
    ],
)
def test_fixed_length_tuples_check_their_length(override, message):
    with pytest.raises(ConfigError, match=message):
        with_overrides(RunConfig(), [override])


@pytest.mark.parametrize(
    "override,message",
    [
        ("aggregator.keep_checkpoints=0", "aggregator.keep_checkpoints (0) must be >= 1"),
        ("aggregator.grads_per_step=-1", "aggregator.grads_per_step (-1) must be >= 0"),
        ("sampler.weights_interval_sec=-1", "sampler.weights_interval_sec (-1.0) must be >= 0"),
    ],
)
def test_validate_catches_values_that_fail_later_in_a_role(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        with_overrides(RunConfig(), [override]).validate()


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


class FailsOn:
    """Reaches the goal, except in the listed episodes (there it drives away from the goal)."""

    def __init__(self, failing: set[int]) -> None:
        self.failing, self.episode, self._goal = failing, -1, None

    def act(self, obs, deterministic, task=0):
        if self._goal is None or not np.array_equal(obs["desired_goal"], self._goal):
            self.episode += 1
            self._goal = obs["desired_goal"].copy()
        sign = -1.0 if self.episode in self.failing else 1.0
        action = np.zeros(4, np.float32)
        action[:3] = np.clip(sign * 10 * (obs["desired_goal"] - obs["observation"][:3]), -1, 1)
        return action


def test_early_stop_never_cuts_a_version_that_reaches_the_target_exactly():
    # 0.28 * 25 == 7.000000000000001 in floating point: ceil gives 8, one failure too few allowed.
    env = make_env("FetchReach-v4")
    try:
        result = evaluate(env, FailsOn(set(range(18))), EvalConfig(episodes=25, seed=1_000_000), stop_below=0.28)
    finally:
        env.close()
    assert result.episodes == 25 and result.success_rate == pytest.approx(7 / 25)
    assert result.success_rate >= 0.28


def test_after_a_crash_the_restored_version_jumps_past_every_version_that_may_have_been_broadcast(tmp_path):
    from tests.helpers import CONFIG, make_core

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
    from tests.helpers import CONFIG, make_core

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


def test_samplers_the_buffer_and_the_evaluator_do_not_load_torch():
    """torch is ~200 MiB resident, and a sampler pins what it touches (mlockall): the roles that
    never encode or decode a checkpoint must not import it (the CLI once did, for an error type)."""
    code = (
        "import sys, fleet.cli.main, sampler.worker, sampler.evaluator, buffer.service; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout
