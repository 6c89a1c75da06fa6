"""Learners come and go without restarting anyone: K-of-M on real processes.

A fleet configured for two learners (K = M = 2) starts with one: its steps close at the step
deadline. A second learner joins (`fleetrl learner --id 1`, nobody restarted) and its gradients
are applied; it is SIGKILLed and the first learner's steps go on. Counted from the learners'
ack ledgers and the aggregator's per-sender counts.
"""

from __future__ import annotations

import pathlib
import signal

import pytest

from aggregator.client import AggregatorClient
from foundation.config import RunConfig, with_overrides
from foundation.ledger import read_ledgers
from tests.conftest import wait_until
from tests.helpers import TASK, role_args, start_role, stop_all

pytestmark = pytest.mark.e2e


def _applied(acks: pathlib.Path, learner: int) -> int:
    return sum(r["applied"] for r in read_ledgers(acks, f"learner-{learner}"))


def test_a_learner_joins_and_leaves_a_running_fleet_and_no_step_waits_for_it(tmp_path, clean_redis_cluster):
    overrides = [f'sim.task="{TASK}"', 'run_id="learners"', "learner.num_learners=2", "security.enabled=false"]
    config = with_overrides(RunConfig(), [*overrides, "learner.min_replay_transitions=500"])
    config_path = tmp_path / "config.json"
    config_path.write_text(config.to_json())
    logs, acks = tmp_path / "logs", tmp_path / "acks"
    logs.mkdir()
    args = role_args(clean_redis_cluster, acks)
    procs = {role: start_role(role, config_path, logs, *args[role]) for role in ("aggregator", "buffer", "sampler")}
    aggregator = args["sampler"][args["sampler"].index("--aggregator") + 1]
    try:
        procs["learner-0"] = start_role("learner", config_path, logs, "--id", "0", *args["learner"])
        # One of two learners: every step closes at its deadline.
        wait_until(lambda: _applied(acks, 0) >= 30, 180, "steps with one learner of two", procs)
        procs["learner-1"] = start_role("learner", config_path, logs, "--id", "1", *args["learner"])
        wait_until(lambda: _applied(acks, 1) >= 30, 180, "the joining learner's gradients applied", procs)
        with AggregatorClient(aggregator, timeout_sec=10) as agg:
            joined = agg.stats().version
        procs.pop("learner-1").send_signal(signal.SIGKILL)
        before = _applied(acks, 0)
        wait_until(lambda: _applied(acks, 0) >= before + 30, 180, "steps after a learner left", procs)
        # One learner's gradients alone make versions. A wait, not a snapshot: an ack means the
        # gradient joined the open step (which closes at its deadline), and the ledger records
        # each ack when the next gradient is ready, so the 30th may be a version short.
        with AggregatorClient(aggregator, timeout_sec=10) as agg:
            wait_until(lambda: agg.stats().version >= joined + 30, 60, "versions after a learner left", procs)
    finally:
        stop_all(procs)  # wait_until checked all along that no other process exited
