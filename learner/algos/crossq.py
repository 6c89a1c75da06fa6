"""CrossQ: SAC without target networks, its critics batch-renormalized, as small pure functions.

Read with Bhatt et al. 2024 ("CrossQ: Batch Normalization in Deep Reinforcement Learning for
Greater Sample Efficiency and Simplicity") and nets/renorm.py (the critics' layers, and how they
differ from sb3-contrib's) beside it. The critics see (s, a) and (s', a') as one batch, so they
normalize with the statistics of both halves, and bootstrap from its second half:

    Q_i([s; s'], [a; a'])  ->  (Q_i(s,a), Q_i(s',a')),   a' ~ pi(.|s',g)
    critic:  J_Q  = E[(Q_i(s,g,a) - y)^2],   y = r + gamma (1 - d) sg(min_j Q_j(s',g,a') - alpha log pi(a'|s',g))
    actor:   J_pi = E[alpha log pi(a|s,g) - min_j Q_j(s,g,a)]   (critics on their running statistics)

The temperature is SAC's. The losses are not compiled: the critic loss updates the running
statistics in place (learner.compile is refused with it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from learner.algorithm import ActorLoss, Batch, Objective
from learner.algos.sac import policy_loss, row_log_alpha
from nets.models import SACModel
from nets.renorm import running_statistics


def critic_loss(model: SACModel, batch: Batch, objective: Objective) -> torch.Tensor:
    """J_Q: both halves (s, a) and (s', a') through the critics as one batch (training mode: its
    statistics, and one update of the running ones), the next half's values the target with the
    gradient stopped."""
    alpha = row_log_alpha(model, batch).detach().exp()
    with torch.no_grad():
        next_action, next_log_prob = model.actor.sample(batch.next_obs_goal, batch.task)
    rows = len(batch.action)
    task = None if batch.task is None else torch.cat([batch.task, batch.task])
    obs_goal = torch.cat([batch.obs_goal, batch.next_obs_goal])
    q1, q2 = model.critic(obs_goal, torch.cat([batch.action, next_action]), task)
    with torch.no_grad():
        target = objective.target(batch.reward, batch.done, torch.min(q1[rows:], q2[rows:]) - alpha * next_log_prob)
    return ((q1[:rows] - target) ** 2).mean() + ((q2[:rows] - target) ** 2).mean()


def value(model: SACModel, obs_goal: torch.Tensor, action: torch.Tensor, task: torch.Tensor | None) -> torch.Tensor:
    """min_j Q_j(s,g,a), the critics read on their running statistics."""
    with running_statistics(model.critic):
        q1, q2 = model.critic(obs_goal, action, task)
    return torch.min(q1, q2)


def actor_loss(model: SACModel, batch: Batch, objective: Objective) -> ActorLoss:
    """J_pi against the smaller critic read on its running statistics, and SAC's J_a."""
    action, log_prob = model.actor.sample(batch.obs_goal, batch.task)
    return policy_loss(model, batch, objective, log_prob, value(model, batch.obs_goal, action, batch.task))


@dataclass(frozen=True)
class CrossQ:
    """learner.algo 'crossq' (learner.algorithm.Algorithm)."""

    def critic_loss(self, model: SACModel, batch: Batch, objective: Objective) -> torch.Tensor:
        return critic_loss(model, batch, objective)

    def actor_loss(self, model: SACModel, batch: Batch, objective: Objective) -> ActorLoss:
        return actor_loss(model, batch, objective)

    def value(
        self, model: SACModel, obs_goal: torch.Tensor, action: torch.Tensor, task: torch.Tensor | None
    ) -> torch.Tensor:
        return value(model, obs_goal, action, task)
