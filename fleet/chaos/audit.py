"""Loss accounting from both ends: what the roles were told was acked against what is stored.

    rows = read_acks(run_dir / "acks", "sampler-")                  # the samplers' ack ledgers
    batches = audit_batches(rows, Counter(row_fingerprint(r) for r in stored_rows))
    grads = audit_gradients(read_acks(run_dir / "acks", "learner-"), aggregator_lives(log_text),
                            final_version, aggregator_restarts)
    batches.lost, batches.doubled, grads.applied_twice, grads.versions_reused   # all 0 in a sound fleet

The auditor trusts none of the services' counters. Its two ends are the ack ledgers the
pushing processes write (foundation/ledger.py: one line per acked push) and what the
services hold: the rows in Redis (each sampler batch is found by the fingerprint of its first
row, sampler/pusher.py) and the history of the weights (the aggregator's version numbers and
the checkpoints it resumed from, as its log says). Everything here but the readers at the end
is pure, so it is tested on made-up ledgers (tests/test_audit.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass

# One learner push in flight when its process dies: applied or not, its ack is never written.
PUSHES_IN_FLIGHT_PER_LEARNER = 1
# aggregator/persistence.py's lines: a checkpoint restored, or none yet (the initial weights, version 0).
_RESUMED = re.compile(
    r"(?:restored checkpoint version (\d+)|no checkpoint \(.*?\): the initial weights); resuming at version (\d+)"
)


def read_acks(directory: str | os.PathLike, name_prefix: str) -> list[dict]:
    """Every row of every `<name_prefix>*.jsonl` ledger, each with its `ledger` (the pusher's
    name, e.g. "sampler-1"). A torn last line (a process killed mid-write) is skipped."""
    rows = []
    for path in sorted(pathlib.Path(directory).glob(f"{name_prefix}*.jsonl")):
        name = path.stem.rsplit("-", 1)[0]
        for line in path.read_text().splitlines():
            try:
                rows.append({**json.loads(line), "ledger": name})
            except ValueError:
                continue
    return rows


def acked_env_steps_between(rows: Iterable[dict], since: float, until: float) -> int:
    """Env steps acked in [since, until) (epoch seconds, the ledgers' `time`): what a sampler
    host got through while a network fault lasted."""
    return sum(int(r.get("env_steps", 0)) for r in rows if since <= float(r.get("time", -1.0)) < until)


def _push_key(row: dict) -> tuple[str, int, int]:
    return row["ledger"], int(row["incarnation"]), int(row["seq"])


def _by_push(acked: Iterable[dict]) -> tuple[dict[tuple[str, int, int], dict], int]:
    """Ledger rows by push (pusher, incarnation, seq), the last line of each, and how many
    pushes had more than one line (acked twice)."""
    rows: dict[tuple[str, int, int], dict] = {}
    twice = 0
    for row in acked:
        key = _push_key(row)
        twice += key in rows
        rows[key] = row
    return rows, twice


@dataclass(frozen=True)
class BatchAudit:
    """Sampler batches: acked (ledgers) against stored (Redis)."""

    acked_batches: int
    acked_env_steps: int
    acked_transitions: int
    stored_transitions: int
    lost: int  # acked, not in Redis
    lost_env_steps: int
    doubled: int  # acked, in Redis more than once
    acked_twice: int  # one push (pusher, incarnation, seq) with two ledger lines
    stored_unacked_transitions: int  # stored beyond the acked: pushes in flight when a sampler died
    lost_batches: list[str]  # the first few lost: "<ledger>:<incarnation>:<seq> acked at <epoch s>"

    def as_dict(self) -> dict:
        return asdict(self)


def audit_batches(acked: Iterable[dict], stored: Counter[str]) -> BatchAudit:
    """`acked`: sampler ledger rows (read_acks); `stored`: how often each first-row fingerprint
    occurs among the rows in Redis (HER's copies of a batch carry other goals, so a batch's
    first row is its own). Run it on a buffer that has evicted nothing: an evicted batch would
    count as lost."""
    rows, twice = _by_push(acked)
    lost = [r for r in rows.values() if stored[r["fingerprint"]] == 0]
    acked_transitions = sum(int(r["transitions"]) for r in rows.values())
    stored_transitions = stored.total()
    return BatchAudit(
        acked_batches=len(rows),
        acked_env_steps=sum(int(r["env_steps"]) for r in rows.values()),
        acked_transitions=acked_transitions,
        stored_transitions=stored_transitions,
        lost=len(lost),
        lost_env_steps=sum(int(r["env_steps"]) for r in lost),
        doubled=sum(stored[r["fingerprint"]] > 1 for r in rows.values()),
        acked_twice=twice,
        stored_unacked_transitions=stored_transitions - acked_transitions,
        lost_batches=[f"{r['ledger']}:{r['incarnation']}:{r['seq']} acked at {r.get('time')}" for r in lost[:20]],
    )


@dataclass(frozen=True)
class Life:
    """One aggregator process start that resumed from a checkpoint: the weights of `restored`
    renamed `resumed` (past every version the crashed one may have sent)."""

    restored: int
    resumed: int


def aggregator_lives(log_text: str) -> list[Life]:
    """Every resume the aggregator logged, in order (aggregator/persistence.py's line)."""
    return [Life(int(a or 0), int(b)) for a, b in _RESUMED.findall(log_text)]


def lineage(lives: list[Life], final_version: int, first_version: int = 0) -> list[tuple[int, int]]:
    """The versions in the history of the final weights, as half-open (lo, hi] ranges, oldest
    first: each made by one gradient step of the life that made it. A life's steps up to the
    checkpoint the next one restored are in the history; those after it were rolled back.

    `first_version`: the version the first process started at (0: a fresh run)."""
    starts = [first_version] + [life.resumed for life in lives]
    ranges = []
    hi, index = final_version, len(starts) - 1
    while True:
        lo = starts[index]
        if hi > lo:
            ranges.append((lo, hi))
        if index == 0:
            break
        hi = lives[index - 1].restored  # the weights this life started from ...
        index = max(i for i in range(index) if starts[i] <= hi)  # ... were made by that earlier life
    return ranges[::-1]


def versions_reused(acks: Iterable[dict], restarts: list[float]) -> list[int]:
    """Versions acked after an aggregator restart (epoch seconds) at or below one acked before
    it: one version number naming two sets of weights. Answers repeated from before a restart
    (`duplicate`) name the old version rightly and are left out."""
    rows = sorted((r for r in acks if not r.get("duplicate")), key=lambda r: r["time"])
    reused: set[int] = set()
    for restart in sorted(restarts):
        before = [int(r["version"]) for r in rows if r["time"] < restart]
        if not before:
            continue
        seen = max(before)
        reused |= {int(r["version"]) for r in rows if r["time"] >= restart and int(r["version"]) <= seen}
    return sorted(reused)


@dataclass(frozen=True)
class GradientAudit:
    """Learner pushes: acked (ledgers) against the history of the weights (versions)."""

    acked: int  # pushes acked
    acked_applied: int  # ... as applied (the others were stale or refused)
    in_history: int  # acked as applied at a version in the final weights' history
    rolled_back: int  # acked as applied at a version an aggregator crash rolled back (by design)
    history_steps: int  # gradient steps in the final weights' history (its version ranges)
    unaccounted_steps: int  # history steps no ack accounts for (a push in flight at a kill, or twice)
    applied_twice: int  # unaccounted steps beyond the pushes that were in flight at a learner's death
    acked_twice: int  # one push with two ledger lines
    versions_reused: int  # version numbers that named two sets of weights
    reused_versions: list[int]  # the first few of them

    def as_dict(self) -> dict:
        return asdict(self)


def audit_gradients(
    acked: list[dict],
    lives: list[Life],
    final_version: int,
    restarts: list[float],
    first_version: int = 0,
) -> GradientAudit:
    """`acked`: learner ledger rows (read_acks); `lives`: the aggregator's resumes
    (aggregator_lives); `final_version`: its final checkpoint's; `restarts`: when the
    aggregator was restarted (epoch seconds; the watchdog's events). One gradient per version
    step, as with one learner or grads_per_step 1 (more per step make unaccounted_steps
    negative and applied_twice 0: a weaker check)."""
    pushes, twice = _by_push(acked)
    ranges = lineage(lives, final_version, first_version)

    def kept(version: int) -> bool:
        return any(lo < version <= hi for lo, hi in ranges)

    applied = [r for r in pushes.values() if r["applied"]]
    in_history = sum(kept(int(r["version"])) for r in applied)
    steps = sum(hi - lo for lo, hi in ranges)
    incarnations = {(r["ledger"], int(r["incarnation"])) for r in pushes.values()}
    unaccounted = steps - in_history
    reused = versions_reused(pushes.values(), restarts)
    return GradientAudit(
        acked=len(pushes),
        acked_applied=len(applied),
        in_history=in_history,
        rolled_back=len(applied) - in_history,
        history_steps=steps,
        unaccounted_steps=unaccounted,
        applied_twice=max(0, unaccounted - PUSHES_IN_FLIGHT_PER_LEARNER * len(incarnations)),
        acked_twice=twice,
        versions_reused=len(reused),
        reused_versions=reused[:20],
    )


def rollback_bound(aggregator_restarts: int, checkpoint_every_versions: int) -> int:
    """The most acked-as-applied gradients that aggregator crashes may roll back: per restart,
    the versions since the checkpoint it resumes from, at most one interval since the last one
    submitted plus one more while the writer thread writes it (aggregator/persistence.py).
    More than this: a checkpoint that was due was not written."""
    return aggregator_restarts * 2 * checkpoint_every_versions


def restart_times(events_path: str | os.PathLike, role: str) -> list[float]:
    """When the watchdog started `role` again (epoch seconds), from a run's events.jsonl."""
    path = pathlib.Path(events_path)
    if not path.exists():
        return []
    times = []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("role") == role and "restarted" in event.get("event", ""):  # not "restarting in Ns"
            times.append(float(event["time"]))
    return times
