"""Meta-World v3 tasks as goal envs, so fleetrl's HER samplers train them like Fetch.

    env = make_env("MetaWorld-reach-v3")     # sim/registry.py registers these ids
    obs, info = env.reset(seed=0)
    obs["observation"].shape, obs["desired_goal"].shape   # (36,), (3,)

Meta-World (metaworld 3.1.1, pinned with mujoco 3.3.0 in one resolve) gives a flat 39-d
observation whose last 3 entries are the goal position, a dense shaped reward and
info["success"]. fleetrl learns goal-conditioned policies with HER, which needs what Fetch's
GoalEnv gives: observation, achieved_goal and desired_goal apart, and a reward function of
(achieved, desired) to relabel with. So each task names what its goal is about and when it is
reached (sim/metaworld_tasks.py, one row per task: the rule Meta-World's own info["success"]
uses), and the reward is one of two (`reward`):

- "sparse" (the default): Fetch's, 0 when the rule holds, -1 otherwise, so HER can relabel;
- "shaped": the task's own Meta-World v3 dense reward, which no other goal can recompute.

info["is_success"] is the rule's verdict, equal to Meta-World's info["success"] at every step.
The observation is the other 36 entries (hand, gripper, objects, and the previous frame's).
Episodes have a fixed horizon (no termination on success): the registry's max_episode_steps,
shorter than Meta-World's 500 steps while training (sim/registry.py). Each reset picks one of
Meta-World's 50 variations of the task (MT1's train tasks: goal and object positions) with the
env's own seeded generator, so reset(seed=s) gives the same episode start every time, as the
evaluator's held-out seeds need.

Meta-World decides at 80 Hz (5 physics steps of 2.5 ms). `set_control_rate(hz)` runs the task
at a faster rate with the same physics and the same hand speed, as sim/rate.py does for Fetch:

- physics: n = round((1 / hz) / 2.5 ms) steps per decision, the timestep (1 / hz) / n;
- the hand: an action moves the hand's mocap target by action / 100 m, and the target
  accumulates (it is not re-anchored on the hand, unlike Fetch's), so the position part of every
  action is scaled by exactly 80 / hz: the target moves as far per second as at 80 Hz;
- the observation's previous frame (entries 18-35) stays 1/80 s old: at `hz` it is the frame
  hz / 80 decisions ago, interpolated between the two stored frames around it (at 120 Hz, the
  mean of the frames 1 and 2 decisions ago), so a policy trained at 80 Hz reads the same
  differences for the same motion and needs no re-timing in its graph;
- the episode: as many seconds as at 80 Hz (sim/registry.py make_env).

Slower than 80 Hz is refused: a full-scale action could not move the target as fast.
"""

from __future__ import annotations

import collections
import math
from typing import Any

import gymnasium as gym
import numpy as np

from foundation.config_experience import REWARDS
from sim.metaworld_tasks import RULES

GOAL = slice(36, 39)  # where Meta-World's v3 observation holds the goal position
FRAME = 18  # one frame: hand 3, gripper 1, two objects' position 3 and quaternion 4
NATIVE_HZ = 80.0  # NATIVE_SUBSTEPS physics steps of NATIVE_TIMESTEP per decision
NATIVE_TIMESTEP = 0.0025
NATIVE_SUBSTEPS = 5
PATH_STEPS = 500  # Meta-World's episode (max_path_length): its benchmarks score success at any step of it
POSITION_DIMS = 3  # action[:3] moves the hand's mocap target; action[3] the gripper


