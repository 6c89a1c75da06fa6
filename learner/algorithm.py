"""What a learning algorithm is to the learner: two losses on a batch, behind one protocol.

    algorithm = build_algorithm(config.learner)                 # learner/algos/: by learner.algo
    objective = Objective(gamma, target_entropy, n_step)        # what every algorithm's targets share
    while learning:
        batch = batches.next(stop)                              # sampled transitions, as tensors
        q_loss = algorithm.critic_loss(model, batch, objective) # its gradient: the critic group
        pi = algorithm.actor_loss(model, batch, objective)      # pi.actor: actor group; pi.alpha: log_alpha
        push(gradients of both)                                 # the aggregator steps, never the learner

`value` is the algorithm's reading of its critics for any action, the one its actor loss climbs:
learner/demos.py compares a demonstration's action with the policy's by it (the Q-filter).

learner/gradients.py runs this loop body (compute_gradients): autocast, the MoE routers'
balancing term, flat gradient vectors. The critic loss comes first on every batch: CrossQ's
updates the running statistics its actor loss reads. Neither loss changes a weight. What an
algorithm needs of the networks (outputs per critic, batch renormalization) is its config
section's `critics()` (foundation/config_algos.py), so the policy spec is built without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import torch

from nets.models import SACModel


@dataclass(frozen=True)
class Batch:
    """Torch view of sampled transitions; obs_goal = concat(obs, goal)."""

    obs_goal: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_obs_goal: torch.Tensor
    done: torch.Tensor
    task: torch.Tensor | None = None  # each row's place in a multi-task run (None: one task)
    demo: torch.Tensor | None = None  # 1.0 on an expert demonstration's rows, else 0.0 (None: none is)

    @classmethod
    def from_numpy(
        cls, obs, goal, action, reward, next_obs, done, device: str | torch.device = "cpu", task=None, demo=None
    ) -> Batch:
        def t(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(device)

        return cls(
            obs_goal=t(np.concatenate([obs, goal], axis=1)),
            action=t(action),
            reward=t(reward),
            next_obs_goal=t(np.concatenate([next_obs, goal], axis=1)),
            done=t(done),
            task=None if task is None else torch.as_tensor(np.asarray(task, np.int64), device=device),
            demo=None if demo is None else t(demo),
        )


@dataclass(frozen=True)
class Objective:
    """What every algorithm's targets share: the discount, the rows' n-step returns, the clip, and
    the temperature's target entropy."""

    gamma: float
    target_entropy: float
    n_step: int = 1  # learner.n_step: rewards summed over n steps (sampler/her.py); bootstrap with gamma^n
    # Sparse Fetch rewards lie in [-1, 0], so every return lies in [-1/(1-gamma), 0]; clipping
    # the target to that range is the stabiliser the HER paper uses (Andrychowicz et al. 2017).
    clip_return: bool = True

    @property
    def discount(self) -> float:
        """What the next state's value is discounted by: gamma^n over an n-step row."""
        return self.gamma**self.n_step

    def target(self, reward: torch.Tensor, done: torch.Tensor, next_value: torch.Tensor) -> torch.Tensor:
        """y = r + gamma^n (1 - d) V(s'), clipped to the return range with clip_return."""
        target = reward + self.discount * (1.0 - done) * next_value
        return target.clamp(-1.0 / (1.0 - self.gamma), 0.0) if self.clip_return else target


class ActorLoss(NamedTuple):
    actor: torch.Tensor  # its gradient goes to the actor group only, never into the critics
    alpha: torch.Tensor  # the temperature's loss: its gradient is log_alpha's


class Algorithm(Protocol):
    """One algorithm's losses (learner/algos/), pure functions of the model's current weights.
    The call loop is in this module's docstring."""

    def critic_loss(self, model: SACModel, batch: Batch, objective: Objective) -> torch.Tensor:
        """The critics' regression loss toward the algorithm's TD target (no gradient through it)."""
        ...

    def actor_loss(self, model: SACModel, batch: Batch, objective: Objective) -> ActorLoss:
        """The actor's loss through the critics, and the temperature's loss."""
        ...

    def value(
        self, model: SACModel, obs_goal: torch.Tensor, action: torch.Tensor, task: torch.Tensor | None
    ) -> torch.Tensor:
        """Each row's value of `action` at `obs_goal` [rows], as the actor loss reads the critics."""
        ...
