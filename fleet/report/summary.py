"""summary.json: what a run reached, how fast, and why it stopped; and the one stop rule.

    reason = stop_reason(config, progress, snap, wall_sec)   # None: keep going
    ...
    write_summary(config, run_dir, progress, Ending(reason, wall_sec, restarts, cpu))

`fleetrl train` (fleet/launch/local_fleet.py) and the aggregator's host of `fleetrl fleet up` (fleet/launch/winddown.py)
both decide with `stop_reason` and write with `write_summary`, so a run on one host and a fleet over
many stop on the same rule and leave the same file.
"""

from __future__ import annotations

import json
import logging
import pathlib
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fleet.report.lives import RunHistory
from fleet.report.progress import Progress, Snapshot
from fleet.report.provenance import code_provenance
from foundation.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from foundation.config import RunConfig
from foundation.policy import ModelSpec
from foundation.routing_stats import expert_routing

if TYPE_CHECKING:
    from sampler.evaluator import EvalResult

log = logging.getLogger("fleetrl.summary")
INTERRUPTED = "interrupted (Ctrl-C or SIGTERM)"


@dataclass
class Summary:
    run_dir: str
    task: str
    reached_target: bool
    target_success: float
    stop_reason: str
    wall_sec: float
    wall_sec_to_target: float | None = None
    env_steps_to_target: int | None = None
    version_to_target: int | None = None
    final_version: int = 0
    final_env_steps: int = 0
    transitions_stored: int = 0
    best_success: float = 0.0
    final_success: float | None = None  # the last checkpoint over eval.final_episodes (a run short of its target)
    final_success_episodes: int = 0
    final_success_version: int | None = None
    train_success: float | None = None  # last 100 training episodes at the end
    updates_per_sec: float = 0.0  # versions made / wall-clock seconds, of this life
    restarts: int = 0
    started_unix: float = 0.0  # epoch seconds at the run's first start (report plots count from here)
    resumes: int = 0  # starts after the first (`fleetrl train --resume`): the run's interruptions
    # Each start of the run: when, how it ended, its own wall-clock seconds and the run's env steps
    # and version when it ended (fleet/report/lives.py). wall_sec and the counts are the whole run's.
    lives: list[dict] = field(default_factory=list)
    cpu: dict = field(default_factory=dict)  # foundation.cpu.CpuMeter.report(): per role and group
    fleet_overhead_share: float | None = None  # aggregator+buffer+evaluator+redis+launcher CPU / machine
    counters: dict = field(default_factory=dict)  # each role's last heartbeat counters (heartbeats/*.json)
    checkpoints: list[str] = field(default_factory=list)
    mode: str = "async"  # or "sync": fleetrl train --mode sync (fleet/launch/sync.py)
    expert_load: dict = field(default_factory=dict)  # a MoE run: routers' newest metrics (expert_load.json)
    # A task-routed MoE run: per network, layer and task the experts chosen, overlaps, load
    # (foundation/routing_stats.py), read from the newest checkpoint.
    expert_routing: dict = field(default_factory=dict)
    expert_routing_error: str | None = None  # why expert_routing could not be read from the weights
    tasks: list[str] = field(default_factory=list)  # a multi-task run's tasks (success figures are their means)
    # A multi-task run, per task: best (curve or complete full score), last (newest curve) and
    # final (the final score) success.
    task_success: dict = field(default_factory=dict)
    task_env_steps: dict = field(default_factory=dict)  # a multi-task run: env steps acked per task
    demo_episodes: int = 0  # expert demonstrations stored in the buffer (sampler.demo_episodes per task)
    code: dict = field(
        default_factory=dict
    )  # which code ran: version, git commit, libraries (fleet/report/provenance.py)


@dataclass(frozen=True)
class Ending:
    """How a run ended, as its launcher saw it."""

    reason: str  # stop_reason's text, or INTERRUPTED
    wall_sec: float  # from the command's start, plus a resumed run's earlier lives (RunHistory)
    restarts: int = 0  # watchdog restarts
    cpu: dict = field(default_factory=dict)  # CpuMeter.report() of the roles this launcher watched
    final: tuple[int, EvalResult] | None = None  # final_score(): (version, result) of the last checkpoint


def stop_reason(config: RunConfig, progress: Progress, snap: Snapshot | None, wall_sec: float) -> str | None:
    """Why the run stops now (target reached, max_env_steps, max_wall_sec), or None to go on;
    `progress` has already taken `snap` (None: the services did not answer this time)."""
    if snap is not None:
        if progress.target is not None and progress.target.full is not None:
            full = progress.target.full
            target = config.target_success
            return f"evaluation success {full.success:.2f} over {full.episodes} episodes >= target {target}"
        if config.max_env_steps and snap.env_steps >= config.max_env_steps:
            return f"max_env_steps {config.max_env_steps} reached"
    if wall_sec >= config.max_wall_sec:
        return f"max_wall_sec {config.max_wall_sec} reached"
    return None


def final_score(config: RunConfig, run_dir: pathlib.Path, progress: Progress) -> tuple[int, EvalResult] | None:
    """(version, result) of the last checkpoint over eval.final_episodes, after the fleet
    stopped (outside the run's wall-clock): what the run reached when the target was not."""
    from sampler.evaluator import score_checkpoint  # the simulator loads only for this

    episodes = config.eval.final_episodes
    if progress.reached_target or episodes == 0:
        return None
    progress.note(f"final score: the last checkpoint over {episodes} episodes")
    try:
        final = score_checkpoint(run_dir / "checkpoints", config, episodes)
    except (CheckpointError, OSError) as err:  # no checkpoint yet (a very short run)
        progress.note(f"no final score: {err}")
        return None
    except Exception:  # the score is extra: whatever fails, the run's summary is still written
        log.exception("final score failed; summary.json is written without it")
        progress.note("no final score: it failed (see the traceback above)")
        return None
    progress.note(f"final score: version {final[0]}, success {final[1].success_rate:.2f} over {episodes} episodes")
    return final


