"""FetchPickAndPlace training episodes that start with the object held (sim.grasped_start).

    >>> env = GraspedStart(gym.make("FetchPickAndPlace-v4"), share=0.5)
    >>> obs, info = env.reset(seed=3)
    >>> env.started_grasped             # drawn from the env's own np_random: same seed, same draw
    True
    >>> obs["observation"][6:9]         # the object's position relative to the grip
    array([ 0.    , -0.    , -0.0001])

The HER paper (Andrychowicz et al. 2017) starts half of its pick-and-place training episodes
from one recorded state in which the box is grasped: a policy that has never lifted the box
sees lifts, and HER relabels them into goals in the air. This wrapper builds that state on
reset, with probability `share`:

1. the env resets as usual (arm at its start pose, object on the table, goal sampled);
2. the object (free joint "object0:joint") is put at the grip site ("robot0:grip") with zero
   velocity, upright, and both finger joints are set 0.9 mm clear of its faces;
3. the simulation steps for `SETTLE_SEC` with a zero-motion, gripper-closed action, the way an
   env step applies it but outside the episode (the time limit does not count these steps);
4. reset returns the observation of that state, with the goal sampled in step 1.

The grasp is at the gripper's start position, not at the object's sampled xy, because that is
the state in which nothing but the fingers moves. Reset restores the start pose the env settled
the arm into (its mocap weld at rest), so the arm holds still while the fingers close; a grasp
at the sampled xy would first have to drive the arm there. The rest keeps it stable:
- the box (a 5 cm cube) is aligned with the world axes and the gripper's fixed orientation
  closes the fingers along y, so each pad meets a face flat; centred on the grip site, the box
  lies within the pads but for its lowest 6.5 mm;
- the fingers start clear of it (FINGER_OPEN_M; the pads touch the box at 0.0241 m), so the
  first physics step has no penetration to resolve; the finger actuators (kp 30000) then
  squeeze the box within two 25 Hz decisions.
Measured on 40 seeded resets in the default randomization ranges at 25 Hz, and at the ranges'
corners (object mass x1.2 with friction x0.8, damping and weld stiffness x0.8 or x1.2) at 25 Hz
and 120 Hz: the box sinks 1-2 mm while the grip closes and tilts under 1.5 degrees; a 10-step lift at full speed
carries it up 28 cm or more, and it slips under 4 mm in the 40 steps of holding after that.
The grip holds while the policy keeps the gripper closed: a Fetch gripper action is a finger
target relative to where the fingers are, so 0 relaxes them. With randomization's
action_latency_steps k (0 by default) an episode's first k steps apply the zero action
(sim/randomization.py): at k = 2 every measured box stays held, at k = 3 none does.

The draw comes from the env's own `np_random` after its reset, so a seeded reset is
reproducible; at share 0 nothing is drawn and resets are those of the plain env.
Only the sampler's training envs take it (sim/tasks.py, TaskSet.training_env): the evaluator,
deploy-check and demonstrations score and act from the env's own starts.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

OBJECT_JOINT = "object0:joint"
GRIP_SITE = "robot0:grip"
FINGER_JOINTS = ("robot0:l_gripper_finger_joint", "robot0:r_gripper_finger_joint")
FINGER_OPEN_M = 0.025  # each finger's opening: its pad 0.9 mm clear of the 5 cm box
SETTLE_SEC = 0.2  # simulated seconds the closed grip settles for: 5 decisions at 25 Hz
CLOSE = np.array([0.0, 0.0, 0.0, -1.0])  # Fetch's action: no hand motion, gripper closed
UPRIGHT = np.array([1.0, 0.0, 0.0, 0.0])  # the object's orientation quaternion at the env's start


class GraspedStart(gym.Wrapper):
    """Starts a share of a Fetch pick-and-place env's episodes with the object held; see the
    module docstring. `started_grasped` says whether the current episode did."""

    def __init__(self, env: gym.Env, share: float) -> None:
        super().__init__(env)
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"sim.grasped_start ({share}) must be in [0, 1]")
        fetch: Any = env.unwrapped
        if not getattr(fetch, "has_object", False) or getattr(fetch, "block_gripper", True):
            # the task's name: its gym id less a namespace (sim/registry.py registers Meta-World's as fleetrl/)
            task = env.spec.id.rpartition("/")[2] if env.spec is not None else repr(fetch)
            raise ValueError(
                f"sim.grasped_start ({share}) must be 0 for {task}: only a task whose gripper can grasp an "
                "object takes it (FetchPickAndPlace-v4 is one)"
            )
        self.share = share
        self._grasped = False

    @property
    def started_grasped(self) -> bool:
        """Whether the current episode started with the object held (False before a reset)."""
        return self._grasped

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        fetch: Any = self.env.unwrapped
        # At share 0 nothing is drawn: the env's random stream, hence every later goal and
        # object placement, stays the plain env's.
        self._grasped = self.share > 0 and bool(fetch.np_random.random() < self.share)
        if self._grasped:
            grasp(fetch)
            # The wrappers between this one and the Fetch env (time limit, order and passive
            # checkers, sim/rate.py's ControlRate) leave observations as they are.
            obs = fetch._get_obs()
        return obs, info


def grasp(fetch: Any) -> None:
    """Put a Fetch env's object between its fingers at the grip site and close the grip on it."""
    model, data, utils = fetch.model, fetch.data, fetch._utils  # the env's own MuJoCo helpers
    grip = utils.get_site_xpos(model, data, GRIP_SITE).copy()
    utils.set_joint_qpos(model, data, OBJECT_JOINT, np.concatenate([grip, UPRIGHT]))
    utils.set_joint_qvel(model, data, OBJECT_JOINT, np.zeros(6))
    for joint in FINGER_JOINTS:
        utils.set_joint_qpos(model, data, joint, FINGER_OPEN_M)
        utils.set_joint_qvel(model, data, joint, 0.0)
    fetch._mujoco.mj_forward(model, data)
    # A decision lasts fetch.dt at any control rate (sim/rate.py sets n_substeps and the
    # timestep), so the grip settles for the same simulated time at every rate.
    for _ in range(max(1, math.ceil(SETTLE_SEC / fetch.dt - 1e-9))):
        fetch._set_action(CLOSE)
        fetch._mujoco_step(CLOSE)
        fetch._step_callback()
