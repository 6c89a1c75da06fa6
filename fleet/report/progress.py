"""Live progress of a run: a rich table on a terminal, a log line otherwise, TensorBoard and
`progress.jsonl` always.

Reads only the services' Stats calls, so it watches a local or a multi-host fleet alike. The
learning curve has two lines: evaluation success on a fixed budget of episodes ("curve"
scores, never cut short) and training success over the last 100 episodes (from the buffer).
Only a complete "full" score of eval.episodes can reach the target.
"""

from __future__ import annotations

import collections
import json
import pathlib
import time
from dataclasses import asdict, dataclass

import grpc
from rich.console import Console
from rich.live import Live
from rich.table import Table

from foundation.config import RunConfig
from foundation.proto import fleetrl_pb2 as pb
from foundation.tb import ScalarWriter

LOG_EVERY_SEC = 5.0  # when not on a terminal; also the progress.jsonl interval
# Rates are over the last RATE_WINDOW_SEC: the ingest service counts env steps per acked push and
# flow control holds pushes back for seconds at a time, so a 1 s window read "0/s" mid-run.
RATE_WINDOW_SEC = 30.0


@dataclass(frozen=True)
class EvalPoint:
    version: int
    success: float
    env_steps: int
    episodes: int
    tasks: tuple[tuple[str, float], ...] = ()  # a multi-task run: (task, success), success the mean

    @classmethod
    def of(cls, report: pb.EvalReport) -> EvalPoint | None:
        if report.episodes == 0:
            return None
        tasks = tuple(sorted(report.task_success.items()))
        return cls(report.version, report.success_rate, report.env_steps, report.episodes, tasks)


@dataclass(frozen=True)
class Snapshot:
    wall_sec: float
    env_steps: int
    transitions: int
    version: int
    curve: EvalPoint | None  # newest fixed-budget score
    full: EvalPoint | None  # newest full score (may have stopped early: see episodes)
    train_success: float  # last 100 training episodes
    train_episodes: int
    restarts: int
    rejected_by_learner: tuple[tuple[str, int], ...] = ()  # learners whose pushes were refused
    env_steps_by_task: tuple[tuple[int, int], ...] = ()  # registry task id -> env steps acked
    demo_episodes: int = 0  # expert demonstrations stored (sampler.demo_episodes), every sampler's
    roles: tuple[int, int] = (0, 0)  # (running now, started): processes the launcher watches

    @classmethod
    def take(cls, ingest, agg, wall_sec: float, restarts: int, roles: tuple[int, int] = (0, 0)) -> Snapshot | None:
        """Poll both services once; None while either is unreachable (it may be restarting)."""
        try:
            buf = ingest.stats()
            ag = agg.stats()
        except grpc.RpcError:
            return None
        return cls(
            wall_sec=wall_sec,
            env_steps=buf.env_steps,
            transitions=buf.head,
            version=ag.version,
            curve=EvalPoint.of(ag.last_curve),
            full=EvalPoint.of(ag.last_full),
            train_success=buf.train_success,
            train_episodes=buf.episodes,
            restarts=restarts,
            rejected_by_learner=tuple(sorted(ag.rejected_by_learner.items())),
            env_steps_by_task=tuple(sorted(buf.env_steps_by_task.items())),
            demo_episodes=sum(buf.demo_episodes_by_sampler.values()),
            roles=roles,
        )


@dataclass(frozen=True)
class Rates:
    env_steps_per_sec: float = 0.0
    transitions_per_sec: float = 0.0
    updates_per_sec: float = 0.0


