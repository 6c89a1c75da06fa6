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

`algo = "ddpg"` trains the same networks the way the HER paper does (Andrychowicz et al. 2017,
DDPG with a deterministic actor, one critic and an action penalty):

    critic:  J_Q  = E[(Q_1(s,g,a) - y)^2],   y = r + gamma (1 - d) Qt_1(s',g,tanh(mu(s',g)))
    actor:   J_pi = E[-Q_1(s,g,tanh(mu(s,g))) + action_l2 * tanh(mu(s,g))^2]

The actor's log_std head, the second critic and the temperature get zero gradients (one weight
layout for both algorithms, so every other role is unchanged); samplers act with tanh(mu) plus
Gaussian noise (sampler.action_noise_std). One critic and no log-probabilities make an update
about 1.7x cheaper than SAC's on these CPUs.

`algo = "tqc"` is SAC with distributional critics (Kuznetsov et al. 2020, "Controlling
Overestimation Bias with Truncated Mixture of Continuous Distributional Quantile Critics"; read
beside sb3-contrib's tqc.py, rl-zoo's choice for the Fetch tasks). Each critic predicts M
quantiles Z_i^m (tau_m = (m + 1/2) / M); the targets are the 2M atoms of both target critics at
(s', a') but the largest 2 * tqc_drop, each y_k = r + gamma (1 - d) (z_k - alpha log pi):

    critic:  J_Z  = sum_i mean_{m,k} |tau_m - 1{y_k < Z_i^m}| huber_1(y_k - Z_i^m)
    actor:   J_pi = E[alpha log pi(a|s,g) - mean_{i,m} Z_i^m(s,g,a)]

The truncation, not the min of two critics, curbs overestimation; the temperature is SAC's.
Actor, samplers, evaluator and export are SAC's: only the critics' output width differs.

`algo = "crossq"` is SAC without target networks (Bhatt et al. 2024; learner/renorm.py): the
critics batch-renormalize, see (s, a) and (s', a') as one batch and bootstrap from its second
half; the actor's loss reads them on their running statistics.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch.nn import functional as F

from foundation.config import RunConfig
from foundation.cpu import has_bf16
from learner.balance import moe_layers, with_balance
from learner.flat import FlatSet, flatten
from learner.models import SACModel, norm_stats, one_mix_per_update
from learner.renorm import running_statistics


@dataclass(frozen=True)
class Batch:
    """Torch view of sampled transitions; obs_goal = concat(obs, goal)."""

    obs_goal: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_obs_goal: torch.Tensor
    done: torch.Tensor
    task: torch.Tensor | None = None  # each row's place in a multi-task run (None: one task)

    @classmethod
    def from_numpy(
        cls, obs, goal, action, reward, next_obs, done, device: str | torch.device = "cpu", task=None
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
        )


@dataclass(frozen=True)
class SACHyperparams:
    gamma: float
    target_entropy: float
    n_step: int = 1  # learner.n_step: rewards summed over n steps (sampler/her.py); bootstrap with gamma^n
    # Sparse Fetch rewards lie in [-1, 0], so every return lies in [-1/(1-gamma), 0]; clipping
    # the target to that range is the stabiliser the HER paper uses (Andrychowicz et al. 2017).
    clip_return: bool = True
    balance_coef: float = 0.01  # MoE: weight of the load-balancing loss (Switch Transformer's alpha)
    router_decay: float = 1.0  # MoE: lambda of beta_t = exp(-lambda * ||grad J||)
    algo: str = "sac"  # or "ddpg", "tqc" or "crossq"
    tqc_drop: int = 2  # tqc: the largest target quantiles dropped per critic
    action_l2: float = 1.0  # ddpg: weight of the actor's action penalty (the HER paper's)
    autocast: str = "off"  # or "bf16": losses under torch.autocast (learner.autocast, "auto" resolved)
    compile: bool = False  # learner.compile: the losses under torch.compile (dense models)
    mix_once: bool = True  # learner.mix_once: one expert mix per MoE layer and update (one_mix_per_update)

    @property
    def discount(self) -> float:
        """What the next state's value is discounted by: gamma^n over an n-step row."""
        return self.gamma**self.n_step

    @classmethod
    def for_run(cls, config: RunConfig, act_dim: int) -> SACHyperparams:
        entropy = config.learner.target_entropy
        return cls(
            gamma=config.learner.gamma,
            n_step=config.learner.n_step,
            clip_return=config.sim.reward == "sparse",  # a shaped reward's returns are not in [-1/(1-gamma), 0]
            target_entropy=entropy if entropy is not None else -float(act_dim),
            balance_coef=config.model.balance_coef,
            router_decay=config.model.router_decay,
            algo=config.learner.algo,
            tqc_drop=config.learner.tqc_drop,
            action_l2=config.learner.action_l2,
            autocast=resolve_autocast(config.learner.autocast, config.learner.device),
            compile=config.learner.compile,
            mix_once=config.learner.mix_once,
        )


