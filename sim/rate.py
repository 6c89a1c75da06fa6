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
trained at one rate sees other numbers at another: train at the rate you deploy at.
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


def episode_steps(native_steps: int, hz: float) -> int:
    return max(1, round(native_steps * hz / NATIVE_HZ))


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


def _reach(gym_id: str, hz: float, scale: float, seconds: float = CALIBRATION_SEC) -> float:
    """How far (m, along x) a full-scale +x action moves the hand in `seconds` at `hz`."""
    env = gym.make(gym_id)
    fetch: Any = env.unwrapped
    if hz != NATIVE_HZ:
        set_rate(fetch, hz)
    obs, _ = env.reset(seed=0)
    start = float(obs["observation"][0])
    action = np.zeros(4, np.float32)  # Fetch: dx, dy, dz, gripper
    action[0] = scale
    for _ in range(round(seconds * hz)):
        obs, *_ = env.step(action)
    env.close()
    return float(obs["observation"][0]) - start


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
