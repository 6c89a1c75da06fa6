"""Behaviour cloning on demonstration rows, kept where the critic prefers the demonstration:
the Q-filter of Nair et al. 2018 ("Overcoming Exploration in Reinforcement Learning with
Demonstrations", sec. 4.3), for every algorithm of learner/algos/.

    bc = demo_bc(model, batch, coef, algorithm.value)   # learner/gradients.py adds bc.loss to J_pi
    bc.metrics()                                          # learner/demo/share, ... in TensorBoard

With a_pi = tanh(mu(s, g)) the actor's deterministic action, a_D a row's stored action, d its
demonstration mark and Q the critics' value the algorithm's actor climbs (Algorithm.value):

    keep_i = d_i * 1[Q(s_i, a_D,i) > Q(s_i, a_pi,i)]              (no gradient through the filter)
    L_BC   = coef * (1/B) sum_i keep_i ||a_pi,i - c(a_D,i)||^2    (B: the batch's rows)

c clamps the target into [-BC_TARGET_BOUND, BC_TARGET_BOUND]. Scripted experts (Meta-World's
policies) clip their actions to the bound of the action space, so many demonstrated actions are
exactly +-1, which tanh reaches only as mu -> infinity: cloned unclamped, they pull mu without
limit and the squashed Gaussian's log-probability (its -log(1 - tanh(u)^2) term) with it. At 0.97
the target is tanh(2.09), where the actor's mean stays finite. The Q-filter still compares the
stored action, the one the environment ran.

Its gradient reaches the actor only: both values are read without gradient, and learner/gradients.py
differentiates the actor loss for the actor's parameters alone. A demonstration's action that the
critic values below the policy's own is not imitated, so the term fades as the policy overtakes
the expert.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from learner.algorithm import Batch
from nets.models import SACModel

BC_TARGET_BOUND = 0.97  # |target| of the cloned action: inside tanh's open range (module docstring)

# (model, obs_goal, action, task) -> each row's value [rows]: the reading of the critics an actor climbs
ValueFn = Callable[[SACModel, torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


class DemoTerm(NamedTuple):
    loss: torch.Tensor  # coef * L_BC, added to the actor's loss
    share: torch.Tensor  # demonstration rows / batch rows
    passed: torch.Tensor  # rows the Q-filter kept / demonstration rows (0 with none)

    def metrics(self) -> dict[str, float]:
        return {"loss/bc": self.loss.item(), "demo/share": self.share.item(), "demo/q_filter_pass": self.passed.item()}


def q_filtered_bc(
    policy_action: torch.Tensor,
    demo_action: torch.Tensor,
    demo: torch.Tensor,
    q_demo: torch.Tensor,
    q_policy: torch.Tensor,
    coef: float,
) -> DemoTerm:
    """L_BC of the module docstring from the actions [B, act_dim], the marks `demo` [B] (1.0 on a
    demonstration's row) and the two values [B]; `policy_action` carries the gradient, and the
    target is the demonstrated action clamped to BC_TARGET_BOUND."""
    with torch.no_grad():
        keep = demo * (q_demo > q_policy).to(demo.dtype)
        share = demo.mean()
        passed = keep.sum() / demo.sum().clamp_min(1.0)
    target = demo_action.detach().clamp(-BC_TARGET_BOUND, BC_TARGET_BOUND)
    error = (policy_action - target).pow(2).sum(-1)
    return DemoTerm(coef * (keep * error).mean(), share, passed)


def demo_bc(model: SACModel, batch: Batch, coef: float, value: ValueFn) -> DemoTerm:
    """The Q-filtered behaviour cloning term of `batch` (whose `demo` marks are set). Both values
    come from one pass of the critics over the batch's states twice (the demonstrated actions,
    then the policy's)."""
    assert batch.demo is not None, "a batch without demonstration marks has no behaviour-cloning term"
    policy_action = model.actor.deterministic(batch.obs_goal, batch.task)
    with torch.no_grad():
        task = None if batch.task is None else torch.cat([batch.task, batch.task])
        both = value(model, torch.cat([batch.obs_goal, batch.obs_goal]), torch.cat([batch.action, policy_action]), task)
        q_demo, q_policy = both.float().chunk(2)
    return q_filtered_bc(policy_action, batch.action, batch.demo, q_demo, q_policy, coef)