class MetaWorldGoal(gym.Env):
    """One Meta-World v3 task (`env_name`, e.g. "reach-v3") with Fetch's goal-env interface:
    dict observations, compute_reward(achieved, desired, info), and goal_success(achieved, desired)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, env_name: str, reward: str = "sparse") -> None:
        try:
            import metaworld
        except ImportError as err:
            raise ImportError(
                "Meta-World tasks need metaworld: pip install metaworld==3.1.1 mujoco==3.3.0 (in one command)"
            ) from err
        if env_name not in RULES:
            raise ValueError(f"Meta-World task {env_name!r}: fleetrl knows {sorted(RULES)}")
        if reward not in REWARDS:
            raise ValueError(f"sim.reward ({reward!r}) must be one of {REWARDS}: no other reward is defined")
        benchmark = metaworld.MT1(env_name, seed=0)  # the task's 50 variations, fixed
        self._variations = benchmark.train_tasks
        self._env = benchmark.train_classes[env_name]()
        # fleetrl's time limit ends an episode (sim/registry.py); Meta-World's own would refuse a
        # step past its 500th, which an episode of as many seconds at a faster rate takes.
        self._env.max_path_length = 2**31 - 1
        self.rule = RULES[env_name]
        self.reward = reward
        self.action_space = self._env.action_space
        box = lambda n: gym.spaces.Box(-np.inf, np.inf, (n,), np.float64)  # noqa: E731
        self.observation_space = gym.spaces.Dict(
            {"observation": box(36), "achieved_goal": box(3), "desired_goal": box(3)}
        )
        self.control_hz = NATIVE_HZ
        self._position_scale = 1.0
        self._frames: collections.deque[np.ndarray] | None = None  # newest first, at another rate
        self._near, self._share = 1, 0.0

    def set_control_rate(self, hz: float) -> None:
        """Decide `hz` times per simulated second (>= 80); see the module docstring."""
        if not hz >= NATIVE_HZ:
            raise ValueError(
                f"control_hz ({hz:g}) is below Meta-World's own {NATIVE_HZ:g} Hz: a full-scale action "
                "could not move the hand's target as fast as at its own rate"
            )
        period = 1.0 / hz
        substeps = max(1, round(period / NATIVE_TIMESTEP))
        self._env.frame_skip = substeps
        self._env.model.opt.timestep = period / substeps
        self.control_hz = float(hz)
        self._position_scale = NATIVE_HZ / hz
        lag = hz / NATIVE_HZ  # decisions in one native decision: 1/80 s lies `near` + `share` frames back
        self._near, self._share = math.floor(lag), lag - math.floor(lag)
        self._frames = None if hz == NATIVE_HZ else collections.deque(maxlen=self._near + 2)

    def _previous_frame(self) -> np.ndarray:
        """The frame 1/80 s before the newest, interpolated between the two stored ones around it
        (the history is always full: a reset fills it)."""
        assert self._frames is not None
        frames = self._frames
        return (1.0 - self._share) * frames[self._near] + self._share * frames[self._near + 1]

    def _retimed(self, flat: np.ndarray, reset: bool) -> np.ndarray:
        if self._frames is None:
            return flat
        flat = np.array(flat, np.float64, copy=True)
        if reset:  # Meta-World starts an episode with the previous frame equal to the first
            self._frames.clear()
            self._frames.extend(flat[:FRAME].copy() for _ in range(self._near + 2))  # its maxlen
        else:
            self._frames.appendleft(flat[:FRAME].copy())
        flat[FRAME : 2 * FRAME] = self._previous_frame()
        return flat

    @property
    def model(self):
        """The MuJoCo model (sim/randomization.py scales its dynamics)."""
        return self._env.model

    def _split(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        flat = np.asarray(flat, np.float64)
        return {
            "observation": np.concatenate([flat[: GOAL.start], flat[GOAL.stop :]]),
            "achieved_goal": self.rule.achieved(self._env, flat),
            "desired_goal": flat[GOAL].copy(),
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._env.set_task(self._variations[int(self.np_random.integers(len(self._variations)))])
        rate = (self._env.frame_skip, self._env.model.opt.timestep)
        self._env.frame_skip, self._env.model.opt.timestep = NATIVE_SUBSTEPS, NATIVE_TIMESTEP  # settle as at 80 Hz:
        try:  # the same episode start at every rate
            flat, info = self._env.reset()
        finally:
            self._env.frame_skip, self._env.model.opt.timestep = rate
        return self._split(self._retimed(flat, reset=True)), dict(info)

    def step(self, action):
        action = np.array(action, np.float32, copy=True)
        action[:POSITION_DIMS] *= self._position_scale
        flat, shaped, _, _, info = self._env.step(action)
        obs = self._split(self._retimed(flat, reset=False))
        sparse = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], info))
        if self.reward == "shaped":  # Meta-World's own reward and success flag
            return obs, float(shaped), False, False, {**info, "is_success": float(info["success"])}
        return obs, sparse, False, False, {**info, "is_success": float(sparse == 0.0)}

    def goal_success(self, achieved_goal, desired_goal) -> np.ndarray:
        """Whether each achieved goal [..., 3] reaches the desired one by the task's rule."""
        return self.rule.success(achieved_goal, desired_goal)

    def compute_reward(self, achieved_goal, desired_goal, info) -> np.ndarray:
        """The sparse reward of each row: 0 where goal_success holds, -1 elsewhere (HER's)."""
        return self.goal_success(achieved_goal, desired_goal).astype(np.float32) - 1.0

    def close(self) -> None:
        self._env.close()
