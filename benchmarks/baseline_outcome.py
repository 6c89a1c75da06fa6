"""What a single-process baseline run produced: its evaluations and its outcome.

outcome = Outcome(seed=0, target=0.9)
outcome.evals.append(EvalPoint(env_steps=500, wall_sec=12.0, success=0.1, episodes=10, kind="curve"))
train_updates_per_sec(outcome)     # gradient steps per second of training, evaluation excluded
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EvalPoint:
    env_steps: int
    wall_sec: float
    success: float
    episodes: int
    gradient_steps: int = 0
    kind: str = "full"  # as fleetrl's EvalReport.kind: "curve" (the first curve episodes) or "full"


@dataclass
class Outcome:
    seed: int
    target: float
    algo: str = "sb3"
    reached: bool = False
    env_steps_to_target: int | None = None
    wall_sec_to_target: float | None = None
    eval_sec_total: float = 0.0
    stop_reason: str = ""
    env_steps: int = 0
    wall_sec: float = 0.0
    gradient_steps: int = 0
    final_success: float | None = None  # the last policy over --final-episodes, never cut short
    final_episodes: int = 0
    train_start_wall_sec: float | None = None  # just before the first gradient step
    eval_sec_before_train: float = 0.0
    evals: list[EvalPoint] = field(default_factory=list)


def train_updates_per_sec(outcome: Outcome) -> float:
    """Gradient steps per second from the first update to the end, evaluation time excluded."""
    if outcome.train_start_wall_sec is None:
        return 0.0
    eval_sec = outcome.eval_sec_total - outcome.eval_sec_before_train
    train_sec = outcome.wall_sec - outcome.train_start_wall_sec - eval_sec
    return outcome.gradient_steps / train_sec if train_sec > 0 else 0.0
