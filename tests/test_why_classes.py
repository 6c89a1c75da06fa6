"""`fleetrl evaluate --why`'s classifiers (sim/failures.py) on synthetic traces, one row per
class and per boundary, and its table (fleet/report/why.py) on synthetic verdicts: no MuJoCo."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from fleet.report.why import WhySetting, class_table, counts, document
from sampler.why import Diagnosis
from sim.failures import (
    CLASSIFIERS,
    LIFT_M,
    SUCCESS,
    EpisodeTrace,
    StatePath,
    Verdict,
    goal_line,
)

TABLE_Z = 0.42
START = np.array([1.30, 0.75, TABLE_Z])
FAR_ABOVE = (0.0, 0.0, 0.30)  # the grip site well clear of the object (every trace's default)
OPEN, HOLDING, SHUT = 0.10, 0.048, 0.0  # the two finger joints summed: open, around the 5 cm block, on nothing


def trace(
    goal: tuple[float, float, float],
    obj: list[tuple[float, float, float]],
    grip: list[tuple[float, float, float]] | None = None,
    gap: list[float] | None = None,
    touch: list[bool] | None = None,
    success: bool = False,
) -> EpisodeTrace:
    """An episode of len(obj) rows; every position an offset from the object's start (START)."""
    rows = len(obj)
    grip = grip or [FAR_ABOVE] * rows
    gap = gap or [SHUT] * rows
    states = StatePath(
        grip=START + np.array(grip),
        obj=START + np.array(obj),
        fingers=np.repeat(np.array(gap)[:, None] / 2, 2, axis=1),
        touch=np.array(touch or [False] * rows),
    )
    return EpisodeTrace(seed=7, goal=START + np.array(goal), table_z=TABLE_Z, success=success, states=states)


STILL = [(0.0, 0.0, 0.0)] * 3
AIR_GOAL = (0.20, 0.0, 0.25)
TABLE_GOAL = (0.20, 0.0, 0.0)
AT_OBJECT = [(0.0, 0.0, 0.0)] * 3
BESIDE = [(0.045, 0.0, 0.0)] * 3  # within a block width of its centre, no finger on it
CLOSING = [OPEN, OPEN, SHUT]
HELD = [OPEN, HOLDING, HOLDING, HOLDING]
HIT = [False, True, True]
LIFTED = [(0.0, 0.0, 0.0), (0.0, 0.0, 0.10), (0.10, 0.0, 0.20)]
ALONG = [(0.0, 0.0, 0.0), (0.05, 0.0, 0.0), (0.10, 0.0, 0.011)]  # pushed, tipped onto an edge: 1.1 cm up

PICK_AND_PLACE = [
    ("a success is success", trace(TABLE_GOAL, STILL, success=True), SUCCESS),
    ("untouched, the gripper far", trace(TABLE_GOAL, STILL), "never_reached"),
    ("the fingers shut on nothing beside it", trace(AIR_GOAL, STILL, BESIDE, CLOSING), "closed_off_object"),
    ("shut beside it, goal on the table", trace(TABLE_GOAL, STILL, BESIDE, CLOSING), "closed_off_object"),
    ("shut on nothing far above it", trace(TABLE_GOAL, STILL, gap=CLOSING), "never_reached"),
    ("pushed, fingers shut from the start", trace(AIR_GOAL, ALONG, AT_OBJECT, touch=HIT), "pushed_not_lifted"),
    ("hovered over it, never closed", trace(AIR_GOAL, STILL, AT_OBJECT, [OPEN] * 3), "pushed_not_lifted"),
    ("pushed near a table goal", trace(TABLE_GOAL, [(0, 0, 0), (0.13, 0, 0)], touch=HIT[1:]), "stopped_short"),
    ("pushed wide of a table goal", trace(TABLE_GOAL, [(0, 0, 0), (0.0, 0.2, 0)], touch=HIT[1:]), "missed_on_table"),
    ("lifted to near the goal", trace(AIR_GOAL, [*LIFTED, (0.15, 0, 0.20)], gap=HELD), "stopped_short"),
    ("lifted, then back on the table", trace(AIR_GOAL, [*LIFTED, (0.10, 0, 0.0)]), "dropped"),
    ("lifted, then fell off the table", trace(AIR_GOAL, [*LIFTED, (0.10, 0, -0.40)]), "dropped"),
    ("lifted and held away from the goal", trace(AIR_GOAL, [*LIFTED, (-0.10, 0, 0.20)]), "held_away"),
    ("just over the lift line: lifted", trace(TABLE_GOAL, [(0, 0, 0), (0, 0, LIFT_M + 1e-3), (0, 0.2, 0)]), "dropped"),
]  # fmt: skip
EPISODE = {case: episode for case, episode, _ in PICK_AND_PLACE}
LABEL = {case: label for case, _, label in PICK_AND_PLACE}


@pytest.mark.parametrize("case,episode,label", PICK_AND_PLACE, ids=[row[0] for row in PICK_AND_PLACE])
def test_pick_and_place_failures_get_their_class(case, episode, label):
    assert CLASSIFIERS["FetchPickAndPlace-v4"].classify(episode) == label