class Progress:
    def __init__(self, config: RunConfig, run_dir: pathlib.Path, started_at: float, life: int | None = None) -> None:
        """`life`: which start of the run this is (fleet/report/lives.py), named on every
        progress.jsonl line; a resumed run's best scores so far come from its evals.jsonl."""
        self.config = config
        self.life = life
        self.console = Console(stderr=True)
        self.writer = ScalarWriter(run_dir / "tb" / "fleet")
        self._jsonl = open(run_dir / "progress.jsonl", "a")  # noqa: SIM115 - closed in close()
        self.last: Snapshot | None = None
        self.first: Snapshot | None = None  # the first snapshot: a resumed run's versions start there
        self.target: Snapshot | None = None
        self.best_success = 0.0  # best curve or complete full score
        self.best_task_success: dict[str, float] = {}  # a multi-task run: the same, per task
        self.last_task_success: dict[str, float] = {}  # a multi-task run: the newest curve score
        self.rates = Rates()
        self._window: collections.deque[Snapshot] = collections.deque()  # the last RATE_WINDOW_SEC of snapshots
        self._last_log = -LOG_EVERY_SEC
        self._seen: dict[str, EvalPoint | None] = {"curve": None, "full": None}
        self._rejected: dict[str, int] = {}  # learner -> rejections last reported
        self._live: Live | None = None
        if life:
            for row in read_jsonl(run_dir / "evals.jsonl"):
                self._count_score(row.get("kind", ""), float(row.get("success_rate", 0.0)),
                                  int(row.get("episodes", 0)), dict(row.get("task_success") or {}))  # fmt: skip
        if self.console.is_terminal:
            self._live = Live(self._table(), console=self.console, refresh_per_second=4, transient=False)
            self._live.start()

    @property
    def reached_target(self) -> bool:
        return self.target is not None

    def _rates(self, snap: Snapshot) -> Rates:
        """Each count's rise over the window's oldest snapshot (at least 1 s old) per second."""
        window = self._window
        window.append(snap)
        while len(window) > 2 and snap.wall_sec - window[1].wall_sec >= RATE_WINDOW_SEC:
            window.popleft()
        oldest = window[0]
        dt = snap.wall_sec - oldest.wall_sec
        if dt < 1.0:
            return self.rates
        return Rates(
            (snap.env_steps - oldest.env_steps) / dt,
            (snap.transitions - oldest.transitions) / dt,
            (snap.version - oldest.version) / dt,
        )

    def note(self, text: str) -> None:
        self.console.log(text)

    def update(self, snap: Snapshot) -> None:
        self.rates = self._rates(snap)
        self.last = snap
        if self.first is None:
            self.first = snap
        self._record_evals(snap)
        self._record_rejections(snap)
        step = snap.env_steps
        self.writer.add_scalar("fleet/version", snap.version, step)
        self.writer.add_scalar("fleet/transitions_per_sec", self.rates.transitions_per_sec, step)
        self.writer.add_scalar("fleet/updates_per_sec", self.rates.updates_per_sec, step)
        if snap.train_episodes:
            self.writer.add_scalar("train/success_last_100", snap.train_success, step)
        if time.monotonic() - self._last_log >= LOG_EVERY_SEC:
            self._last_log = time.monotonic()
            self._write_jsonl(snap)
            if self._live is None:
                self.console.log(self._line())
        if self._live is not None:
            self._live.update(self._table())

    def _record_evals(self, snap: Snapshot) -> None:
        for kind, point in (("curve", snap.curve), ("full", snap.full)):
            if point is None or point == self._seen[kind]:
                continue
            self._seen[kind] = point
            complete = self._count_score(kind, point.success, point.episodes, dict(point.tasks))
            self.writer.add_scalar(f"eval/{kind}_success", point.success, point.env_steps)
            for task, rate in point.tasks:
                self.writer.add_scalar(f"eval/{kind}_success/{task}", rate, point.env_steps)
            per_task = "".join(f", {task} {rate:.2f}" for task, rate in point.tasks)
            self.console.log(
                f"eval v{point.version}: {kind} success {point.success:.2f}{per_task} over {point.episodes} "
                f"episodes{' per task' if point.tasks else ''} at {point.env_steps} env steps"
            )
            if kind == "full" and complete and self.target is None and point.success >= self.config.target_success:
                self.target = snap

    def _count_score(self, kind: str, success: float, episodes: int, tasks: dict[str, float]) -> bool:
        """Count one score in the best (a curve score, or a complete full score: an early-stopped
        one never counts) and the last per-task curve; returns whether a full score is complete."""
        complete = episodes >= self.config.eval.episodes
        if kind == "curve" or (kind == "full" and complete):
            self.best_success = max(self.best_success, success)
            for task, rate in tasks.items():
                self.best_task_success[task] = max(self.best_task_success.get(task, 0.0), rate)
        if kind == "curve" and tasks:
            self.last_task_success = dict(tasks)
        return complete

    def _record_rejections(self, snap: Snapshot) -> None:
        """Name a learner as soon as the aggregator refuses its pushes, and again as they mount."""
        for learner, count in snap.rejected_by_learner:
            seen = self._rejected.get(learner, 0)
            if count > seen and (seen == 0 or count >= 2 * seen):
                self.console.log(
                    f"{learner}: {count} gradient pushes rejected as invalid by the aggregator (see its log)"
                )
                self._rejected[learner] = count

    def _write_jsonl(self, snap: Snapshot) -> None:
        row = {
            "wall_sec": round(snap.wall_sec, 3),
            "env_steps": snap.env_steps,
            "transitions": snap.transitions,
            "version": snap.version,
            **{k: round(v, 3) for k, v in asdict(self.rates).items()},
            "eval_success": snap.curve.success if snap.curve else None,
            **({"eval_task_success": dict(snap.curve.tasks)} if snap.curve and snap.curve.tasks else {}),
            "eval_version": snap.curve.version if snap.curve else None,
            "train_success": snap.train_success if snap.train_episodes else None,
            **({"demo_episodes": snap.demo_episodes} if snap.demo_episodes else {}),
            "restarts": snap.restarts,
            **({"life": self.life} if self.life is not None else {}),
        }
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()

    def goal(self) -> str:
        """What ends the run: 'target 0.90 over 50 episodes, cap 600 s or 4000 env steps'."""
        c = self.config
        cap = f"{c.max_wall_sec:.0f} s" + (f" or {c.max_env_steps} env steps" if c.max_env_steps else "")
        return f"target {c.target_success:.2f} over {c.eval.episodes} episodes, cap {cap}"

    def _line(self) -> str:
        s = self.last
        assert s is not None
        r = self.rates
        return (
            f"{s.wall_sec:6.1f}s env_steps {s.env_steps} ({r.env_steps_per_sec:.0f}/s) transitions {s.transitions} "
            f"({r.transitions_per_sec:.0f}/s) version {s.version} ({r.updates_per_sec:.1f}/s) "
            f"eval {_eval_text(s.curve)} train {s.train_success:.2f} "
            + (f"demonstrations {s.demo_episodes} " if s.demo_episodes else "")
            + f"roles {s.roles[0]}/{s.roles[1]} "
            f"restarts {s.restarts}"
            + "".join(f" {name} rejected {n}" for name, n in s.rejected_by_learner)
            + f" | {self.goal()}"
        )

    def _table(self) -> Table:
        table = Table(title=f"fleetrl {self.config.sim.task}  ->  {self.config.run_dir}", caption=self.goal())
        columns = (
            "wall s",
            "env steps",
            "env steps/s",
            "version",
            "updates/s",
            "eval success",
            "train success",
            "roles running",
            "rejected pushes",
        )
        for col in columns:
            table.add_column(col, justify="right")
        s = self.last
        if s is not None:
            r = self.rates
            table.add_row(
                f"{s.wall_sec:.1f}",
                str(s.env_steps),
                f"{r.env_steps_per_sec:.0f}",
                str(s.version),
                f"{r.updates_per_sec:.1f}",
                _eval_text(s.curve),
                f"{s.train_success:.2f} (last 100)" if s.train_episodes else "-",
                f"{s.roles[0]}/{s.roles[1]}",
                ", ".join(f"{name} {n}" for name, n in s.rejected_by_learner) or "-",
            )
        return table

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
        if self.last is not None:
            self._write_jsonl(self.last)
        self._jsonl.close()
        self.writer.close()


def read_jsonl(path: pathlib.Path) -> list[dict]:
    """A JSONL file's objects; a missing file is empty, a torn line (a process killed while
    writing it) is left out."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _eval_text(point: EvalPoint | None) -> str:
    return "-" if point is None else f"{point.success:.2f} @ v{point.version}"
