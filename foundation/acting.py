"""What acting needs, for every role that acts: a weights snapshot, the policy built from it,
and one episode's rollout.

    policy = Policy(seed=0)
    policy.refresh(WeightsSnapshot(version, {"actor": actor, "obs_norm": obs_norm}, spec))
    episode, success = rollout(env, policy, seed=7, rng=rng, deterministic=True)

The sampler acts with these to collect experience, the evaluator to score a policy, the sync
mode to train without a fleet, and the export path (deploy_npu/routing.py) to collect
calibration states; none of them needs another role's code for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from foundation.config import ConfigError, RunConfig
from foundation.policy import ModelSpec, NumpyActor


@dataclass(frozen=True)
class WeightsSnapshot:
    """One version of the aggregator's weights: flat float32 vectors by group, and the networks' spec."""

    version: int
    tensors: dict[str, np.ndarray]
    spec: ModelSpec


@dataclass
class Episode:
    """One episode's arrays, leading dim T."""

    obs: np.ndarray
    achieved_goal: np.ndarray  # achieved goal *after* each step (from next observation)
    desired_goal: np.ndarray
    action: np.ndarray
    next_obs: np.ndarray
    terminated: np.ndarray
    reward: np.ndarray  # the env's own reward of each step (sim.reward: sparse, or Meta-World's shaped)
    success: np.ndarray  # the env's info["is_success"] after each step

    def __len__(self) -> int:
        return int(self.action.shape[0])


def check_keep_dims(keep: int, act_dim: int) -> None:
    """sampler.random_keep_dims against the task's action width (ConfigError naming the field)."""
    if keep > act_dim:
        raise ConfigError(
            f"sampler.random_keep_dims ({keep}) must be <= the task's action dimensions ({act_dim})",
            field="sampler.random_keep_dims",
        )


class Policy:
    """The newest actor this process has; acts stochastically or deterministically."""

    def __init__(
        self,
        seed: int = 0,
        random_action_prob: float = 0.0,
        random_keep_dims: int = 0,
        random_action_repeat: int = 1,
    ) -> None:
        self.version = -1
        self.actor: NumpyActor | None = None
        self.random_action_prob = random_action_prob  # stochastic acting only; see SamplerConfig
        self.random_keep_dims = random_keep_dims  # trailing dims a random step takes from the policy
        # A random stretch of n steps starts with probability p / (n - p (n - 1)), which keeps p the
        # share of random steps (a stretch of n random steps per 1/start - 1 + n steps).
        n = random_action_repeat
        self.random_action_repeat = n
        self._stretch_start = random_action_prob / (n - random_action_prob * (n - 1)) if random_action_prob else 0.0
        self._held: np.ndarray | None = None  # the random stretch's action, and its steps left
        self._held_left = 0
        self._rng = np.random.default_rng(seed)

    @classmethod
    def exploring(cls, config: RunConfig, seed: int) -> Policy:
        """The acting policy of a sampler: the actor's own sampling plus epsilon-random steps."""
        return cls(
            seed=seed,
            random_action_prob=config.sampler.random_action_prob,
            random_keep_dims=config.sampler.random_keep_dims,
            random_action_repeat=config.sampler.random_action_repeat,
        )

    @classmethod
    def fixed(cls, version: int, actor: np.ndarray, obs_norm: np.ndarray, spec: ModelSpec) -> Policy:
        """A policy that acts with fixed weights (a checkpoint's, an export's), no exploration."""
        policy = cls()
        policy.refresh(WeightsSnapshot(version, {"actor": actor, "obs_norm": obs_norm}, spec))
        return policy

    def refresh(self, snapshot: WeightsSnapshot | None) -> bool:
        if snapshot is None or snapshot.version == self.version:
            return False
        check_keep_dims(self.random_keep_dims, snapshot.spec.act_dim)
        self.actor = NumpyActor(snapshot.spec, snapshot.tensors["actor"], snapshot.tensors["obs_norm"])
        self.version = snapshot.version
        return True

    def new_episode(self) -> None:
        """An episode starts: a random stretch of the last one ends (rollout calls this)."""
        self._held, self._held_left = None, 0

    def _random_step(self) -> np.ndarray | None:
        """The uniform action of this step if it is a random one (a stretch going on, or one
        starting now), else None."""
        assert self.actor is not None, "refresh() with weights before acting"
        if self._held is not None and self._held_left > 0:
            self._held_left -= 1
            return self._held.copy()
        if self._rng.random() >= self._stretch_start:
            return None
        action = self._rng.uniform(-1.0, 1.0, self.actor.spec.act_dim).astype(np.float32)
        if self.random_action_repeat > 1:
            self._held, self._held_left = action.copy(), self.random_action_repeat - 1
        return action

    def act(self, obs: dict[str, np.ndarray], deterministic: bool, task: int = 0) -> np.ndarray:
        """An action for `obs` of the run's task place `task` (multi-task runs; 0 otherwise)."""
        assert self.actor is not None, "refresh() with weights before acting"
        action = None if deterministic or self.random_action_prob <= 0 else self._random_step()
        if action is not None:
            if self.random_keep_dims:  # e.g. Fetch's gripper: a random step does not open a grasp
                keep = self.random_keep_dims
                action[-keep:] = self._own_action(_input_row(obs), task)[-keep:]
            return action
        x = _input_row(obs)
        if deterministic:
            return self.actor.deterministic(x, task)[0]
        return self._own_action(x, task)

    def _own_action(self, x: np.ndarray, task: int) -> np.ndarray:
        """The actor's stochastic action for the input row `x` [1, input]."""
        assert self.actor is not None
        return self.actor.sample(x, self._rng, task)[0]


