"""Soft Actor-Critic for goal-conditioned tasks, as small pure functions.

Read with Haarnoja et al. 2018 ("Soft Actor-Critic Algorithms and Applications") beside it:

    critic:  J_Q  = E[(Q_i(s,g,a) - y)^2],   y = r + gamma (1 - d) (min_j Qt_j(s',g,a') - alpha log pi(a'|s',g))
    actor:   J_pi = E[alpha log pi(a|s,g) - min_j Q_j(s,g,a)],   a ~ pi(.|s,g) reparameterized
    alpha:   J_a  = E[-log_alpha (log pi(a|s,g) + target_entropy)]

The learner computes all three gradients against one weight version and ships them; the
aggregator owns the optimizers and the target-network update (see aggregator/core.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from learner.models import SACModel, norm_stats


@dataclass(frozen=True)
class Batch:
    """Torch view of sampled transitions; obs_goal = concat(obs, goal)."""

    obs_goal: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_obs_goal: torch.Tensor
    done: torch.Tensor

    @classmethod
    def from_numpy(cls, obs, goal, action, reward, next_obs, done, device: str | torch.device = "cpu") -> Batch:
        def t(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(device)

        return cls(
            obs_goal=t(np.concatenate([obs, goal], axis=1)),
            action=t(action),
            reward=t(reward),
            next_obs_goal=t(np.concatenate([next_obs, goal], axis=1)),
            done=t(done),
        )


@dataclass(frozen=True)
class SACHyperparams:
    gamma: float
    target_entropy: float
    # Sparse Fetch rewards lie in [-1, 0], so every return lies in [-1/(1-gamma), 0]; clipping
    # the target to that range is the stabiliser the HER paper uses (Andrychowicz et al. 2017).
    clip_return: bool = True


@dataclass(frozen=True)
class GradientResult:
    grads: dict[str, np.ndarray]  # one flat float32 vector per gradient group
    norm_stats: np.ndarray  # input statistics of this batch, for the shared normalizer
    metrics: dict[str, float]


def critic_loss(model: SACModel, batch: Batch, hp: SACHyperparams) -> torch.Tensor:
    alpha = model.log_alpha.detach().exp()
    with torch.no_grad():
        next_action, next_log_prob = model.actor.sample(batch.next_obs_goal)
        tq1, tq2 = model.critic_target(batch.next_obs_goal, next_action)
        soft_value = torch.min(tq1, tq2) - alpha * next_log_prob
        target = batch.reward + hp.gamma * (1.0 - batch.done) * soft_value
        if hp.clip_return:
            target = target.clamp(-1.0 / (1.0 - hp.gamma), 0.0)
    q1, q2 = model.critic(batch.obs_goal, batch.action)
    return ((q1 - target) ** 2).mean() + ((q2 - target) ** 2).mean()


def actor_and_alpha_loss(model: SACModel, batch: Batch, hp: SACHyperparams) -> tuple[torch.Tensor, torch.Tensor]:
    action, log_prob = model.actor.sample(batch.obs_goal)
    q1, q2 = model.critic(batch.obs_goal, action)
    alpha = model.log_alpha.detach().exp()
    actor_loss = (alpha * log_prob - torch.min(q1, q2)).mean()
    alpha_loss = -(model.log_alpha * (log_prob.detach() + hp.target_entropy)).mean()
    return actor_loss, alpha_loss


def _flat(grads: tuple[torch.Tensor, ...]) -> np.ndarray:
    return torch.cat([g.reshape(-1) for g in grads]).cpu().numpy().astype(np.float32, copy=False)


def compute_gradients(model: SACModel, batch: Batch, hp: SACHyperparams) -> GradientResult:
    """All SAC gradients against the model's current weights, without touching the weights."""
    critic_params = model.group_parameters("critic")
    actor_params = model.group_parameters("actor")
    q_loss = critic_loss(model, batch, hp)
    critic_grads = torch.autograd.grad(q_loss, critic_params)
    pi_loss, a_loss = actor_and_alpha_loss(model, batch, hp)
    # The actor's gradient must not flow into the critic: ask autograd for actor params only.
    actor_grads = torch.autograd.grad(pi_loss, actor_params)
    alpha_grads = torch.autograd.grad(a_loss, [model.log_alpha])
    return GradientResult(
        grads={"actor": _flat(actor_grads), "critic": _flat(critic_grads), "log_alpha": _flat(alpha_grads)},
        norm_stats=norm_stats(batch.obs_goal.cpu().numpy()),
        metrics={
            "loss/critic": q_loss.item(),
            "loss/actor": pi_loss.item(),
            "loss/alpha": a_loss.item(),
            "alpha": model.log_alpha.detach().exp().item(),
        },
    )
