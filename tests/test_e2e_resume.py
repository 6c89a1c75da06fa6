"""End-to-end: the whole fleet killed at once, then `fleetrl train --resume`.

Every process of `fleetrl train` (the launcher, every role, every redis-server: its process
group) gets SIGKILL together: nothing shuts down, nothing is saved. The resumed run must find
its durable buffer as it was, audited from the samplers' ack ledgers against the rows in Redis
(fleet/chaos/audit.py, which trusts no service counter), name no weights version twice, learn
on, and count both lives in its summary.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import time

import psutil
import pytest

from fleet.chaos.audit import read_acks, versions_reused
from fleet.chaos.kept_buffer import audit_kept_buffer
from fleet.report.lives import KILLED
from tests.conftest import wait_until
from tests.test_e2e_fleet import ONCE, _resumed_versions, _train

pytestmark = pytest.mark.e2e

ACKED_TRANSITIONS = 3000  # "some thousands" stored before the kill


def _acked(run_dir: pathlib.Path, pusher: str, before: float = float("inf")) -> list[dict]:
    return [r for r in read_acks(run_dir / "acks", pusher) if r["time"] < before]


def _kill_whole_fleet(train) -> float:
    """SIGKILL to the launcher's process group (every role and redis-server with it); returns
    when every one of them is gone, with the time of the kill."""
    members = [psutil.Process(train.pid), *psutil.Process(train.pid).children(recursive=True)]
    assert any("redis-server" in p.name() for p in members), [p.name() for p in members]
    killed_at = time.time()
    os.killpg(train.pid, signal.SIGKILL)
    train.communicate(timeout=30)
    _, alive = psutil.wait_procs(members, timeout=20)
    assert not alive, f"alive after SIGKILL: {[p.name() for p in alive]}"
    return killed_at


def test_a_fleet_killed_whole_resumes_with_every_acked_transition_and_no_version_reused(tmp_path):
    run_dir = tmp_path / "run"
    first = ("--target-success", "1.0", "--set", "aggregator.checkpoint_every_versions=50", *ONCE)
    first += ("--set", "eval.final_episodes=0")  # the resumed life ends short of the target: no final score
    train = _train(run_dir, "--max-wall-sec", "300", *first)
    try:
        wait_until(
            lambda: (
                sum(r["transitions"] for r in _acked(run_dir, "sampler-")) >= ACKED_TRANSITIONS
                and list((run_dir / "checkpoints").glob("ckpt_*.pt"))
            ),
            150,
            f"{ACKED_TRANSITIONS} acked transitions and a checkpoint",
            [("train", train)],
        )
        killed_at = _kill_whole_fleet(train)
    finally:
        if train.poll() is None:
            train.kill()
    acked_before = _acked(run_dir, "sampler-", killed_at)
    versions_before = max(int(r["version"]) for r in _acked(run_dir, "learner-", killed_at))
    checkpointed = max(int(p.stem.split("_")[1]) for p in (run_dir / "checkpoints").glob("ckpt_*.pt"))
    assert not (run_dir / "summary.json").exists()  # the launcher died with the rest
    wall_before = json.loads((run_dir / "progress.jsonl").read_text().splitlines()[-1])["wall_sec"]

    # The budget counts the whole run: 30 s more than the killed life's.
    again = _train(run_dir, "--resume", str(run_dir), "--max-wall-sec", str(round(wall_before + 30)))
    out, _ = again.communicate(timeout=150)
    assert again.returncode in (0, 1) and "Traceback" not in out, out[-4000:]

    resumed_at = _resumed_versions(run_dir)[-1]
    assert resumed_at > max(versions_before, checkpointed), (resumed_at, versions_before, checkpointed)
    assert versions_reused(_acked(run_dir, "learner-"), [killed_at]) == []
    assert any(r["applied"] and r["time"] > killed_at for r in _acked(run_dir, "learner-")), "no learning after"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_version"] > resumed_at, summary["final_version"]
    assert summary["resumes"] == 1 and [life["ended"] for life in summary["lives"]][0] == KILLED, summary["lives"]
    assert summary["wall_sec"] >= wall_before + summary["lives"][1]["wall_sec"] - 1.0
    assert summary["final_env_steps"] >= sum(r["env_steps"] for r in acked_before)
    first_resumed = next(
        json.loads(line) for line in (run_dir / "progress.jsonl").read_text().splitlines() if '"life": 1' in line
    )
    assert first_resumed["transitions"] >= sum(r["transitions"] for r in acked_before)  # the head, as it was

    audit = audit_kept_buffer(run_dir, _acked(run_dir, "sampler-"))  # both lives' pushes, after the resumed run
    assert audit.acked_transitions > sum(r["transitions"] for r in acked_before)
    assert (audit.lost, audit.doubled, audit.acked_twice) == (0, 0, 0), audit.lost_batches
