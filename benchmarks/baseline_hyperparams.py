"""The single-process baselines' hyperparameters per task (benchmarks/sb3_baseline.py's arms).

from baseline_hyperparams import TASK_HYPERPARAMS, ZOO_TQC, SacHyperparams
hp = TASK_HYPERPARAMS.get("FetchPush-v4", SacHyperparams())   # tau 0.05, the rest the zoo's
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SacHyperparams:
    """What differs between tasks; train_freq 1, gradient_steps 1, HER 'future'/4 are fixed."""

    gamma: float = 0.95
    learning_rate: float = 1e-3
    tau: float = 0.005  # SB3's and SBX's default
    buffer_size: int = 1_000_000
    batch_size: int = 256
    ent_coef: str = "auto"


# FetchReach: the zoo's entry. Push and PickAndPlace: the SBX peer measurement's settings.
TASK_HYPERPARAMS = {
    "FetchReach-v4": SacHyperparams(),
    "FetchPush-v4": SacHyperparams(tau=0.05),
    "FetchPickAndPlace-v4": SacHyperparams(tau=0.05),
}


@dataclass(frozen=True)
class ZooTqc:
    """rl-baselines3-zoo's TQC+HER entry for a Fetch task (hyperparams/tqc.yml): HER 'future'/4,
    ent_coef auto, learning rate 1e-3, gamma 0.95, tau 0.05, buffer 1e6; train_freq 1 and
    gradient_steps 1 (SB3's defaults, which the entries keep); learning_starts is --learning-starts
    (the zoo leaves TQC's default of 100) so every arm starts after the same random steps."""

    batch_size: int
    net_arch: tuple[int, ...]
    n_critics: int = 2
    gamma: float = 0.95
    learning_rate: float = 1e-3
    tau: float = 0.05
    buffer_size: int = 1_000_000


ZOO_TQC = {
    "FetchReach-v4": ZooTqc(batch_size=256, net_arch=(64, 64), n_critics=1, tau=0.005),
    "FetchPush-v4": ZooTqc(batch_size=2048, net_arch=(512, 512, 512)),
    "FetchSlide-v4": ZooTqc(batch_size=2048, net_arch=(512, 512, 512)),
    "FetchPickAndPlace-v4": ZooTqc(batch_size=1024, net_arch=(512, 512, 512)),
}