def resolve_autocast(autocast: str, device: str = "cpu", cpuinfo: str | None = None) -> str:
    """learner.autocast as this learner runs it: 'auto' is 'bf16' on a CPU learner whose CPU has
    BF16 instructions (foundation.cpu.has_bf16; `cpuinfo`: /proc/cpuinfo's text, None reads it),
    else 'off' (a CUDA learner too: unmeasured there). Resolved where the learner runs, so each
    host of a fleet decides for its own CPU."""
    if autocast != "auto":
        return autocast
    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    return "bf16" if on_cpu and has_bf16(cpuinfo) else "off"


@dataclass(frozen=True)
class GradientResult:
    grads: dict[str, np.ndarray]  # one flat float32 vector per gradient group
    norm_stats: np.ndarray  # input statistics of this batch, for the shared normalizer
    metrics: dict[str, float]


def row_log_alpha(model: SACModel, batch: Batch) -> torch.Tensor:
    """Each row's log temperature: its task's with one per task, else the shared one ([1],
    broadcast)."""
    if model.log_alpha.numel() == 1 or batch.task is None:
        return model.log_alpha
    return model.log_alpha[batch.task]


def critic_loss(model: SACModel, batch: Batch, hp: SACHyperparams) -> torch.Tensor:
    alpha = row_log_alpha(model, batch).detach().exp()
    with torch.no_grad():
        next_action, next_log_prob = model.actor.sample(batch.next_obs_goal, batch.task)
        tq1, tq2 = model.critic_target(batch.next_obs_goal, next_action, batch.task)
        soft_value = torch.min(tq1, tq2) - alpha * next_log_prob
        target = batch.reward + hp.discount * (1.0 - batch.done) * soft_value
        if hp.clip_return:
            target = target.clamp(-1.0 / (1.0 - hp.gamma), 0.0)
    q1, q2 = model.critic(batch.obs_goal, batch.action, batch.task)
    return ((q1 - target) ** 2).mean() + ((q2 - target) ** 2).mean()


