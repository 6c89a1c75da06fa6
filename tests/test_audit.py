"""The auditor's arithmetic (fleet/chaos/audit.py) on made-up ledgers, versions and Redis contents."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from fleet.chaos.audit import (
    Life,
    acked_env_steps_between,
    aggregator_lives,
    audit_batches,
    audit_gradients,
    lineage,
    read_acks,
    restart_times,
    rollback_bound,
    versions_reused,
)


def batch(seq: int, fingerprint: str, ledger: str = "sampler-0", incarnation: int = 1) -> dict:
    return {"ledger": ledger, "incarnation": incarnation, "seq": seq, "fingerprint": fingerprint,
            "env_steps": 50, "transitions": 250}  # fmt: skip


def push(seq: int, version: int, t: float, applied: bool = True, duplicate: bool = False, incarnation: int = 1) -> dict:
    return {"ledger": "learner-0", "incarnation": incarnation, "seq": seq, "version": version, "time": t,
            "applied": applied, "duplicate": duplicate}  # fmt: skip


def redis(*firsts: str) -> Counter[str]:
    """Fingerprints of every stored row: a batch of 250 rows per first-row fingerprint given
    (its other rows, HER's copies included, carry other goals: fingerprints of their own)."""
    stored: Counter[str] = Counter()
    for n, first in enumerate(firsts):
        stored[first] += 1
        stored.update(f"{first}{n}-row{i}" for i in range(249))
    return stored


@pytest.mark.parametrize(
    ("stored", "lost", "doubled", "unacked"),
    [
        (redis("a", "b"), 0, 0, 0),  # every acked batch once
        (redis("a"), 1, 0, -250),  # b acked, not stored
        (redis("a", "a", "b"), 0, 1, 250),  # a stored twice
        (redis("a", "b", "c"), 0, 0, 250),  # c stored, never acked: in flight when its sampler died
    ],
)
def test_batches_acked_are_found_in_redis_once(stored, lost, doubled, unacked):
    result = audit_batches([batch(1, "a"), batch(2, "b")], stored)
    assert (result.lost, result.doubled, result.stored_unacked_transitions) == (lost, doubled, unacked)
    assert result.lost_env_steps == 50 * lost
    assert (result.acked_batches, result.acked_env_steps, result.acked_transitions) == (2, 100, 500)


def test_a_push_with_two_ledger_lines_counts_once_and_is_reported():
    result = audit_batches([batch(1, "a"), batch(1, "a"), batch(1, "b", ledger="sampler-1")], redis("a", "b"))
    assert (result.acked_batches, result.acked_twice, result.lost) == (2, 1, 0)


def test_read_acks_names_each_ledger_and_skips_a_torn_last_line(tmp_path):
    (tmp_path / "sampler-1-77.jsonl").write_text(json.dumps({"seq": 1}) + "\n" + '{"seq": 2, "fing')
    (tmp_path / "learner-0-5.jsonl").write_text(json.dumps({"seq": 9}) + "\n")
    assert read_acks(tmp_path, "sampler-") == [{"seq": 1, "ledger": "sampler-1"}]


def test_aggregator_lives_come_from_its_resume_lines():
    log = (
        "12:00:01 aggregator-0 INFO restored checkpoint version 500; resuming at version 1001\n"
        "12:00:09 aggregator-0 INFO restored checkpoint version 1500; resuming at version 1500\n"
        "12:00:15 aggregator-0 INFO no checkpoint (a crash before the first): the initial weights; resuming at "
        "version 2001\n"
    )
    assert aggregator_lives(log) == [Life(500, 1001), Life(1500, 1500), Life(0, 2001)]


@pytest.mark.parametrize(
    ("lives", "final", "ranges"),
    [
        ([], 300, [(0, 300)]),  # one life: every version from 0
        ([Life(500, 1001)], 1200, [(0, 500), (1001, 1200)]),  # a crash: 501.. rolled back
        # Two crashes, the second before the new life's first checkpoint: back to 500 again.
        ([Life(500, 1001), Life(500, 2001)], 2100, [(0, 500), (2001, 2100)]),
        # The second restored a checkpoint of the second life.
        ([Life(500, 1001), Life(1500, 2001)], 2100, [(0, 500), (1001, 1500), (2001, 2100)]),
        ([Life(1500, 1500)], 1600, [(0, 1500)] + [(1500, 1600)]),  # a clean stop: nothing rolled back
        ([Life(0, 1001)], 1100, [(1001, 1100)]),  # no checkpoint yet: the initial weights renamed 1001
    ],
)
def test_lineage_keeps_each_lifes_versions_up_to_the_checkpoint_the_next_one_restored(lives, final, ranges):
    assert lineage(lives, final) == ranges


def test_versions_acked_after_a_restart_at_or_below_one_acked_before_it_are_reused():
    acks = [push(1, 10, 1.0), push(2, 11, 2.0), push(3, 1, 6.0), push(4, 2, 7.0), push(5, 12, 8.0)]
    assert versions_reused(acks, restarts=[5.0]) == [1, 2]
    assert versions_reused(acks[:2] + [push(3, 1012, 6.0)], restarts=[5.0]) == []
    # An answer repeated from before the restart (a retried push the checkpoint held) names its old version.
    assert versions_reused(acks[:2] + [push(2, 11, 6.0, duplicate=True)], restarts=[5.0]) == []


def test_gradients_in_the_weights_history_rolled_back_and_applied_twice():
    # Life 1: versions 1..6 (checkpoint at 4), killed; life 2 restored 4 and resumed at 11.
    acks = [push(s, s, float(s)) for s in range(1, 7)] + [push(7 + i, 12 + i, 20.0 + i) for i in range(3)]
    audit = audit_gradients(acks, [Life(4, 11)], final_version=14, restarts=[10.0])
    assert (audit.acked_applied, audit.in_history, audit.rolled_back) == (9, 7, 2)
    assert (audit.history_steps, audit.unaccounted_steps, audit.applied_twice, audit.versions_reused) == (7, 0, 0, 0)
    # The same history with one more step than the acks account for beyond the learner's one
    # push in flight: a push applied twice (once before the checkpoint, again after the restart).
    audit = audit_gradients(acks, [Life(4, 11)], final_version=16, restarts=[10.0])
    assert (audit.unaccounted_steps, audit.applied_twice) == (2, 1)


def test_the_rollback_bound_is_two_checkpoint_intervals_per_aggregator_restart():
    # The example above: one restart, a checkpoint every 2 versions: 2 rolled back is within 4.
    acks = [push(s, s, float(s)) for s in range(1, 7)] + [push(7 + i, 12 + i, 20.0 + i) for i in range(3)]
    audit = audit_gradients(acks, [Life(4, 11)], final_version=14, restarts=[10.0])
    assert audit.rolled_back <= rollback_bound(1, checkpoint_every_versions=2) == 4
    # Had the checkpoints at 2 and 4 not been written (life 2 restored the one at 1), 5 roll back:
    # past the bound.
    audit = audit_gradients(acks, [Life(1, 11)], final_version=14, restarts=[10.0])
    assert audit.rolled_back == 5 > rollback_bound(1, checkpoint_every_versions=2)
    assert rollback_bound(0, checkpoint_every_versions=500) == 0


def test_stale_pushes_are_acked_but_not_in_the_history():
    audit = audit_gradients([push(1, 1, 1.0), push(2, 1, 2.0, applied=False)], [], final_version=1, restarts=[])
    assert (audit.acked, audit.acked_applied, audit.in_history, audit.unaccounted_steps) == (2, 1, 1, 0)


def test_restart_times_are_the_watchdogs_restarts_of_that_role(tmp_path):
    events = tmp_path / "events.jsonl"
    rows = [
        {"time": 1.0, "role": "aggregator", "event": "aggregator exited with code -9: restarted"},
        {"time": 2.0, "role": "sampler-0", "event": "sampler-0 exited with code -9: restarted"},
        {"time": 3.0, "role": "aggregator", "event": "aggregator exited with code -9: restarting in 1.0s"},
        {"time": 4.0, "role": "aggregator", "event": "aggregator restarted after its backoff"},
    ]
    events.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert restart_times(events, "aggregator") == [1.0, 4.0]
    assert restart_times(tmp_path / "none.jsonl", "aggregator") == []


@pytest.mark.parametrize(
    "since,until,steps",
    [(10.0, 20.0, 100), (10.5, 20.0, 50), (0.0, 10.0, 0), (20.0, 30.0, 50), (30.0, 40.0, 0)],  # [since, until)
)
def test_acked_env_steps_between_count_the_ledger_rows_in_the_window(since, until, steps):
    rows = [{"time": 10.0, "env_steps": 50}, {"time": 15.0, "env_steps": 50}, {"time": 20.0, "env_steps": 50}]
    assert acked_env_steps_between(rows, since, until) == steps
