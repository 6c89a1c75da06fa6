"""A Fetch task at a chosen control rate: `make_env(task, control_hz=120)`.

Fetch decides at 25 Hz: each env step runs 20 physics steps of 2 ms, and an action moves the
hand's mocap target by 0.05 m times its first three components. At another rate the same
task keeps its physics and its hand speed:

- physics: n = round((1 / hz) / 2 ms) steps per decision, the timestep set to (1 / hz) / n,
  so a decision lasts exactly 1 / hz of simulated time (120 Hz: 4 steps of 2.083 ms);
- the hand: the position part of every action is scaled so that a full-scale action moves the
  hand as far per second as at 25 Hz (the gripper part is a target, kept). The mocap weld
  follows its target with a lag, and Fetch re-anchors the target on the hand every decision,
  so the scale is not simply (1 / hz) / 40 ms: it is measured once per process and rate by
  bisection (0.4 s of a full-scale push either way; 120 Hz: about 0.78);
- the episode: as many seconds as at 25 Hz, so 50 steps become round(50 * hz / 25).

Velocities in the observation are per decision (Fetch multiplies them by dt), so a policy
trained at one rate sees other numbers at another (at 120 Hz, 25/120 of what it learned from).
`velocity_columns` names them; multiplied by `velocity_scale` (measured: the decision lengths'
ratio alone misses the hand's lag within a decision) they read as at 25 Hz again
(deploy_npu/retime.py folds that into an exported graph's normalizer).
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np

NATIVE_HZ = 25.0  # Fetch: 20 physics steps of 2 ms per decision
NATIVE_TIMESTEP = 0.002
CALIBRATION_SEC = 0.4
POSITION_DIMS = 3  # action[:3] moves the hand's target; action[3] sets the gripper


# Fetch's observation (gymnasium_robotics fetch_env.py, generate_mujoco_observations): with an
# object, [grip pos 3, object pos 3, object rel pos 3, fingers 2, object rot 3, object velp 3,
# object velr 3, grip velp 3, finger vel 2]; without (Reach), [grip pos 3, fingers 2, grip velp 3,
# finger vel 2]. The velocities are multiplied by the decision's length.
VELOCITY_COLUMNS = {25: slice(14, 25), 10: slice(5, 10)}
GRIP_VELOCITY_X = {25: 20, 10: 5}  # the grip's x velocity: what velocity_scale calibrates on


def velocity_columns(obs_dim: int) -> slice:
    """The columns of a Fetch observation of width `obs_dim` that are velocities per decision."""
    if obs_dim not in VELOCITY_COLUMNS:
        raise ValueError(f"no Fetch observation is {obs_dim} wide (known: {sorted(VELOCITY_COLUMNS)})")
    return VELOCITY_COLUMNS[obs_dim]


def episode_steps(native_steps: int, hz: float, native_hz: float = NATIVE_HZ) -> int:
    """Decisions at `hz` in the seconds of `native_steps` decisions at `native_hz`."""
    return max(1, round(native_steps * hz / native_hz))


class ControlRate(gym.ActionWrapper):
    """Run a Fetch env at `hz` decisions per (simulated) second; see the module docstring."""

    def __init__(self, env: gym.Env, hz: float) -> None:
        super().__init__(env)
        if hz <= 0:
            raise ValueError(f"control_hz ({hz}) must be > 0")
        fetch: Any = env.unwrapped
        if not hasattr(fetch, "n_substeps") or not hasattr(fetch, "model"):
            raise ValueError(f"{fetch!r} is not a MuJoCo Fetch env: its control rate cannot be changed")
        self.hz = hz
        set_rate(fetch, hz)
        self.position_scale = hand_scale(env.spec.id if env.spec else "", hz)

    def action(self, action: np.ndarray) -> np.ndarray:
        scaled = np.array(action, dtype=np.float32, copy=True)
        scaled[:POSITION_DIMS] *= self.position_scale
        return scaled


def set_rate(fetch: Any, hz: float) -> None:
    """Physics steps per decision and their length: exactly 1 / hz of simulated time."""
    period = 1.0 / hz
    substeps = max(1, round(period / NATIVE_TIMESTEP))
    fetch.n_substeps = substeps
    fetch.model.opt.timestep = period / substeps


def _push(gym_id: str, hz: float, scale: float, seconds: float = CALIBRATION_SEC) -> tuple[np.ndarray, np.ndarray]:
    """The first and the last observation of a +x action of `scale` held for `seconds` at `hz`."""
    env = gym.make(gym_id)
    fetch: Any = env.unwrapped
    if hz != NATIVE_HZ:
        set_rate(fetch, hz)
    obs, _ = env.reset(seed=0)
    first = obs["observation"]
    action = np.zeros(4, np.float32)  # Fetch: dx, dy, dz, gripper
    action[0] = scale
    for _ in range(round(seconds * hz)):
        obs, *_ = env.step(action)
    env.close()
    return first, obs["observation"]


def _reach(gym_id: str, hz: float, scale: float, seconds: float = CALIBRATION_SEC) -> float:
    """How far (m, along x) a full-scale +x action moves the hand in `seconds` at `hz`."""
    first, last = _push(gym_id, hz, scale, seconds)
    return float(last[0] - first[0])


@functools.cache
def velocity_scale(gym_id: str, hz: float) -> float:
    """What a velocity column read at `hz` is multiplied by to read as at 25 Hz for the same
    motion: the grip's x velocity at the end of CALIBRATION_SEC of a full-scale push (the hand at
    its 25 Hz speed, hand_scale), at 25 Hz over at `hz`. 120 Hz: about 3.8, not the 4.8 of the
    decision lengths alone, because within a 40 ms decision the hand lags its jumped target and
    ends it slower than its mean speed (velocity x dt is 0.71 of the decision's displacement at
    25 Hz, 0.97 at 120 Hz)."""
    if hz == NATIVE_HZ:
        return 1.0
    native = _push(gym_id, NATIVE_HZ, 1.0)[1]
    column = GRIP_VELOCITY_X[len(native)]
    return float(native[column] / _push(gym_id, hz, hand_scale(gym_id, hz))[1][column])


@functools.cache
def hand_scale(gym_id: str, hz: float) -> float:
    """The position scale at which the hand moves as far in CALIBRATION_SEC as at 25 Hz."""
    target = _reach(gym_id, NATIVE_HZ, 1.0)
    low, high = 0.05, 5.0
    for _ in range(12):
        mid = (low + high) / 2
        if _reach(gym_id, hz, mid) < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2
