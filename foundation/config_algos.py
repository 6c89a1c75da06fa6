"""Config of the learning algorithms: one frozen section per algorithm, under `learner.<name>`.

`learner.algo` names the algorithm a run trains with; `LearnerConfig.algorithm()` is its section.
Each section says what the networks need from its algorithm (`critics()`: outputs per critic,
batch renormalization), so the policy spec and the launch checks never branch on the name. The
learner's losses for each name are in learner/algos/ (its registry holds the same names).

    learner = LearnerConfig(algo="tqc")
    learner.algorithm()            # TQCConfig(quantiles=25, drop=2)
    learner.algorithm().critics()  # Critics(outputs=25, renorm=False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from foundation.config_base import Check, config_field

ALGOS = ("sac", "tqc", "crossq")  # learner.algo: the sections of LearnerConfig, in this order


class Critics(NamedTuple):
    """What an algorithm asks of the critics' networks (foundation.policy.ModelSpec)."""

    outputs: int  # values each critic predicts: 1 (a Q value) or TQC's quantiles
    renorm: bool  # batch renormalization on the critics' input and hidden layers (CrossQ; dense only)


class AlgorithmConfig(Protocol):
    """An algorithm's section: its critics and the checks on its own fields."""

    def critics(self) -> Critics: ...

    def checks(self) -> list[Check]: ...


@dataclass(frozen=True)
class SACConfig:
    """learner.sac: Soft Actor-Critic (Haarnoja et al. 2018). Its settings are the learner's own
    (gamma, n_step, target_entropy), which tqc and crossq share: no field of its own."""

    def critics(self) -> Critics:
        return Critics(outputs=1, renorm=False)

    def checks(self) -> list[Check]:
        return []


@dataclass(frozen=True)
class TQCConfig:
    """learner.tqc: SAC with truncated quantile critics (Kuznetsov et al. 2020)."""

    quantiles: int = config_field(25, "quantiles each of the two critics predicts (sb3-contrib's 25)")
    drop: int = config_field(2, "the largest target quantiles dropped per critic (sb3-contrib's 2)")

    def critics(self) -> Critics:
        return Critics(outputs=self.quantiles, renorm=False)

    def checks(self) -> list[Check]:
        return [
            (self.quantiles >= 1, "quantiles", ">= 1"),
            (0 <= self.drop < self.quantiles, "drop", "in 0..learner.tqc.quantiles - 1"),
        ]


@dataclass(frozen=True)
class CrossQConfig:
    """learner.crossq: SAC without target networks, batch-renormalized critics (Bhatt et al. 2024)."""

    momentum: float = config_field(0.01, "weight of each batch in the critics' running renorm statistics")
    warmup: int = config_field(100_000, "updates of plain batch norm before renormalization (sbx's warmup)")

    def critics(self) -> Critics:
        return Critics(outputs=1, renorm=True)

    def checks(self) -> list[Check]:
        return [
            (0.0 < self.momentum <= 1.0, "momentum", "in (0, 1]"),
            (self.warmup >= 0, "warmup", ">= 0"),
        ]


# Flat learner fields that older run directories hold, and the section field each one is now;
# None: DDPG's action penalty, which no algorithm here reads.
_FLAT_FIELDS = {
    "tqc_quantiles": ("tqc", "quantiles"),
    "tqc_drop": ("tqc", "drop"),
    "crossq_momentum": ("crossq", "momentum"),
    "crossq_warmup": ("crossq", "warmup"),
    "action_l2": None,
}


def upgrade_algorithm_fields(run: dict[str, Any]) -> dict[str, Any]:
    """A run config's JSON object with the learner's flat algorithm fields moved into their
    sections, and DDPG's (learner.action_l2, sampler.action_noise_std) dropped, so `fleetrl
    evaluate`, `export` and `--resume` read a run directory of either form."""
    sampler, learner = run.get("sampler"), run.get("learner")
    if isinstance(sampler, dict):
        sampler.pop("action_noise_std", None)
    if isinstance(learner, dict):
        for flat, place in _FLAT_FIELDS.items():
            if flat in learner:
                value = learner.pop(flat)
                if place is not None:
                    learner.setdefault(place[0], {}).setdefault(place[1], value)
    return run
