"""Do two controllers of one policy disagree because of the policy's export or because of the task?

    report = agreement("runs/slide", hz=120, delay_ms=10, episodes=200, int8=True)   # agreement_run.py
    print(report.summary())

Several controllers of one policy (the float graph, the torch policy, the torch policy run again,
the torch policy with every action moved by a fixed `epsilon`, the int8 graph) drive the same
seeded episodes, and each pair is compared episode by episode:

- flips: episodes that one controller wins and the other loses;
- the difference in success rate with its paired standard error: per episode d = a - b (each 0 or
  1), SE = sd(d) / sqrt(n), which the shared episodes make far smaller than two independent
  rates' SE;
- the largest action gap on the ticks where both controllers read bit-identical inputs (the first
  tick always, the first delay + 1 ticks with an actuation delay): the controllers' own
  disagreement, before the trajectories part;
- the tick at which the two trajectories' achieved goals (the object's position; the hand's for a
  reach task) first differ by more than `divergence_threshold`, per episode, and its median.

Torch against torch run again must agree exactly (the drive loop is deterministic); torch against
torch+epsilon is the task's chaos floor: how many episodes a perturbation of the size of float
rounding flips. A pair that flips about as many episodes as that floor disagrees by chaos, not
by an export error; the int8 graph's difference from the float graph is read against that floor.
This module holds the figures, which are pure; agreement_run.py runs the controllers.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from foundation.config import ConfigError


@dataclass(frozen=True)
class EpisodeTrace:
    """One controller's episode, tick by tick."""

    success: bool
    inputs: np.ndarray  # [ticks, input_dim]: the policy's input each tick
    actions: np.ndarray  # [ticks, act_dim]: its output each tick (before any delay)
    achieved: np.ndarray  # [ticks, goal_dim]: the achieved goal after each tick's step


def first_divergence(a: np.ndarray, b: np.ndarray, threshold: float) -> int | None:
    """The first tick at which rows of `a` and `b` differ by more than `threshold` in any component
    (None: never). Trajectories of different lengths part where the shorter one ends."""
    if not (math.isfinite(threshold) and threshold >= 0):
        raise ConfigError(f"divergence threshold ({threshold}) must be finite and >= 0", field="divergence_threshold")
    common = min(len(a), len(b))
    gaps = np.abs(np.asarray(a[:common], np.float64) - np.asarray(b[:common], np.float64))
    per_tick = gaps.reshape(common, -1).max(axis=1, initial=0.0) if common else np.zeros(0)
    apart = np.flatnonzero(per_tick > threshold)
    if len(apart):
        return int(apart[0])
    return None if len(a) == len(b) else common


def same_input_action_gap(a: EpisodeTrace, b: EpisodeTrace) -> float:
    """The largest |action a - action b| over the leading ticks whose inputs are bit-identical in
    both (0.0 when even the first tick's inputs differ)."""
    common = min(len(a.inputs), len(b.inputs))
    same = np.all(a.inputs[:common] == b.inputs[:common], axis=1)
    lead = common if same.all() else int(np.argmin(same))
    if lead == 0:
        return 0.0
    gap = np.asarray(a.actions[:lead], np.float64) - np.asarray(b.actions[:lead], np.float64)
    return float(np.abs(gap).max())


def paired_se(a: Sequence[bool], b: Sequence[bool]) -> float | None:
    """The standard error of mean(a) - mean(b) over paired episodes: sd(a - b) / sqrt(n), with the
    sample sd (None under 2 episodes: no spread to estimate)."""
    if len(a) != len(b):
        raise ValueError(f"paired outcomes need equal lengths: {len(a)} and {len(b)} episodes")
    if len(a) < 2:
        return None
    d = [int(x) - int(y) for x, y in zip(a, b, strict=True)]
    return statistics.stdev(d) / math.sqrt(len(d))


def median_tick(ticks: Sequence[int | None]) -> float | None:
    """The median divergence tick, an episode that never parts counting as later than any tick
    (None when at least half never part, or there are no episodes)."""
    if not ticks:
        return None
    median = statistics.median([math.inf if t is None else float(t) for t in ticks])
    return None if math.isinf(median) else median