class Acting(Protocol):
    """What rollout() acts with: a Policy, or any controller with its act() (the scripted experts
    of sim/metaworld_experts.py, which demonstrate a task)."""

    def act(self, obs: dict[str, np.ndarray], deterministic: bool, task: int = 0) -> np.ndarray: ...


def _input_row(obs: dict[str, np.ndarray]) -> np.ndarray:
    """The actor's input [1, input]: observation ++ desired_goal, float32."""
    return np.concatenate([obs["observation"], obs["desired_goal"]]).astype(np.float32)[None]


def rollout(
    env,
    policy: Acting | None,
    seed: int | None,
    rng: np.random.Generator,
    deterministic: bool = False,
    task: int = 0,
    until_success: bool = False,
):
    """One episode of the run's task place `task`; policy None means uniform random actions.
    Returns (Episode, success): success is the last step's, which `until_success` makes the
    first successful step's by ending the episode there (the evaluator's any-step measure)."""
    obs, _ = env.reset(seed=seed)
    if (new_episode := getattr(policy, "new_episode", None)) is not None:
        new_episode()  # a Policy's held random action ends with its episode; an act-only policy has none
    keys = ("obs", "ag", "dg", "action", "next_obs", "term", "reward", "success")
    rows: dict[str, list[np.ndarray | float]] = {k: [] for k in keys}
    info: dict = {}
    while True:
        if policy is None:
            action = rng.uniform(-1.0, 1.0, env.action_space.shape).astype(np.float32)
        else:
            action = policy.act(obs, deterministic, task)
        next_obs, reward, terminated, truncated, info = env.step(action)
        success = float(info.get("is_success", 0.0))
        for key, value in (
            ("obs", obs["observation"]),
            ("ag", next_obs["achieved_goal"]),
            ("dg", obs["desired_goal"]),
            ("action", action),
            ("next_obs", next_obs["observation"]),
            ("term", float(terminated)),
            ("reward", float(reward)),
            ("success", success),
        ):
            rows[key].append(value)
        obs = next_obs
        if terminated or truncated or (until_success and success):
            break
    episode = Episode(
        obs=np.asarray(rows["obs"], np.float32),
        achieved_goal=np.asarray(rows["ag"], np.float32),
        desired_goal=np.asarray(rows["dg"], np.float32),
        action=np.asarray(rows["action"], np.float32),
        next_obs=np.asarray(rows["next_obs"], np.float32),
        terminated=np.asarray(rows["term"], np.float32),
        reward=np.asarray(rows["reward"], np.float32),
        success=np.asarray(rows["success"], bool),
    )
    return episode, bool(episode.success[-1])
