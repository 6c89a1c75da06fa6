"""What went wrong in a Fetch episode, read from its recorded states (`fleetrl evaluate --why`).

    trace = record_episode(env, probe, policy, seed=1_000_000)  # sim/failure_trace.py: the real env
    label = CLASSIFIERS["FetchSlide-v4"].classify(trace)         # "success", "too_soft", ...
    verdict = Verdict.of(trace, label)                           # the label, the goal, the figures behind it

Every classifier is a small pure function of an `EpisodeTrace`'s arrays (the grip site, the
object, the finger joints and robot-object contact after every step), so it is tested on
synthetic traces without MuJoCo. A failed episode gets the first class whose rule holds, in the
order of the task's `classes` (each class's `rule` says it in words); a successful one is
"success", as the evaluator scored it (the env's is_success after the last step).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

SUCCESS = "success"

SUCCESS_M = 0.05  # the Fetch envs' distance_threshold: success is the object within 5 cm of the goal
NEAR_GOAL_M = 2 * SUCCESS_M  # ending within twice the success distance: brought to the goal, stopped short of it
MOVED_M = 0.01  # an untouched object rests on the table where it started; any hit moves it further than 1 cm
LIFT_M = 0.02  # a block tipped onto an edge rises 1 cm (2.5 cm half-width x (sqrt 2 - 1)); 2 cm up it is lifted
GOAL_IN_AIR_M = 0.001  # the env puts a table goal at the object's start height exactly; air goals 0-0.45 m above it
CLOSED_GAP_M = 0.03  # the two finger joints summed: 0.048 around the 5 cm block, 0 closed on nothing, 0.1 open
NEAR_OBJECT_M = 0.05  # a closing with the grip site within one block width of the object's centre aims at it


@dataclass(frozen=True)
class StatePath:
    """The simulator's state after reset (row 0) and after every step (rows 1..T), world frame, metres."""

    grip: np.ndarray  # [T+1, 3] the grip site, between the fingertips
    obj: np.ndarray  # [T+1, 3] the object's centre
    fingers: np.ndarray  # [T+1, 2] the finger joints: each finger's travel from the centre, 0-0.05 m
    touch: np.ndarray  # [T+1] bool: a robot geom in contact with the object


@dataclass(frozen=True)
class EpisodeTrace:
    """One evaluation episode as the classifiers read it."""

    seed: int
    goal: np.ndarray  # [3] the desired goal
    table_z: float  # the object's resting height (the env's height_offset): its centre on the table
    success: bool  # the env's is_success after the last step, as the evaluator scores it
    states: StatePath


class GoalLine(NamedTuple):
    """Where the object ended: against the line from its start to the goal on the table plane,
    and above the table."""

    along_m: float  # past the goal (+) or short of it (-), along the line
    lateral_m: float  # off the line, either side
    end_height_m: float  # above its resting height; below zero it fell off the table


def final_distance(trace: EpisodeTrace) -> float:
    """The object's end to the goal: what the env's success compares with SUCCESS_M."""
    return float(np.linalg.norm(trace.states.obj[-1] - trace.goal))


def max_lift(trace: EpisodeTrace) -> float:
    """The object's highest rise above its resting height."""
    return float(trace.states.obj[:, 2].max() - trace.table_z)


def goal_height(trace: EpisodeTrace) -> float:
    """The goal's height above the object's resting height: 0 for a goal on the table."""
    return float(trace.goal[2] - trace.table_z)


def touched(trace: EpisodeTrace) -> bool:
    """The robot touched the object: a contact at some step's end, or the object moved (a brief
    contact inside a step's substeps shows only in the object's displacement)."""
    moved = np.linalg.norm(trace.states.obj - trace.states.obj[0], axis=1).max()
    return bool(trace.states.touch.any() or moved > MOVED_M)


def reached(trace: EpisodeTrace) -> bool:
    """The gripper reached the object: touched it, or brought the grip site within NEAR_OBJECT_M of it."""
    gap = np.linalg.norm(trace.states.grip - trace.states.obj, axis=1).min()
    return touched(trace) or bool(gap < NEAR_OBJECT_M)


def missed_closing(trace: EpisodeTrace) -> bool:
    """The fingers closed past the block's width (nothing between them) at a step whose grip site
    was within NEAR_OBJECT_M of the object: a grasp aimed at the object that caught nothing."""
    states = trace.states
    gap = states.fingers.sum(axis=1)
    closes = (gap[:-1] >= CLOSED_GAP_M) & (gap[1:] < CLOSED_GAP_M)
    near = np.linalg.norm(states.grip[1:] - states.obj[1:], axis=1) < NEAR_OBJECT_M
    return bool((closes & near).any())


def goal_line(trace: EpisodeTrace) -> GoalLine:
    """The object's end against the start-to-goal line (x, y only), and its height. A goal at the
    start gives no direction: all the error is then lateral."""
    start, end, goal = trace.states.obj[0, :2], trace.states.obj[-1, :2], trace.goal[:2]
    height = float(trace.states.obj[-1, 2] - trace.table_z)
    span = float(np.linalg.norm(goal - start))
    moved = end - start
    if span < 1e-9:
        return GoalLine(0.0, float(np.linalg.norm(moved)), height)
    unit = (goal - start) / span
    along = float(moved @ unit)
    lateral = float(np.linalg.norm(moved - along * unit))
    return GoalLine(along - span, lateral, height)