@dataclass(frozen=True)
class PairFigures:
    """Controller `a` against controller `b` on the same episodes."""

    a: str
    b: str
    a_success: tuple[bool, ...]
    b_success: tuple[bool, ...]
    first_action_gap: float  # max |a - b| while both read identical inputs (same_input_action_gap)
    divergence_ticks: tuple[int | None, ...]  # per episode (first_divergence of the achieved goals)

    @property
    def episodes(self) -> int:
        return len(self.a_success)

    @property
    def a_only(self) -> int:
        """Episodes `a` wins and `b` loses."""
        return sum(x and not y for x, y in zip(self.a_success, self.b_success, strict=True))

    @property
    def b_only(self) -> int:
        return sum(y and not x for x, y in zip(self.a_success, self.b_success, strict=True))

    @property
    def flips(self) -> int:
        return self.a_only + self.b_only

    @property
    def rate_difference(self) -> float:
        """Success rate of `a` minus that of `b`."""
        return (self.a_only - self.b_only) / self.episodes if self.episodes else 0.0

    @property
    def paired_se(self) -> float | None:
        return paired_se(self.a_success, self.b_success)

    @property
    def diverged(self) -> int:
        """Episodes whose trajectories part at all."""
        return sum(t is not None for t in self.divergence_ticks)

    @property
    def median_divergence_tick(self) -> float | None:
        return median_tick(self.divergence_ticks)

    def to_dict(self) -> dict[str, object]:
        derived = ("flips", "a_only", "b_only", "rate_difference", "paired_se", "diverged", "median_divergence_tick")
        return dataclasses.asdict(self) | {name: getattr(self, name) for name in derived}


def compare(
    a: str, b: str, traces_a: Sequence[EpisodeTrace], traces_b: Sequence[EpisodeTrace], threshold: float
) -> PairFigures:
    """The figures of controller `a` against `b` from their traces of the same episodes, in order."""
    if len(traces_a) != len(traces_b):
        raise ValueError(f"{a} ran {len(traces_a)} episodes and {b} {len(traces_b)}: a pair needs the same episodes")
    pairs = list(zip(traces_a, traces_b, strict=True))
    return PairFigures(
        a,
        b,
        tuple(x.success for x in traces_a),
        tuple(y.success for y in traces_b),
        max((same_input_action_gap(x, y) for x, y in pairs), default=0.0),
        tuple(first_divergence(x.achieved, y.achieved, threshold) for x, y in pairs),
    )


ONNX, TORCH, TORCH_AGAIN, TORCH_EPS, INT8 = "onnx", "torch", "torch-again", "torch+eps", "int8"
# (a, b) in the order the report lists them: the export, the chaos floor, the determinism check, int8.
PAIRS = ((ONNX, TORCH), (TORCH_EPS, TORCH), (TORCH_AGAIN, TORCH), (INT8, ONNX))


@dataclass(frozen=True)
class AgreementSetting:
    """What every controller of one agreement check shares."""

    task: str
    hz: float
    delay_ticks: int
    episodes: int
    seed: int
    randomized: bool  # domain randomization on (the run's ranges); False: the nominal task
    epsilon: float  # torch+eps: every action moved by epsilon times a fixed sign per component
    divergence_threshold: float  # achieved-goal distance (per component) at which two trajectories part


@dataclass(frozen=True)
class AgreementReport:
    setting: AgreementSetting
    outcomes: dict[str, tuple[bool, ...]]  # controller -> success per episode
    pairs: list[PairFigures]

    def pair(self, a: str, b: str) -> PairFigures | None:
        return next((p for p in self.pairs if (p.a, p.b) == (a, b)), None)

    @property
    def deterministic(self) -> bool | None:
        """Torch run again equals torch: no flip, no parting, no action gap (None: not run)."""
        again = self.pair(TORCH_AGAIN, TORCH)
        if again is None:
            return None
        return again.flips == 0 and again.diverged == 0 and again.first_action_gap == 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "setting": dataclasses.asdict(self.setting),
            "outcomes": {name: list(won) for name, won in self.outcomes.items()},
            "pairs": [p.to_dict() for p in self.pairs],
            "deterministic": self.deterministic,
        }

    def summary(self) -> str:
        s = self.setting
        world = "domain randomization on" if s.randomized else "the nominal task"
        lines = [
            f"agreement {s.task} at {s.hz:g} Hz, {s.delay_ticks} tick(s) of delay, {world}, {s.episodes} episodes "
            f"(seed {s.seed}); torch+eps moves every action by {s.epsilon:g}; trajectories part at "
            f"{s.divergence_threshold:g} in the achieved goal",
            "success    " + ", ".join(f"{name} {sum(won)}/{len(won)}" for name, won in self.outcomes.items()),
        ]
        for p in self.pairs:
            se = "-" if p.paired_se is None else f"{p.paired_se:.3f}"
            tick = "never" if p.median_divergence_tick is None else f"{p.median_divergence_tick:g}"
            lines.append(
                f"{p.a + ' vs ' + p.b:<22} flips {p.flips:>3} ({p.a_only} {p.a} only, {p.b_only} {p.b} only), "
                f"difference {p.rate_difference:+.3f} +- {se}, first action gap {p.first_action_gap:.2g}, "
                f"parted in {p.diverged}/{p.episodes}, median tick {tick}"
            )
        if self.deterministic is False:
            lines.append("WARNING    torch run again differs from torch: the drive is not deterministic")
        return "\n".join(lines)
