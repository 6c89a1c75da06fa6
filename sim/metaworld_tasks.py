"""What each Meta-World v3 task's goal is about, and when Meta-World counts it reached.

sim/metaworld.py poses a Meta-World task as a goal env: an achieved goal, the desired goal
(Meta-World's target, the observation's last 3 entries) and a success rule on the two that HER
can evaluate for any other goal. Each rule below is the one the task's own `evaluate_state`
uses for info["success"] (metaworld 3.1.1, metaworld/envs/sawyer_*_v3.py), so the goal env's
success equals Meta-World's at every step (tests/test_sim_metaworld_experts.py checks it with
Meta-World's scripted experts):

    success  =  || (achieved - desired) * scale ||  <=  threshold

    task                     achieved goal                              scale      threshold
    reach-v3                 the fingers' centre (tcp_center)           1 1 1      0.05
    push-v3                  the puck (obs[4:7])                        1 1 1      0.05
    pick-place-v3            the puck (obs[4:7])                        1 1 1      0.07
    door-open-v3             the door handle (obs[4:7])                 1 0 0      0.08  (x only)
    drawer-open-v3           the drawer handle (obs[4:7])               1 1 1      0.03
    drawer-close-v3          the drawer handle (obs[4:7])               1 1 1      0.065 (0.05 + 0.015)
    button-press-topdown-v3  the button's top (obs[4:7])                0 0 1      0.024 (z only)
    peg-insert-side-v3       the peg's head (site "pegHead")            1 2 2      0.07
    window-open-v3           the window handle (obs[4:7])               1 0 0      0.05  (x only)
    window-close-v3          the window handle (obs[4:7])               1 0 0      0.05  (x only)

Two achieved goals are not in the observation, and are read from the simulation:
- reach: Meta-World measures the fingers' centre (`tcp_center`), which sits about 4.5 cm from
  the hand position obs[0:3]; the hand would disagree with info["success"] near the threshold.
- peg-insert-side: Meta-World measures the peg's head, which the observation does not hold
  (obs[4:7] is the peg's grasp point, about 13 cm back along the peg).
The policy still sees only the observation; the achieved goal is what HER relabels with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

OBJECT = slice(4, 7)  # the first object's position in Meta-World's v3 observation


def _first_object(env: Any, flat: np.ndarray) -> np.ndarray:
    return np.array(flat[OBJECT], np.float64)


def _fingers_centre(env: Any, flat: np.ndarray) -> np.ndarray:
    return np.array(env.tcp_center, np.float64)


def _peg_head(env: Any, flat: np.ndarray) -> np.ndarray:
    return np.array(env._get_site_pos("pegHead"), np.float64)


@dataclass(frozen=True)
class GoalRule:
    """One task's achieved goal and success rule (see the module docstring's table)."""

    achieved: Callable[[Any, np.ndarray], np.ndarray]  # (Meta-World env, flat observation) -> [3]
    threshold: float  # metres, inclusive, as Meta-World's `<=`
    scale: tuple[float, float, float] = (1.0, 1.0, 1.0)  # per-axis weight: 0 ignores an axis

    def distance(self, achieved: np.ndarray, desired: np.ndarray) -> np.ndarray:
        """The scaled distance of each row [..., 3] -> [...]."""
        return np.linalg.norm((np.asarray(achieved) - np.asarray(desired)) * np.asarray(self.scale), axis=-1)

    def success(self, achieved: np.ndarray, desired: np.ndarray) -> np.ndarray:
        return self.distance(achieved, desired) <= self.threshold


X_ONLY, Z_ONLY = (1.0, 0.0, 0.0), (0.0, 0.0, 1.0)

RULES: dict[str, GoalRule] = {
    "reach-v3": GoalRule(_fingers_centre, 0.05),
    "push-v3": GoalRule(_first_object, 0.05),
    "pick-place-v3": GoalRule(_first_object, 0.07),
    "door-open-v3": GoalRule(_first_object, 0.08, X_ONLY),
    "drawer-open-v3": GoalRule(_first_object, 0.03),
    "drawer-close-v3": GoalRule(_first_object, 0.05 + 0.015),
    "button-press-topdown-v3": GoalRule(_first_object, 0.024, Z_ONLY),
    "peg-insert-side-v3": GoalRule(_peg_head, 0.07, (1.0, 2.0, 2.0)),
    "window-open-v3": GoalRule(_first_object, 0.05, X_ONLY),
    "window-close-v3": GoalRule(_first_object, 0.05, X_ONLY),
}
"""Every Meta-World task fleetrl poses, by Meta-World's name."""
