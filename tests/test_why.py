"""Failure classes on the real simulator: scripted behaviours get their class (the thresholds of
sim/failures.py hold in MuJoCo), and the recorded episodes are the evaluator's."""

from __future__ import annotations

import numpy as np

from foundation.acting import rollout
from sim.failure_trace import FetchProbe, record_episode
from sim.failures import CLASSIFIERS, SUCCESS, Verdict
from sim.registry import make_env

SEED = 1_000_000  # seeds 1_000_000..1_000_002 put PickAndPlace's goal on the table, 1_000_003 in the air
AIR = SEED + 3


class Script:
    """A scripted Fetch gripper: `kind` says what it does with the object."""

    def __init__(self, kind: str) -> None:
        self.kind, self.step = kind, 0

    def new_episode(self) -> None:
        self.step = 0

    def act(self, obs: dict[str, np.ndarray], deterministic: bool, task: int = 0) -> np.ndarray:
        grip, obj, goal = obs["observation"][0:3], obs["observation"][3:6], obs["desired_goal"]
        t, self.step = self.step, self.step + 1

        def toward(point: np.ndarray, fingers: float) -> np.ndarray:
            return np.array([*np.clip((point - grip) * 15, -1, 1), fingers], np.float32)

        if self.kind == "still":
            return np.zeros(4, np.float32)
        if self.kind == "push":  # fingers shut: from behind the object, along the table toward the goal
            way = (goal[:2] - obj[:2]) / (np.linalg.norm(goal[:2] - obj[:2]) + 1e-9)
            behind = np.r_[obj[:2] - 0.06 * way, obj[2]]
            return toward(behind + (0, 0, 0.05 if t < 10 else 0), -1) if t < 16 else toward(np.r_[goal[:2], obj[2]], -1)
        aim = obj + (0.045, 0, 0) if self.kind == "close_beside" else obj  # beside: no finger on the block
        if t < 20:  # open above it, then down around it
            return toward(aim + (0, 0, 0.05 if t < 12 else 0), 1)
        if t < 25 or self.kind == "close_beside":
            return toward(aim, -1) if self.kind == "close_beside" else np.array([0, 0, 0, -1], np.float32)
        if self.kind == "drop":  # up, then open 15 cm over the table
            return np.array([0, 0, 1, -1] if t < 30 else [0, 0, 0, 1], np.float32)
        return toward(goal, -1)  # carry


CASES = [  # (task, behaviour, seed, class)
    ("FetchPickAndPlace-v4", "still", SEED, "never_reached"),
    ("FetchPickAndPlace-v4", "carry", AIR, SUCCESS),
    ("FetchPickAndPlace-v4", "drop", AIR, "dropped"),
    ("FetchPickAndPlace-v4", "close_beside", SEED, "closed_off_object"),
    ("FetchPickAndPlace-v4", "push", AIR, "pushed_not_lifted"),
    ("FetchPush-v4", "still", SEED, "never_reached"),
    ("FetchSlide-v4", "still", SEED, "never_hit"),
]


def test_scripted_behaviours_in_mujoco_get_their_class():
    envs = {task: make_env(task) for task in {case[0] for case in CASES}}
    try:
        got = []
        for task, kind, seed, _ in CASES:
            trace = record_episode(envs[task], FetchProbe(envs[task]), Script(kind), seed=seed)
            got.append((task, kind, seed, CLASSIFIERS[task].classify(trace)))
    finally:
        for env in envs.values():
            env.close()
    assert got == CASES


def test_the_recorded_success_is_what_the_evaluator_counts():
    env = make_env("FetchPickAndPlace-v4")
    try:
        probe, seeds = FetchProbe(env), range(SEED, SEED + 4)
        traced = [record_episode(env, probe, Script("carry"), seed=s) for s in seeds]
        scored = [rollout(env, Script("carry"), s, np.random.default_rng(s), deterministic=True)[1] for s in seeds]
    finally:
        env.close()
    assert [t.success for t in traced] == scored and any(scored)
    assert all(len(t.states.obj) == 51 for t in traced)  # after reset and after each of the 50 steps
    goal_in_air = [Verdict.of(t, "x").goal_in_air for t in traced]
    assert goal_in_air == [False, False, False, True]