def write_summary(
    config: RunConfig,
    run_dir: pathlib.Path,
    progress: Progress,
    run: Ending,
    host_dir: pathlib.Path | None = None,
    history: RunHistory | None = None,
) -> Summary:
    """<run_dir>/summary.json from the progress seen and how the run ended; each role's last
    heartbeat counters come from <host_dir>/heartbeats (default: the run directory's). With the
    run's `history` (fleet/report/lives.py), the summary lists its lives and records this one's end."""
    host_dir = run_dir if host_dir is None else host_dir
    summary = Summary(
        run_dir=str(run_dir),
        task=config.sim.task,
        reached_target=progress.reached_target,
        target_success=config.target_success,
        stop_reason=run.reason,
        wall_sec=run.wall_sec,
        restarts=run.restarts,
        started_unix=time.time() - run.wall_sec if history is None else history.first_started_unix,
        cpu=run.cpu,
        fleet_overhead_share=run.cpu.get("overhead_share"),
        counters=last_counters(host_dir / "heartbeats"),
        checkpoints=sorted(str(p) for p in (run_dir / "checkpoints").glob("ckpt_*.pt")),
        code=code_provenance(),
    )
    load = run_dir / "expert_load.json"
    if load.exists():  # a MoE run: beta, balancing loss and each layer's expert shares
        summary.expert_load = json.loads(load.read_text())
    try:
        summary.expert_routing = _expert_routing(run_dir / "checkpoints")
    except (CheckpointError, OSError, ValueError) as err:  # a statistic of the weights: the summary is kept
        log.warning("summary.json without expert_routing: %s", err)
        summary.expert_routing_error = str(err)
    if run.final is not None:
        summary.final_success_version, result = run.final
        summary.final_success, summary.final_success_episodes = result.success_rate, result.episodes
        for task, rate in result.task_success.items():
            summary.task_success.setdefault(task, {})["final"] = rate
    if config.sim.tasks:
        _add_tasks(summary, config, progress)
    _add_progress(summary, progress, run, history.carried.wall_sec if history is not None else 0.0)
    if history is not None:
        summary.lives = history.lives(run.reason, progress.last)
        summary.resumes = len(summary.lives) - 1
    (run_dir / "summary.json").write_text(json.dumps(asdict(summary), indent=2))
    return summary


def _add_tasks(summary: Summary, config: RunConfig, progress: Progress) -> None:
    """A multi-task run's tasks, each one's best and last evaluation success and its env steps."""
    summary.tasks = list(config.sim.tasks)
    for task, rate in progress.best_task_success.items():
        summary.task_success.setdefault(task, {})["best"] = rate
    for task, rate in progress.last_task_success.items():
        summary.task_success.setdefault(task, {})["last"] = rate
    if progress.last is not None:
        from sim.registry import get_task  # a multi-task run only: the launcher needs no sim otherwise

        summary.task_env_steps = {get_task(t).name: n for t, n in progress.last.env_steps_by_task}


def _add_progress(summary: Summary, progress: Progress, run: Ending, earlier_sec: float) -> None:
    """When the target was reached, and the last snapshot's counts and this life's rates
    (`earlier_sec`: the wall-clock of a resumed run's earlier lives, in run.wall_sec)."""
    target, last = progress.target, progress.last
    if target is not None and target.full is not None:
        summary.wall_sec_to_target = target.wall_sec
        summary.env_steps_to_target = target.full.env_steps
        summary.version_to_target = target.full.version
    if last is not None:
        summary.final_version = last.version
        summary.final_env_steps = last.env_steps
        summary.transitions_stored = last.transitions
        summary.demo_episodes = last.demo_episodes
        summary.best_success = progress.best_success
        summary.train_success = last.train_success if last.train_episodes else None
        first = progress.first.version if progress.first is not None else 0  # a resumed run starts late
        summary.updates_per_sec = round((last.version - first) / max(run.wall_sec - earlier_sec, 1e-9), 2)


def last_counters(heartbeats: pathlib.Path) -> dict:
    """{role: its last heartbeat's counters}: what each role did over the run (e.g. the
    aggregator's weights_shared against its version). A torn or missing file is left out."""
    counters = {}
    for path in sorted(heartbeats.glob("*.json")):
        try:
            counters[path.stem] = json.loads(path.read_text())["counters"]
        except (OSError, ValueError, KeyError):
            continue
    return counters


def _expert_routing(checkpoints: pathlib.Path) -> dict:
    """The newest checkpoint's task routing (routing_stats.expert_routing); {} for a dense or
    state-routed model, or no checkpoint."""
    newest = latest_checkpoint(checkpoints) if checkpoints.is_dir() else None
    if newest is None:
        return {}
    ckpt = load_checkpoint(newest)
    spec = ModelSpec.from_json(ckpt["spec"])
    if spec.kind != "moe" or spec.router != "task":
        return {}
    from sim.tasks import TaskSet  # a MoE run only: the launcher needs no sim otherwise

    names = list(TaskSet.parse(ckpt["task"]).names)
    groups = {g: np.asarray(ckpt["weights"][g], np.float32) for g in ("actor", "critic")}
    return expert_routing(spec, groups, names) | {"version": int(ckpt["version"])}
