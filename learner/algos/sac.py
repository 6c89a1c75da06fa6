"""Soft Actor-Critic for goal-conditioned tasks, as small pure functions.

Read with Haarnoja et al. 2018 ("Soft Actor-Critic Algorithms and Applications") beside it:

    critic:  J_Q  = E[(Q_i(s,g,a) - y)^2],   y = r + gamma (1 - d) (min_j Qt_j(s',g,a') - alpha log pi(a'|s',g))
    actor:   J_pi = E[alpha log pi(a|s,g) - min_j Q_j(s,g,a)],   a ~ pi(.|s,g) reparameterized
    alpha:   J_a  = E[-log_alpha (log pi(a|s,g) + target_entropy)]

A multi-task run with model.task_alpha keeps one temperature per task (MT-SAC, Yu et al. 2019):
each row's alpha is its task's, and each task's entropy is held to the target on its own rows.
With one shared alpha, a solved task's near-deterministic policy (FetchReach: log pi ~ 19 per
action against a target of 4) lifts the batch's mean log-probability, so the shared alpha
settles where the unsolved task's policy stays noisier than the target (FetchPush: log pi 2.9).

The learner computes all three gradients against one weight version and ships them; the
aggregator owns the optimizers and the target-network update (see aggregator/core.py).
TQC (tqc.py) and CrossQ (crossq.py) keep this actor and temperature and change the critics.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from learner.algorithm import ActorLoss, Batch, Objective
from nets.models import SACModel


def row_log_alpha(model: SACModel, batch: Batch) -> torch.Tensor:
    """Each row's log temperature: its task's with one per task, else the shared one ([1],
    broadcast)."""
    if model.log_alpha.numel() == 1 or batch.task is None:
        return model.log_alpha
    return model.log_alpha[batch.task]


def critic_loss(model: SACModel, batch: Batch, objective: Objective) -> torch.Tensor:
    """J_Q: both critics toward the soft TD target of the smaller target critic."""
    alpha = row_log_alpha(model, batch).detach().exp()
    with torch.no_grad():
        next_action, next_log_prob = model.actor.sample(batch.next_obs_goal, batch.task)
        tq1, tq2 = model.critic_target(batch.next_obs_goal, next_action, batch.task)
        target = objective.target(batch.reward, batch.done, torch.min(tq1, tq2) - alpha * next_log_prob)
    q1, q2 = model.critic(batch.obs_goal, batch.action, batch.task)
    return ((q1 - target) ** 2).mean() + ((q2 - target) ** 2).mean()


def policy_loss(
    model: SACModel, batch: Batch, objective: Objective, log_prob: torch.Tensor, q: torch.Tensor
) -> ActorLoss:
    """J_pi and J_a from the log-probabilities of the actor's reparameterized actions and the
    critics' value `q` of them (each algorithm's own reading of its critics)."""
    log_alpha = row_log_alpha(model, batch)
    actor = (log_alpha.detach().exp() * log_prob - q).mean()
    alpha = -(log_alpha * (log_prob.detach() + objective.target_entropy)).mean()
    return ActorLoss(actor, alpha)


def value(model: SACModel, obs_goal: torch.Tensor, action: torch.Tensor, task: torch.Tensor | None) -> torch.Tensor:
    """min_j Q_j(s,g,a): the smaller of the two critics."""
    q1, q2 = model.critic(obs_goal, action, task)
    return torch.min(q1, q2)


def actor_loss(model: SACModel, batch: Batch, objective: Objective) -> ActorLoss:
    """J_pi against the smaller of the two critics, and J_a."""
    action, log_prob = model.actor.sample(batch.obs_goal, batch.task)
    return policy_loss(model, batch, objective, log_prob, value(model, batch.obs_goal, action, batch.task))


@dataclass(frozen=True)
class SAC:
    """learner.algo 'sac' (learner.algorithm.Algorithm)."""

    def critic_loss(self, model: SACModel, batch: Batch, objective: Objective) -> torch.Tensor:
        return critic_loss(model, batch, objective)

    def actor_loss(self, model: SACModel, batch: Batch, objective: Objective) -> ActorLoss:
        return actor_loss(model, batch, objective)

    def value(
        self, model: SACModel, obs_goal: torch.Tensor, action: torch.Tensor, task: torch.Tensor | None
    ) -> torch.Tensor:
        return value(model, obs_goal, action, task)
