"""Domain randomization for MuJoCo goal envs (Fetch): dynamics per episode, noise per step.

    >>> env = DomainRandomization(gym.make("FetchPush-v4"), RandomizationConfig())
    >>> obs, info = env.reset(seed=7)        # draws new dynamics, seeded from 7
    >>> env.current_params                   # what this episode runs with, for logging
    RandomizationParams(mass_scale=0.992..., friction_scale=0.823..., ..., latency_steps=0)
    >>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())

Per episode (at reset), each drawn uniformly from its configured range:
  * object mass: bodies named object0, object1, ... (FetchReach has none: nothing to scale);
    body_mass and body_inertia are scaled together, i.e. a denser object of the same shape.
  * sliding friction of *all* geoms by one factor. MuJoCo gives a contact the larger of its
    two geoms' frictions (mjMAX combination), so one shared factor scales every contact's
    friction by exactly that factor. Scaling only the object would not: FetchSlide's
    object and table are both 0.1, and max(s * 0.1, 0.1) ignores every s < 1.
  * damping of every dof (arm joints, gripper, the object's free joint).
  * stiffness of the mocap weld that drags Fetch's gripper toward the commanded position
    (see `_scale_weld_solref` for the solref mapping): how briskly the arm follows.
  * a multiplier on the action (then clipped to the action space, as the env clips anyway).
  * action latency k from `action_latency_steps` (inclusive): the applied action is the
    one commanded k steps earlier; the first k steps of an episode apply the zero action
    (for Fetch: hold the gripper where it is, gripper fingers commanded to 0).

Per step: Gaussian noise of std `obs_noise_std` on obs["observation"] only. The goals stay
clean because the env computes reward and success from the true achieved_goal, and HER
relabels with achieved goals: a noisy goal would make stored rewards disagree with the goals
stored beside them.

Nominal model arrays are copied at construction and every draw is written as
nominal * scale, so scales never compound over episodes. The wrapper's own generator is
reseeded by reset(seed=...): identical seeds give identical episodes.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass
from typing import Any, cast

import gymnasium as gym
import mujoco
import numpy as np

from foundation.config import ConfigError, RandomizationConfig

_OBJECT_BODY = re.compile(r"object\d+")
_SCALE_FIELDS = ("mass_scale", "friction_scale", "damping_scale", "weld_stiffness_scale", "action_scale")
# The wrapper's generator is the first child of the reset seed's SeedSequence: an independent
# stream from the env's own np_random (the root of the same seed), so goal and object
# placement do not correlate with the dynamics draw.
_RNG_SPAWN_KEY = (1,)

# Every range pinned to its nominal value; the wrapper uses it when enabled=False (same code
# path, nominal draws), and tests start from it to turn one knob at a time.
NOMINAL_CONFIG = RandomizationConfig(
    enabled=False,
    mass_scale=(1.0, 1.0),
    friction_scale=(1.0, 1.0),
    damping_scale=(1.0, 1.0),
    weld_stiffness_scale=(1.0, 1.0),
    action_scale=(1.0, 1.0),
    obs_noise_std=0.0,
    action_latency_steps=(0, 0),
)


@dataclass(frozen=True)
class RandomizationParams:
    """One episode's draw. `mass_scale` is drawn even where no object body exists (so the
    random stream is the same for every task) and then has no effect."""

    mass_scale: float
    friction_scale: float
    damping_scale: float
    weld_stiffness_scale: float
    action_scale: float
    latency_steps: int


NOMINAL_PARAMS = RandomizationParams(1.0, 1.0, 1.0, 1.0, 1.0, 0)
"""The draw of the nominal task: every scale 1, no latency."""


def validate_randomization(config: RandomizationConfig) -> None:
    """Raise ConfigError naming the field, its value and the limit; run at wrapper construction.

    >>> validate_randomization(RandomizationConfig(mass_scale=(1.2, 0.8)))
    ConfigError: randomization.mass_scale ((1.2, 0.8)) must satisfy 0 < low <= high ...
    """
    for name in _SCALE_FIELDS:
        low, high = getattr(config, name)
        if not (0.0 < low <= high < math.inf):
            raise ConfigError(
                f"randomization.{name} ({(low, high)}) must satisfy 0 < low <= high < inf: "
                "a scale <= 0 makes the model unphysical"
            )
    std = config.obs_noise_std
    if not (0.0 <= std < math.inf):
        raise ConfigError(f"randomization.obs_noise_std ({std}) must be finite and >= 0")
    low, high = config.action_latency_steps
    if not (isinstance(low, int) and isinstance(high, int) and 0 <= low <= high):
        raise ConfigError(f"randomization.action_latency_steps ({(low, high)}) must be integers with 0 <= low <= high")


def _scale_weld_solref(solref: np.ndarray, scale: float) -> np.ndarray:
    """Weld solref rows [N, 2] whose stiffness is `scale` times that of `solref`, same damping ratio.

    MuJoCo's default solref (timeconst, dampratio) > 0 sets, per unit of constraint mass,
    stiffness k = 1 / (dmax^2 timeconst^2 dampratio^2) and damping b = 2 / (dmax timeconst)
    (MuJoCo docs, "Solver parameters"). So timeconst / sqrt(scale) gives k * scale and
    b * sqrt(scale): a stiffer spring with the same damping ratio (Fetch: 0.02 s, ratio 1,
    critically damped, stays critically damped). The direct form solref = (-k, -b) is
    scaled the same way: k * scale, b * sqrt(scale).
    """
    out = np.array(solref, dtype=np.float64, copy=True)
    root = math.sqrt(scale)
    timeconst_form = out[:, 0] > 0
    out[timeconst_form, 0] /= root
    out[~timeconst_form, 0] *= scale
    out[~timeconst_form, 1] *= root
    return out


def _mocap_welds(model: mujoco.MjModel) -> np.ndarray:
    """Indices of weld equality constraints with a mocap body on either side."""
    welds = []
    for i in range(model.neq):
        if model.eq_type[i] != mujoco.mjtEq.mjEQ_WELD:
            continue
        bodies = (model.eq_obj1id[i], model.eq_obj2id[i])
        if any(model.body_mocapid[b] >= 0 for b in bodies):
            welds.append(i)
    return np.asarray(welds, dtype=np.int64)


class _ModelScaler:
    """Writes nominal * scale into a MuJoCo model; owns the nominal copies."""

    def __init__(self, model: mujoco.MjModel) -> None:
        self.model = model
        names = [model.body(i).name for i in range(model.nbody)]
        self.object_bodies = np.asarray([i for i, n in enumerate(names) if _OBJECT_BODY.fullmatch(n)], int)
        self.welds = _mocap_welds(model)
        self._mass = model.body_mass.copy()
        self._inertia = model.body_inertia.copy()
        self._friction = model.geom_friction[:, 0].copy()
        self._damping = model.dof_damping.copy()
        self._solref = model.eq_solref.copy()
        # mj_setConst recomputes derived constants (subtree masses, invweight0 used by the
        # constraint solver) from the scaled masses. It writes into an MjData, so it gets a
        # scratch one: the env's own data must not be touched.
        self._scratch = mujoco.MjData(model)

    def max_weld_stiffness_scale(self) -> float:
        """Largest scale before MuJoCo clamps timeconst at 2 * timestep (refsafe) and stops responding."""
        if self.model.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_REFSAFE:
            return math.inf
        timeconst = self._solref[self.welds, 0]
        timeconst = timeconst[timeconst > 0]
        if timeconst.size == 0:
            return math.inf
        return float((timeconst.min() / (2.0 * self.model.opt.timestep)) ** 2)

    def apply(self, params: RandomizationParams) -> None:
        """Restore every nominal array, then scale it; calling twice equals calling once."""
        m = self.model
        m.body_mass[:] = self._mass
        m.body_inertia[:] = self._inertia
        m.body_mass[self.object_bodies] *= params.mass_scale
        m.body_inertia[self.object_bodies] *= params.mass_scale
        m.geom_friction[:, 0] = self._friction * params.friction_scale
        m.dof_damping[:] = self._damping * params.damping_scale
        m.eq_solref[:] = self._solref
        if self.welds.size:
            m.eq_solref[self.welds] = _scale_weld_solref(self._solref[self.welds], params.weld_stiffness_scale)
        mujoco.mj_setConst(m, self._scratch)


class DomainRandomization(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Randomizes a MuJoCo goal env's dynamics per episode and its observations per step.

    >>> env = DomainRandomization(gym.make("FetchSlide-v4"), RandomizationConfig())
    >>> obs, _ = env.reset(seed=3); env.current_params.friction_scale
    1.053...
    >>> env.object_body_names
    ('object0',)

    `current_params` is None until the first reset. `config.enabled=False` runs the same
    code with nominal draws (all scales 1, no latency, no noise): the nominal task.
    """

    def __init__(self, env: gym.Env, config: RandomizationConfig) -> None:
        validate_randomization(config)
        gym.utils.RecordConstructorArgs.__init__(self, config=config)
        gym.Wrapper.__init__(self, env)
        self.config = config if config.enabled else NOMINAL_CONFIG
        model = getattr(env.unwrapped, "model", None)
        if not isinstance(model, mujoco.MjModel):
            raise TypeError(f"DomainRandomization needs a MuJoCo env with .model, got {env.unwrapped}")
        self._scaler = _ModelScaler(model)
        self._check_weld_range()
        self._rng = np.random.default_rng()
        self._params: RandomizationParams | None = None
        self._pending: deque[np.ndarray] = deque()

    def _check_weld_range(self) -> None:
        limit = self._scaler.max_weld_stiffness_scale()
        high = self.config.weld_stiffness_scale[1]
        if high > limit:
            raise ConfigError(
                f"randomization.weld_stiffness_scale high ({high}) must be <= {limit:.3g} for this "
                "model: MuJoCo clamps the weld timeconst at 2 * timestep, so stiffer draws would "
                "all behave the same"
            )

    @property
    def current_params(self) -> RandomizationParams | None:
        """This episode's draw (None before the first reset)."""
        return self._params

    @property
    def object_body_names(self) -> tuple[str, ...]:
        """Bodies whose mass `mass_scale` scales; empty for FetchReach."""
        model = self._scaler.model
        return tuple(model.body(int(i)).name for i in self._scaler.object_bodies)

    def restore_nominal(self) -> None:
        """Write the nominal model values back (e.g. before handing the env to nominal code)."""
        self._scaler.apply(NOMINAL_PARAMS)

    def _draw(self) -> RandomizationParams:
        # Fixed draw order (keyword arguments evaluate left to right): same seed, same params.
        c, uniform = self.config, self._rng.uniform
        low, high = c.action_latency_steps
        return RandomizationParams(
            mass_scale=float(uniform(*c.mass_scale)),
            friction_scale=float(uniform(*c.friction_scale)),
            damping_scale=float(uniform(*c.damping_scale)),
            weld_stiffness_scale=float(uniform(*c.weld_stiffness_scale)),
            action_scale=float(uniform(*c.action_scale)),
            latency_steps=int(self._rng.integers(low, high, endpoint=True)),
        )

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Draw this episode's dynamics, write them into the model, then reset the env."""
        if seed is not None:
            self._rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=_RNG_SPAWN_KEY))
        self._params = self._draw()
        # Scale before the env resets, so its reset-time mj_forward already sees this episode.
        self._scaler.apply(self._params)
        obs, info = self.env.reset(seed=seed, options=options)
        box = cast(gym.spaces.Box, self.action_space)  # MuJoCo (Fetch) envs act in a Box; gym types any Space
        zero = np.zeros(box.shape, dtype=box.dtype)
        self._pending = deque(zero for _ in range(self._params.latency_steps))
        return self._noisy(obs), info

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], Any, bool, bool, dict[str, Any]]:
        """Scale and clip the action, delay it by the episode's latency, add observation noise."""
        if self._params is None:
            raise RuntimeError("DomainRandomization.step called before reset")
        action = np.asarray(action, dtype=self.action_space.dtype)
        # Check now: with latency the env itself would only see a bad action k steps later.
        if action.shape != self.action_space.shape:
            raise ValueError(f"action shape {action.shape}, this task expects {self.action_space.shape}")
        box = cast(gym.spaces.Box, self.action_space)  # MuJoCo (Fetch) envs act in a Box; gym types any Space
        low, high = box.low, box.high
        self._pending.append(np.clip(action * self._params.action_scale, low, high).astype(action.dtype))
        obs, reward, terminated, truncated, info = self.env.step(self._pending.popleft())
        return self._noisy(obs), reward, terminated, truncated, info

    def _noisy(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        std = self.config.obs_noise_std
        if std == 0.0:
            return obs
        observation = obs["observation"]
        noise = self._rng.normal(0.0, std, size=observation.shape)
        return {**obs, "observation": (observation + noise).astype(observation.dtype)}