def quantile_huber_loss(current: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Quantile regression with the Huber loss (kappa 1) of `current` quantiles [batch, M] (tau_m =
    (m + 1/2) / M) toward `target` atoms [batch, K]: the mean over rows and (m, k) pairs."""
    quantiles = current.shape[-1]
    tau = ((torch.arange(quantiles, device=current.device, dtype=current.dtype) + 0.5) / quantiles).view(1, -1, 1)
    pairs = (len(current), quantiles, target.shape[-1])
    z, y = current.unsqueeze(2).expand(pairs), target.unsqueeze(1).expand(pairs)
    # torch's fused Huber kernels, forward and backward: 3.3x faster than the same arithmetic in
    # elementwise ops (both critics at batch 256, 25 quantiles, 46 atoms: 3.7 against 12 ms here)
    huber = F.huber_loss(z, y, reduction="none", delta=1.0)
    weight = torch.where(y < z.detach(), 1.0 - tau, tau)  # |tau - 1{y - z < 0}|
    return (weight * huber).mean()


def tqc_critic_loss(model: SACModel, batch: Batch, hp: SACHyperparams) -> torch.Tensor:
    alpha = row_log_alpha(model, batch).detach().exp().reshape(-1, 1)  # [1, 1] or per row [batch, 1]
    with torch.no_grad():
        next_action, next_log_prob = model.actor.sample(batch.next_obs_goal, batch.task)
        z1, z2 = model.critic_target(batch.next_obs_goal, next_action, batch.task)
        atoms = torch.cat([z1, z2], dim=1)
        # The largest 2 * tqc_drop dropped; the loss takes the rest in any order (unsorted topk:
        # 0.09 against 0.25 ms for a sort of 256 x 50 here).
        atoms = atoms.topk(atoms.shape[1] - 2 * hp.tqc_drop, dim=1, largest=False, sorted=False).values
        soft = atoms - alpha * next_log_prob.unsqueeze(1)
        target = batch.reward.unsqueeze(1) + hp.discount * (1.0 - batch.done.unsqueeze(1)) * soft
        if hp.clip_return:
            target = target.clamp(-1.0 / (1.0 - hp.gamma), 0.0)
    q1, q2 = model.critic(batch.obs_goal, batch.action, batch.task)
    return quantile_huber_loss(q1, target) + quantile_huber_loss(q2, target)


def crossq_critic_loss(model: SACModel, batch: Batch, hp: SACHyperparams) -> torch.Tensor:
    """CrossQ's critic loss: both halves (s, a) and (s', a') through the critics as one batch
    (training mode: its statistics, and one update of the running ones), the next half's values
    the target with the gradient stopped."""
    alpha = row_log_alpha(model, batch).detach().exp()
    with torch.no_grad():
        next_action, next_log_prob = model.actor.sample(batch.next_obs_goal, batch.task)
    rows = len(batch.action)
    task = None if batch.task is None else torch.cat([batch.task, batch.task])
    obs_goal = torch.cat([batch.obs_goal, batch.next_obs_goal])
    q1, q2 = model.critic(obs_goal, torch.cat([batch.action, next_action]), task)
    with torch.no_grad():
        soft_value = torch.min(q1[rows:], q2[rows:]) - alpha * next_log_prob
        target = batch.reward + hp.discount * (1.0 - batch.done) * soft_value
        if hp.clip_return:
            target = target.clamp(-1.0 / (1.0 - hp.gamma), 0.0)
    return ((q1[:rows] - target) ** 2).mean() + ((q2[:rows] - target) ** 2).mean()


def actor_and_alpha_loss(model: SACModel, batch: Batch, hp: SACHyperparams) -> tuple[torch.Tensor, torch.Tensor]:
    action, log_prob = model.actor.sample(batch.obs_goal, batch.task)
    with running_statistics(model.critic) if hp.algo == "crossq" else contextlib.nullcontext():
        q1, q2 = model.critic(batch.obs_goal, action, batch.task)  # CrossQ's: on the running statistics
    # TQC's actor follows the mean of every quantile of both critics; SAC's the min of the two.
    q = torch.cat([q1, q2], dim=1).mean(1) if hp.algo == "tqc" else torch.min(q1, q2)
    log_alpha = row_log_alpha(model, batch)
    actor_loss = (log_alpha.detach().exp() * log_prob - q).mean()
    alpha_loss = -(log_alpha * (log_prob.detach() + hp.target_entropy)).mean()
    return actor_loss, alpha_loss


def ddpg_critic_loss(model: SACModel, batch: Batch, hp: SACHyperparams) -> torch.Tensor:
    with torch.no_grad():
        next_action = model.actor.deterministic(batch.next_obs_goal, batch.task)
        next_q = model.critic_target.q1_value(batch.next_obs_goal, next_action, batch.task)
        target = batch.reward + hp.discount * (1.0 - batch.done) * next_q
        if hp.clip_return:
            target = target.clamp(-1.0 / (1.0 - hp.gamma), 0.0)
    return ((model.critic.q1_value(batch.obs_goal, batch.action, batch.task) - target) ** 2).mean()


def ddpg_actor_loss(model: SACModel, batch: Batch, hp: SACHyperparams) -> torch.Tensor:
    action = model.actor.deterministic(batch.obs_goal, batch.task)
    q = model.critic.q1_value(batch.obs_goal, action, batch.task)
    return (-q + hp.action_l2 * action.pow(2).mean(-1)).mean()


class _Losses(NamedTuple):
    sac: Callable[[SACModel, Batch, SACHyperparams], torch.Tensor]
    tqc: Callable[[SACModel, Batch, SACHyperparams], torch.Tensor]
    actor: Callable[[SACModel, Batch, SACHyperparams], tuple[torch.Tensor, torch.Tensor]]


_LOSSES = _Losses(critic_loss, tqc_critic_loss, actor_and_alpha_loss)
_COMPILED: list[_Losses] = []


def _compiled() -> _Losses:
    """The loss functions under torch.compile (learner.compile; dense models only: a MoE's rows
    per task and routing are data-dependent), compiled on first use, forward and backward."""
    if not _COMPILED:
        # Each loss is backpropagated once, but autograd.grad asks for its parameters in two
        # calls for a MoE's balancing term; donated buffers would forbid that, and the dense
        # path does not need them.
        import torch._functorch.config as functorch_config

        functorch_config.donated_buffer = False
        compiled = [torch.compile(fn, dynamic=False) for fn in _LOSSES]
        _COMPILED.append(_Losses(*compiled))  # type: ignore[arg-type]  # torch.compile keeps the signature
    return _COMPILED[0]


def compute_gradients(model: SACModel, batch: Batch, hp: SACHyperparams, out: FlatSet | None = None) -> GradientResult:
    """All SAC gradients against the model's current weights, without touching the weights.
    MoE networks add their routers' load-balancing gradient, scaled by router decay. With
    hp.autocast "bf16" the matmuls run in bfloat16; parameters and gradients stay float32.
    `out` (GradientBuffers.next()): the flat gradients are written there, and stay valid only
    until that set is handed out again."""
    modules = (model.actor, model.critic, model.critic_target) if hp.mix_once else ()
    with one_mix_per_update(*modules):
        if hp.autocast == "bf16":
            with torch.autocast(batch.obs_goal.device.type, dtype=torch.bfloat16):
                return _gradients(model, batch, hp, out)
        return _gradients(model, batch, hp, out)


def _gradients(model: SACModel, batch: Batch, hp: SACHyperparams, out: FlatSet | None) -> GradientResult:
    critic_params = model.group_parameters("critic")
    actor_params = model.group_parameters("actor")
    metrics: dict[str, float] = {}
    if hp.algo == "ddpg":
        return _ddpg_gradients(model, batch, hp, critic_params, actor_params, out)
    losses = _compiled() if hp.compile and model.spec.kind != "moe" and hp.algo != "crossq" else _LOSSES
    if hp.algo == "crossq":
        q_loss = crossq_critic_loss(model, batch, hp)
    else:
        q_loss = (losses.tqc if hp.algo == "tqc" else losses.sac)(model, batch, hp)
    critic_grads = with_balance(q_loss, critic_params, moe_layers(model.critic), hp, "critic", metrics)
    pi_loss, a_loss = losses.actor(model, batch, hp)
    # The actor's gradient must not flow into the critic: ask autograd for actor params only.
    actor_layers = moe_layers(model.actor)
    if actor_layers:
        actor_grads = with_balance(pi_loss, actor_params, actor_layers, hp, "actor", metrics)
        alpha_grads = torch.autograd.grad(a_loss, [model.log_alpha])
    else:  # one backward: pi_loss reads alpha detached, a_loss log pi detached, so neither reaches the other's
        both = torch.autograd.grad(pi_loss + a_loss, [*actor_params, model.log_alpha])
        actor_grads, alpha_grads = both[:-1], both[-1:]
    return GradientResult(
        grads={
            "actor": flatten(actor_grads, out=out, group="actor"),
            "critic": flatten(critic_grads, out=out, group="critic"),
            "log_alpha": flatten(alpha_grads),
        },
        norm_stats=_batch_norm_stats(model, batch),
        metrics={
            "loss/critic": q_loss.item(),
            "loss/actor": pi_loss.item(),
            "loss/alpha": a_loss.item(),
            **_alpha_metrics(model),
            **metrics,
        },
    )


def _alpha_metrics(model: SACModel) -> dict[str, float]:
    """'alpha' (the mean over tasks with one per task) and, per task, 'alpha/task<i>'."""
    alpha = model.log_alpha.detach().exp()
    per_task = {f"alpha/task{i}": a for i, a in enumerate(alpha.tolist())} if len(alpha) > 1 else {}
    return {"alpha": alpha.mean().item(), **per_task}


def _batch_norm_stats(model: SACModel, batch: Batch) -> np.ndarray:
    rows = model.spec.norm_rows
    task = None if rows == 1 or batch.task is None else batch.task.cpu().numpy()
    return norm_stats(batch.obs_goal.cpu().numpy(), task, rows)


def _ddpg_gradients(model, batch: Batch, hp: SACHyperparams, critic_params, actor_params, out) -> GradientResult:
    q_loss = ddpg_critic_loss(model, batch, hp)
    critic_grads = torch.autograd.grad(q_loss, critic_params, allow_unused=True)  # Q2: unused
    pi_loss = ddpg_actor_loss(model, batch, hp)
    actor_grads = torch.autograd.grad(pi_loss, actor_params, allow_unused=True)
    return GradientResult(
        grads={
            "actor": flatten(actor_grads, actor_params, out, "actor"),
            "critic": flatten(critic_grads, critic_params, out, "critic"),
            "log_alpha": np.zeros(model.log_alpha.numel(), np.float32),
        },
        norm_stats=_batch_norm_stats(model, batch),
        metrics={"loss/critic": q_loss.item(), "loss/actor": pi_loss.item()},
    )