PUSH_GOAL = (0.20, 0.0, 0.0)
LINE = [
    ("a success is success", trace(PUSH_GOAL, STILL, success=True), SUCCESS, SUCCESS),
    ("untouched and never moved", trace(PUSH_GOAL, STILL), "never_reached", "never_hit"),
    ("short along the line", trace(PUSH_GOAL, [(0, 0, 0), (0.10, 0.02, 0)]), "stopped_short", "too_soft"),
    ("past along the line", trace(PUSH_GOAL, [(0, 0, 0), (0.30, -0.03, 0)]), "pushed_past", "too_hard"),
    ("off the line", trace(PUSH_GOAL, [(0, 0, 0), (0.18, 0.12, 0)]), "off_line", "off_line"),
    ("touched, never moved: short", trace(PUSH_GOAL, STILL, touch=HIT), "stopped_short", "too_soft"),
    ("moved, no contact seen: touched", trace(PUSH_GOAL, [(0, 0, 0), (0.02, 0, 0)]), "stopped_short", "too_soft"),
    ("a goal at its start: all lateral", trace((0, 0, 0), [(0, 0, 0), (0.0, 0.08, 0)]), "off_line", "off_line"),
]  # fmt: skip


@pytest.mark.parametrize("case,episode,push,slide", LINE, ids=[row[0] for row in LINE])
def test_push_and_slide_failures_are_judged_against_the_start_to_goal_line(case, episode, push, slide):
    assert CLASSIFIERS["FetchPush-v4"].classify(episode) == push
    assert CLASSIFIERS["FetchSlide-v4"].classify(episode) == slide


def test_the_goal_line_measures_short_past_and_off_in_metres():
    line = goal_line(trace(PUSH_GOAL, [(0, 0, 0), (0.30, -0.03, -0.4)]))  # off the table: the line is x, y
    assert line.along_m == pytest.approx(0.10) and line.lateral_m == pytest.approx(0.03)
    assert line.end_height_m == pytest.approx(-0.4)
    line = goal_line(trace((0.0, -0.4, 0.0), [(0, 0, 0), (0.05, -0.1, 0)]))  # any direction
    assert line.along_m == pytest.approx(-0.3) and line.lateral_m == pytest.approx(0.05)


def test_every_label_a_classifier_gives_is_a_row_of_its_table():
    for task, cases in (("FetchPickAndPlace-v4", PICK_AND_PLACE), ("FetchPush-v4", LINE), ("FetchSlide-v4", LINE)):
        names = [c.name for c in CLASSIFIERS[task].classes]
        assert names[0] == SUCCESS and len(set(names)) == len(names)
        assert {CLASSIFIERS[task].classify(row[1]) for row in cases} <= set(names)
    labels = {row[2] for row in PICK_AND_PLACE}
    assert labels == {c.name for c in CLASSIFIERS["FetchPickAndPlace-v4"].classes}  # every class has a row here


def _verdicts() -> list[Verdict]:
    cases = ("a success is success", "the fingers shut on nothing beside it", "pushed, fingers shut from the start")
    return [Verdict.of(EPISODE[case], LABEL[case]) for case in (*cases, "pushed near a table goal")]


def test_a_verdict_keeps_the_goal_and_the_figures_its_rule_read():
    verdict = Verdict.of(EPISODE["pushed, fingers shut from the start"], "pushed_not_lifted")
    row = verdict.to_dict()
    assert row["goal"] == pytest.approx(tuple(START + AIR_GOAL)) and row["goal_in_air"] is True
    assert row["goal_height_m"] == pytest.approx(0.25) and row["max_lift_m"] == pytest.approx(0.011)
    assert set(row) >= {"seed", "label", "object_start", "final_distance_m", "along_m", "lateral_m", "end_height_m"}
    assert row["end_height_m"] == pytest.approx(0.011)
    assert json.loads(json.dumps(row))["label"] == "pushed_not_lifted"
    assert Verdict.of(EPISODE["untouched, the gripper far"], "never_reached").goal_in_air is False


def test_the_pick_and_place_table_splits_every_class_by_goal_height():
    table = counts("FetchPickAndPlace-v4", _verdicts())
    assert list(table) == [c.name for c in CLASSIFIERS["FetchPickAndPlace-v4"].classes]  # zeros included
    assert table[SUCCESS] == {"goal_in_air": 0, "goal_on_table": 1, "all": 1}
    assert table["closed_off_object"] == {"goal_in_air": 1, "goal_on_table": 0, "all": 1}
    assert table["pushed_not_lifted"]["goal_in_air"] == 1 and table["dropped"]["all"] == 0
    text = class_table("FetchPickAndPlace-v4", _verdicts())
    assert "goal in air" in text and "goal on table" in text
    assert "success" in text.splitlines()[1] and "1 (50%)" in text.splitlines()[1]  # 1 of the 2 table goals
    assert text.count(": ") == len(table)  # every class's rule under the table


def test_a_push_table_has_one_column_and_the_json_holds_every_episode():
    verdicts = [Verdict.of(row[1], CLASSIFIERS["FetchPush-v4"].classify(row[1])) for row in LINE]
    assert counts("FetchPush-v4", verdicts)["off_line"] == {"all": 2}
    assert "goal in air" not in class_table("FetchPush-v4", verdicts)
    diagnosis = Diagnosis(pathlib.Path("run/checkpoints/ckpt_0000000005.pt"), 5, {"FetchPush-v4": verdicts})
    setting = WhySetting("run", "swa", first_seed=100, episodes=len(verdicts))
    doc = json.loads(json.dumps(document(diagnosis, setting, {"FetchPush-v4": "run/why/x.png"})))
    assert setting.stem(diagnosis) == "ckpt_0000000005_swa"  # a weight average's files beside the live actor's
    assert (doc["checkpoint"], doc["version"], doc["weights"], doc["first_seed"]) == (
        "ckpt_0000000005.pt",
        5,
        "swa",
        100,
    )
    push = doc["tasks"]["FetchPush-v4"]
    assert [e["label"] for e in push["episodes"]] == [v.label for v in verdicts]
    assert push["success_rate"] == 1 / len(LINE) and push["classes"]["off_line"]["all"] == 2
    assert push["classes"]["never_reached"]["rule"] and doc["thresholds"]["success_m"] == 0.05