def _line_class(trace: EpisodeTrace, short: str, past: str) -> str:
    """off_line where the lateral error is the larger, else `short` or `past` by the along error."""
    line = goal_line(trace)
    if line.lateral_m > abs(line.along_m):
        return "off_line"
    return short if line.along_m < 0 else past


def classify_pick_and_place(trace: EpisodeTrace) -> str:
    if trace.success:
        return SUCCESS
    lifted = max_lift(trace) > LIFT_M
    if not reached(trace):
        return "never_reached"
    if not lifted and missed_closing(trace):
        return "closed_off_object"
    if not lifted and goal_height(trace) > GOAL_IN_AIR_M:
        return "pushed_not_lifted"
    if final_distance(trace) < NEAR_GOAL_M:
        return "stopped_short"
    if not lifted:
        return "missed_on_table"
    return "dropped" if goal_line(trace).end_height_m <= LIFT_M else "held_away"


def classify_push(trace: EpisodeTrace) -> str:
    if trace.success:
        return SUCCESS
    if not touched(trace):
        return "never_reached"
    return _line_class(trace, short="stopped_short", past="pushed_past")


def classify_slide(trace: EpisodeTrace) -> str:
    if trace.success:
        return SUCCESS
    if not touched(trace):
        return "never_hit"
    return _line_class(trace, short="too_soft", past="too_hard")


@dataclass(frozen=True)
class FailureClass:
    name: str
    rule: str  # what the trace showed, in one line


@dataclass(frozen=True)
class Classifier:
    classify: Callable[[EpisodeTrace], str]
    classes: tuple[FailureClass, ...]  # the table's rows, success first, then in the order the rules are tried
    goal_heights: bool = False  # the task puts goals in the air and on the table: the table splits by it


_SUCCESS = FailureClass(SUCCESS, f"the object ended within {SUCCESS_M * 100:g} cm of the goal (the env's success)")
_NEAR = f"{NEAR_GOAL_M * 100:g} cm"
_NEAR_OBJECT = f"{NEAR_OBJECT_M * 100:g} cm"
_UNTOUCHED = "no robot-object contact at any step and the object never moved"
_OFF_LINE = FailureClass("off_line", "ended further off the start-to-goal line than short of or past the goal")
# Each task's classes in the order its classifier tries them: a failure is the first whose rule holds.

PICK_AND_PLACE_CLASSES = (
    _SUCCESS,
    FailureClass("never_reached", f"never touched the object nor came within {_NEAR_OBJECT} of its centre"),
    FailureClass("closed_off_object", f"never lifted; the fingers closed on nothing within {_NEAR_OBJECT} of it"),
    FailureClass("pushed_not_lifted", f"goal in the air; the object never rose {LIFT_M * 100:g} cm off the table"),
    FailureClass("stopped_short", f"ended within {_NEAR} of the goal, outside the success distance"),
    FailureClass("missed_on_table", f"goal on the table; never lifted; ended further than {_NEAR} from the goal"),
    FailureClass("dropped", f"lifted, then back on the table further than {_NEAR} from the goal"),
    FailureClass("held_away", f"lifted and still off the table at the end, further than {_NEAR} from the goal"),
)
PUSH_CLASSES = (
    _SUCCESS,
    FailureClass("never_reached", _UNTOUCHED),
    _OFF_LINE,
    FailureClass("stopped_short", "ended short of the goal along the start-to-goal line"),
    FailureClass("pushed_past", "ended past the goal along the start-to-goal line"),
)
SLIDE_CLASSES = (
    _SUCCESS,
    FailureClass("never_hit", _UNTOUCHED.replace("object", "puck")),
    _OFF_LINE,
    FailureClass("too_soft", "the puck stopped short of the goal along the start-to-goal line"),
    FailureClass("too_hard", "the puck went past the goal along the start-to-goal line"),
)

CLASSIFIERS: Mapping[str, Classifier] = MappingProxyType(
    {
        "FetchPush-v4": Classifier(classify_push, PUSH_CLASSES),
        "FetchPickAndPlace-v4": Classifier(classify_pick_and_place, PICK_AND_PLACE_CLASSES, goal_heights=True),
        "FetchSlide-v4": Classifier(classify_slide, SLIDE_CLASSES),
    }
)
"""The tasks `--why` classifies, by registry name."""


@dataclass(frozen=True)
class Verdict:
    """One episode's class, with the goal and the figures its rule read (metres)."""

    seed: int
    label: str  # SUCCESS or a failure class of the task
    goal: tuple[float, ...]  # x, y, z
    object_start: tuple[float, ...]  # x, y, z after reset
    goal_height_m: float  # above the table; 0 for a table goal
    final_distance_m: float
    max_lift_m: float
    line: GoalLine

    @property
    def goal_in_air(self) -> bool:
        return self.goal_height_m > GOAL_IN_AIR_M

    @classmethod
    def of(cls, trace: EpisodeTrace, label: str) -> Verdict:
        return cls(
            seed=trace.seed,
            label=label,
            goal=tuple(round(float(v), 4) for v in trace.goal),
            object_start=tuple(round(float(v), 4) for v in trace.states.obj[0]),
            goal_height_m=round(goal_height(trace), 4),
            final_distance_m=round(final_distance(trace), 4),
            max_lift_m=round(max_lift(trace), 4),
            line=GoalLine(*(round(v, 4) for v in goal_line(trace))),
        )

    def to_dict(self) -> dict[str, object]:
        """The JSON row of `fleetrl evaluate --why`: every field, the goal line's two errors by name."""
        row: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "line"}
        return row | {"goal_in_air": self.goal_in_air, **self.line._asdict()}
