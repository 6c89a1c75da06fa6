"""Record a Fetch episode's simulator state for failure analysis (sim/failures.py classifies it).

    probe = FetchProbe(env)                                   # once per env
    trace = record_episode(env, probe, policy, seed=1_000_000) # deterministic, as the evaluator acts

The probe reads the simulator, not the observation: an evaluation with eval.randomize adds noise
to the observation, and a multi-task run pads it; the state the classifiers judge is neither.
"""

from __future__ import annotations

from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from sim.failures import EpisodeTrace, StatePath

ROBOT_PREFIX = "robot0:"  # every body of the Fetch robot in gymnasium-robotics' model
OBJECT = "object0"  # the block (Push, PickAndPlace) or the puck (Slide): a body and a site
FINGER_JOINTS = ("robot0:l_gripper_finger_joint", "robot0:r_gripper_finger_joint")


class Acting(Protocol):
    def act(self, obs: dict[str, np.ndarray], deterministic: bool, task: int = 0) -> np.ndarray: ...


class FetchProbe:
    """Reads one Fetch env's grip site, object, finger joints and robot-object contact."""

    def __init__(self, env: gym.Env) -> None:
        fetch: Any = env.unwrapped
        if not getattr(fetch, "has_object", False):
            raise ValueError(f"{env.spec.id if env.spec else env}: a Fetch task with an object is needed")
        self._fetch = fetch
        model = fetch.model
        self._object_body = model.body(OBJECT).id
        self._robot = np.array([model.body(i).name.startswith(ROBOT_PREFIX) for i in range(model.nbody)])

    @property
    def table_z(self) -> float:
        """The object's resting height: the env's height_offset, which table goals are put at."""
        return float(self._fetch.height_offset)

    @property
    def goal(self) -> np.ndarray:
        return np.array(self._fetch.goal, np.float64)

    def read(self) -> dict[str, Any]:
        """The state now: grip, obj, fingers, touch (StatePath's fields, one row each)."""
        fetch, utils = self._fetch, self._fetch._utils
        model, data = fetch.model, fetch.data
        fingers = [utils.get_joint_qpos(model, data, joint)[0] for joint in FINGER_JOINTS]
        bodies = model.geom_bodyid
        first, second = bodies[data.contact.geom1[: data.ncon]], bodies[data.contact.geom2[: data.ncon]]
        obj = self._object_body
        touch = bool(np.any(((first == obj) & self._robot[second]) | ((second == obj) & self._robot[first])))
        return {
            "grip": np.array(utils.get_site_xpos(model, data, "robot0:grip"), np.float64),
            "obj": np.array(utils.get_site_xpos(model, data, OBJECT), np.float64),
            "fingers": np.array(fingers, np.float64),
            "touch": touch,
        }


def record_episode(env: gym.Env, probe: FetchProbe, policy: Acting, seed: int, task: int = 0) -> EpisodeTrace:
    """One deterministic episode of task place `task` on `seed`, run to the env's own end, with the
    state after reset and after every step; success is the last step's is_success, as
    sampler/evaluator.py scores it."""
    obs, _ = env.reset(seed=seed)
    if (new_episode := getattr(policy, "new_episode", None)) is not None:
        new_episode()
    rows = [probe.read()]
    info: dict[str, Any] = {}
    terminated = truncated = False
    while not (terminated or truncated):
        obs, _, terminated, truncated, info = env.step(policy.act(obs, True, task))
        rows.append(probe.read())
    states = StatePath(**{key: np.array([row[key] for row in rows]) for key in ("grip", "obj", "fingers", "touch")})
    return EpisodeTrace(seed, probe.goal, probe.table_z, bool(info.get("is_success", 0.0)), states)
