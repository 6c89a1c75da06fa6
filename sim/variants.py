"""Physics-model changes that are not a parameter scale: the integrator, the physics step and how
contacts resolve. A real robot meets the sim's model in these ways too, so a controller's
robustness envelope (deploy_npu/envelope.py) sweeps them beside the scaled dynamics.

    >>> env = ModelVariant(make_env("FetchPush-v4"), VariantConfig(integrator="rk4", cone="elliptic"))
    >>> env.unwrapped.model.opt.integrator      # mujoco.mjtIntegrator.mjINT_RK4

- `integrator`: MuJoCo's `opt.integrator` (Fetch and Meta-World train with "euler");
- `timestep_scale`: the physics step times f and the steps per decision divided by f, so a decision
  lasts as long as in training (Fetch: 20 steps of 2 ms; f = 0.5 gives 40 steps of 1 ms). 20 / f
  (the task's steps per decision over f) must be a whole number;
- `impratio`: the ratio of frictional to normal constraint impedance (MuJoCo's default 1; with an
  elliptic cone, higher values make contacts slip less);
- `cone`: the friction cone, "pyramidal" (MuJoCo's default, what the tasks train with) or "elliptic".

The changes are made once, on the env's model, and hold for every episode (domain randomization
writes only the scaled arrays it owns, never these options).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import mujoco

INTEGRATORS = {
    "euler": mujoco.mjtIntegrator.mjINT_EULER,
    "rk4": mujoco.mjtIntegrator.mjINT_RK4,
    "implicit": mujoco.mjtIntegrator.mjINT_IMPLICIT,
    "implicitfast": mujoco.mjtIntegrator.mjINT_IMPLICITFAST,
}
CONES = {"pyramidal": mujoco.mjtCone.mjCONE_PYRAMIDAL, "elliptic": mujoco.mjtCone.mjCONE_ELLIPTIC}


@dataclass(frozen=True)
class VariantConfig:
    """One model variant; None everywhere is the task's own model."""

    integrator: str | None = None
    timestep_scale: float | None = None
    impratio: float | None = None
    cone: str | None = None

    def problem(self) -> str | None:
        """Why this variant is not one MuJoCo can run, or None."""
        if self.integrator is not None and self.integrator not in INTEGRATORS:
            return f"integrator ({self.integrator!r}) must be one of {sorted(INTEGRATORS)}"
        if self.cone is not None and self.cone not in CONES:
            return f"cone ({self.cone!r}) must be one of {sorted(CONES)}"
        if self.impratio is not None and not self.impratio >= 1.0:
            return f"impratio ({self.impratio}) must be >= 1: MuJoCo's impedance ratio starts at 1"
        if self.timestep_scale is not None and not self.timestep_scale > 0:
            return f"timestep_scale ({self.timestep_scale}) must be > 0"
        return None


class ModelVariant(gym.Wrapper):
    """`env` with its MuJoCo model changed as `variant` says (see the module docstring)."""

    def __init__(self, env: gym.Env, variant: VariantConfig) -> None:
        super().__init__(env)
        if problem := variant.problem():
            raise ValueError(problem)
        self.variant = variant
        core: Any = env.unwrapped
        opt = core.model.opt
        if variant.integrator is not None:
            opt.integrator = INTEGRATORS[variant.integrator]
        if variant.cone is not None:
            opt.cone = CONES[variant.cone]
        if variant.impratio is not None:
            opt.impratio = variant.impratio
        if variant.timestep_scale is not None and variant.timestep_scale != 1.0:
            _scale_timestep(core, variant.timestep_scale)


def _scale_timestep(core: Any, scale: float) -> None:
    """Physics step x `scale`, steps per decision / `scale`: the decision keeps its length."""
    if not hasattr(core, "n_substeps"):
        raise ValueError(
            "timestep_scale needs a Fetch task (its steps per decision are n_substeps); a Meta-World "
            "task's physics step is set by its control rate (sim/metaworld.py)"
        )
    steps = core.n_substeps / scale
    if abs(steps - round(steps)) > 1e-9 or round(steps) < 1:
        raise ValueError(
            f"timestep_scale ({scale:g}) must divide the task's {core.n_substeps} physics steps per decision "
            "into a whole number, so that a decision lasts as long as in training"
        )
    core.model.opt.timestep *= scale
    core.n_substeps = round(steps)
