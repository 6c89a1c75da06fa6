"""Live progress of a run: a rich table on a terminal, a log line otherwise, TensorBoard always.

Reads only the services' Stats calls, so it watches a local or a multi-host fleet alike.
"""

from __future__ import annotations

import pathlib
import time
from dataclasses import dataclass

import grpc
from rich.console import Console
from rich.live import Live
from rich.table import Table

from fleetrl.config import RunConfig
from fleetrl.tb import ScalarWriter

LOG_EVERY_SEC = 5.0  # when not on a terminal


@dataclass(frozen=True)
class Snapshot:
    wall_sec: float
    env_steps: int
    transitions: int
    version: int
    eval_version: int
    eval_success: float
    eval_env_steps: int
    eval_episodes: int
    restarts: int

    @classmethod
    def take(cls, ingest, agg, wall_sec: float, restarts: int) -> Snapshot | None:
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
            eval_version=ag.last_eval.version,
            eval_success=ag.last_eval.success_rate,
            eval_env_steps=ag.last_eval.env_steps,
            eval_episodes=ag.last_eval.episodes,
            restarts=restarts,
        )


class Progress:
    def __init__(self, config: RunConfig, run_dir: pathlib.Path, started_at: float) -> None:
        self.config = config
        self.console = Console(stderr=True)
        self.writer = ScalarWriter(run_dir / "tb" / "fleet")
        self.last: Snapshot | None = None
        self.target: Snapshot | None = None
        self.best_success = 0.0
        self._prev: Snapshot | None = None
        self._rates = (0.0, 0.0, 0.0)
        self._last_log = 0.0
        self._seen_eval = (-1, -1)
        self._live: Live | None = None
        if self.console.is_terminal:
            self._live = Live(self._table(), console=self.console, refresh_per_second=4, transient=False)
            self._live.start()

    @property
    def reached_target(self) -> bool:
        return self.target is not None

    def note(self, text: str) -> None:
        self.console.log(text)

    def update(self, snap: Snapshot) -> None:
        prev = self._prev
        if prev is not None and snap.wall_sec - prev.wall_sec >= 1.0:
            dt = snap.wall_sec - prev.wall_sec
            self._rates = (
                (snap.env_steps - prev.env_steps) / dt,
                (snap.transitions - prev.transitions) / dt,
                (snap.version - prev.version) / dt,
            )
            self._prev = snap
        elif prev is None:
            self._prev = snap
        self.last = snap
        self._record_eval(snap)
        step = snap.env_steps
        self.writer.add_scalar("fleet/version", snap.version, step)
        self.writer.add_scalar("fleet/transitions_per_sec", self._rates[1], step)
        self.writer.add_scalar("fleet/updates_per_sec", self._rates[2], step)
        if self._live is not None:
            self._live.update(self._table())
        elif time.monotonic() - self._last_log >= LOG_EVERY_SEC:
            self._last_log = time.monotonic()
            self.console.log(self._line())

    def _record_eval(self, snap: Snapshot) -> None:
        key = (snap.eval_version, snap.eval_episodes)
        if snap.eval_episodes == 0 or key == self._seen_eval:
            return
        self._seen_eval = key
        self.best_success = max(self.best_success, snap.eval_success)
        self.writer.add_scalar("eval/success_rate", snap.eval_success, snap.eval_env_steps)
        self.console.log(
            f"eval v{snap.eval_version}: success {snap.eval_success:.2f} at {snap.eval_env_steps} env steps"
        )
        complete = snap.eval_episodes >= self.config.eval.episodes  # early-stopped scores never count
        if self.target is None and complete and snap.eval_success >= self.config.target_success:
            self.target = snap

    def _line(self) -> str:
        s = self.last
        assert s is not None
        env_rate, tr_rate, upd_rate = self._rates
        return (
            f"{s.wall_sec:6.1f}s env_steps {s.env_steps} ({env_rate:.0f}/s) transitions {s.transitions} "
            f"({tr_rate:.0f}/s) version {s.version} ({upd_rate:.1f}/s) "
            f"eval {s.eval_success:.2f}@v{s.eval_version} restarts {s.restarts}"
        )

    def _table(self) -> Table:
        table = Table(title=f"fleetrl {self.config.sim.task}  ->  {self.config.run_dir}")
        for col in ("wall s", "env steps", "env steps/s", "transitions/s", "version", "updates/s", "eval success"):
            table.add_column(col, justify="right")
        s = self.last
        if s is not None:
            env_rate, tr_rate, upd_rate = self._rates
            table.add_row(
                f"{s.wall_sec:.1f}",
                str(s.env_steps),
                f"{env_rate:.0f}",
                f"{tr_rate:.0f}",
                str(s.version),
                f"{upd_rate:.1f}",
                f"{s.eval_success:.2f} @ v{s.eval_version}",
            )
        return table

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
        self.writer.close()
