"""A run's lives: each start of `fleetrl train` on one run directory, the first and every resume
(or of a `fleetrl fleet up` fleet on its aggregator's host: a restarted or requeued fleet).

    history = RunHistory.begin(run_dir, buffer_kept=cluster.kept_nodes())  # lives.jsonl gets this life
    history.life                       # 0 for a fresh run, n after n resumes
    snap = history.carried.onto(snap)  # counts of the whole run, the earlier lives' included
    history.lives(ended, last)         # every life, for summary.json; this one's end in lives.jsonl

What an earlier life reached is the last line of progress.jsonl (written every 5 s and when a
launcher stops): a life killed whole, launcher included, leaves no summary, and up to those
5 s of it go uncounted. Its wall-clock carries into this life's; its env steps and transitions
carry only when this life's buffer starts empty (buffer.durable off, or its data gone): a kept
buffer's own counters hold them already.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Any

from fleet.report.progress import EvalPoint, Snapshot, read_jsonl

LIVES_FILE = "lives.jsonl"
KILLED = "killed (no summary written)"


@dataclasses.dataclass(frozen=True)
class Carried:
    """What the earlier lives add to this one's counts."""

    wall_sec: float = 0.0
    env_steps: int = 0
    transitions: int = 0
    scored_through: int = -1  # the highest version the earlier lives scored (evals.jsonl)

    def onto(self, snap: Snapshot) -> Snapshot:
        """`snap` (its wall_sec already the whole run's) with the earlier lives' env steps and
        transitions added, to its scores too: a score of this life (a version above every one
        scored before: versions are never reused) counts env steps from this life's buffer; an
        earlier life's, which the aggregator answers with until this life scores, counts them
        all already."""
        if not (self.env_steps or self.transitions):
            return snap
        return dataclasses.replace(
            snap,
            env_steps=snap.env_steps + self.env_steps,
            transitions=snap.transitions + self.transitions,
            curve=self._shift(snap.curve),
            full=self._shift(snap.full),
        )

    def _shift(self, point: EvalPoint | None) -> EvalPoint | None:
        if point is None or point.version <= self.scored_through:
            return point
        return dataclasses.replace(point, env_steps=point.env_steps + self.env_steps)


class RunHistory:
    """The lives of one run directory (lives.jsonl: a "start" line per life, an "end" line per
    life that wrote its summary) and what they reached (progress.jsonl's lines, by `life`)."""

    def __init__(self, run_dir: pathlib.Path, events: list[dict], progress: list[dict], buffer_kept: bool) -> None:
        self.path = pathlib.Path(run_dir) / LIVES_FILE
        self.events = events
        self.progress = progress
        starts = [e for e in events if e.get("event") == "start"]
        if not starts and progress:  # a run directory written before lives.jsonl: one earlier life
            starts = [{"life": 0, "started_unix": None}]
        self.earlier = starts
        self.life = len(starts)
        self.started_unix = time.time()
        reached = progress[-1] if progress else {}
        wall = float(reached.get("wall_sec", 0.0))
        steps, rows = int(reached.get("env_steps", 0)), int(reached.get("transitions", 0))
        self.buffer_kept = buffer_kept  # this life's buffer holds the earlier lives' data
        scored = max((int(r.get("version", -1)) for r in read_jsonl(self.path.parent / "evals.jsonl")), default=-1)
        self.carried = Carried(wall) if buffer_kept else Carried(wall, steps, rows, scored)
        self._ended: str | None = None  # this life's end as lives.jsonl records it

    @classmethod
    def begin(cls, run_dir: pathlib.Path, buffer_kept: bool) -> RunHistory:
        """Read the run directory's earlier lives and record this one's start."""
        run_dir = pathlib.Path(run_dir)
        history = cls(run_dir, read_jsonl(run_dir / LIVES_FILE), read_jsonl(run_dir / "progress.jsonl"), buffer_kept)
        history._append({"event": "start", "started_unix": round(history.started_unix, 3)})
        return history

    @property
    def first_started_unix(self) -> float:
        """When the run's first life started (this one's start where no earlier one says)."""
        first = self.earlier[0].get("started_unix") if self.earlier else None
        return float(first) if first is not None else self.started_unix

    def lives(self, ended: str, last: Snapshot | None) -> list[dict[str, Any]]:
        """Every life: when it started, how it ended (its stop reason, or KILLED), and the run's
        wall-clock, env steps and version when it ended; `ended` and `last` are this life's.
        Records this life's end in lives.jsonl (once per reason)."""
        reasons = {int(e["life"]): e.get("reason", "") for e in self.events if e.get("event") == "end"}
        rows, before = [], 0.0
        for life, start in enumerate(self.earlier):
            final = [r for r in self.progress if int(r.get("life", 0)) == life][-1:] or [{}]
            at_end = float(final[0].get("wall_sec", before))
            rows.append(_life(life, start.get("started_unix"), reasons.get(life, KILLED), at_end - before, final[0]))
            before = at_end
        now = {"wall_sec": last.wall_sec, "env_steps": last.env_steps, "version": last.version} if last else {}
        wall = (last.wall_sec if last else before) - before
        rows.append(_life(self.life, round(self.started_unix, 3), ended, wall, now))
        if ended != self._ended:  # a summary written again (completed after a first, quick one) ends it once
            self._append({"event": "end", "reason": ended})
            self._ended = ended
        return rows

    def _append(self, event: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"life": self.life, **event}) + "\n")


def _life(life: int, started_unix: float | None, ended: str, wall_sec: float, at_end: dict) -> dict[str, Any]:
    return {
        "life": life,
        "started_unix": started_unix,
        "ended": ended,
        "wall_sec": round(max(wall_sec, 0.0), 3),
        "env_steps_at_end": int(at_end.get("env_steps", 0)),
        "version_at_end": int(at_end.get("version", 0)),
    }
