"""Meta-World's scripted experts, one per task, as policies that act in fleetrl's goal envs.

    expert = ExpertPolicy(get_task("MetaWorld-push-v3"), env.action_space)
    episode, success = rollout(env, expert, seed=seed, rng=rng)   # foundation.acting.rollout

Meta-World ships a hand-written controller per task (metaworld.policies, metaworld 3.1.1) that
reads the task's flat 39-d observation: the goal env's 36-d observation followed by the desired
goal (sim/metaworld.py splits it the other way). The sampler stores their episodes as
demonstrations (sampler.demo_episodes); tests/test_sim_metaworld_experts.py checks that each
solves its task through make_env and that success agrees with Meta-World's at every step.

The controllers command position deltas in Meta-World's own units; an action beyond the env's
action space is clipped to it, which is what the env applies anyway. Fetch tasks have no such
controller: foundation.config_experience.EXPERT_TASKS names the tasks that do, and this module
refuses to import when its table and that tuple differ.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from foundation.config_experience import EXPERT_TASKS
from sim.registry import TaskSpec, get_task

# Registry name -> the class of metaworld.policies that solves it.
EXPERTS: dict[str, str] = {
    "MetaWorld-reach-v3": "SawyerReachV3Policy",
    "MetaWorld-push-v3": "SawyerPushV3Policy",
    "MetaWorld-pick-place-v3": "SawyerPickPlaceV3Policy",
    "MetaWorld-door-open-v3": "SawyerDoorOpenV3Policy",
    "MetaWorld-drawer-open-v3": "SawyerDrawerOpenV3Policy",
    "MetaWorld-drawer-close-v3": "SawyerDrawerCloseV3Policy",
    "MetaWorld-button-press-topdown-v3": "SawyerButtonPressTopdownV3Policy",
    "MetaWorld-peg-insert-side-v3": "SawyerPegInsertionSideV3Policy",
    "MetaWorld-window-open-v3": "SawyerWindowOpenV3Policy",
    "MetaWorld-window-close-v3": "SawyerWindowCloseV3Policy",
}
if tuple(EXPERTS) != EXPERT_TASKS:
    raise RuntimeError(f"sim.metaworld_experts: EXPERTS {tuple(EXPERTS)} differ from EXPERT_TASKS {EXPERT_TASKS}")


def scripted_expert(name: str) -> Any:
    """A new instance of the scripted controller of task `name` (a registry name); ValueError
    naming the tasks that have one for any other."""
    if name not in EXPERTS:
        raise ValueError(f"{name} has no scripted expert; tasks with one: {', '.join(EXPERTS)}")
    from metaworld import policies  # imported only by who runs an expert

    # Its controllers warn that their gains may command more than [-1, 1]; act() clips to it.
    warnings.filterwarnings("ignore", message=r"Constant\(s\) may be too high", category=UserWarning)
    return getattr(policies, EXPERTS[name])()


class ExpertPolicy:
    """A task's scripted expert behind the act() of foundation.acting.Policy, so rollout() runs
    it like any policy. It reads the first `spec.obs_dim` entries of the observation (a
    multi-task run pads it and appends the task one-hot) and the desired goal."""

    def __init__(self, spec: TaskSpec | str, action_space: Any) -> None:
        self.spec = spec if isinstance(spec, TaskSpec) else get_task(spec)
        self.expert = scripted_expert(self.spec.name)
        self.low = np.asarray(action_space.low, np.float32)
        self.high = np.asarray(action_space.high, np.float32)

    def act(self, obs: dict[str, np.ndarray], deterministic: bool = True, task: int = 0) -> np.ndarray:
        """The expert's action for `obs`, clipped to the action space (it acts the same whatever
        `deterministic` and `task` say: one controller, one task)."""
        own = np.asarray(obs["observation"], np.float64)[: self.spec.obs_dim]
        flat = np.concatenate([own, np.asarray(obs["desired_goal"], np.float64)])
        return np.clip(np.asarray(self.expert.get_action(flat), np.float32), self.low, self.high)
