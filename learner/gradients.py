"""One update's gradients: an algorithm's two losses (learner/algorithm.py) differentiated
against the model's current weights, without touching them, as flat vectors per weight group.

    hp = Hyperparams.for_run(config, act_dim)
    result = compute_gradients(model, batch, hp, out=buffers.next())
    result.grads["actor"], result.grads["critic"], result.grads["log_alpha"], result.norm_stats

MoE networks add their routers' load-balancing gradient, scaled by router decay (nets/balance.py).
A run with demonstrations adds the Q-filtered behaviour cloning of their rows to the actor's loss
(learner/demos.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from foundation.config import RunConfig
from foundation.cpu import has_bf16
from learner.algorithm import ActorLoss, Algorithm, Batch, Objective
from learner.algos import build_algorithm
from learner.algos.sac import SAC
from learner.demos import demo_bc
from nets.balance import moe_layers, with_balance
from nets.flat import FlatSet, flatten
from nets.models import SACModel, norm_stats, one_mix_per_update


@dataclass(frozen=True)
class Hyperparams:
    """What compute_gradients needs: the algorithm, its objective, and how the losses run."""

    objective: Objective
    algorithm: Algorithm = field(default_factory=SAC)
    balance_coef: float = 0.01  # MoE: weight of the load-balancing loss (Switch Transformer's alpha)
    router_decay: float = 1.0  # MoE: lambda of beta_t = exp(-lambda * ||grad J||)
    autocast: str = "off"  # or "bf16": losses under torch.autocast (learner.autocast, "auto" resolved)
    compile: bool = False  # learner.compile: the losses under torch.compile (dense models)
    mix_once: bool = True  # learner.mix_once: one expert mix per MoE layer and update (one_mix_per_update)
    demos: bool = False  # the run stores demonstrations (sampler.demo_episodes): report their share
    demo_bc_coef: float = 0.0  # learner.demo_bc_coef with demonstrations, else 0: no behaviour cloning

    @classmethod
    def for_run(cls, config: RunConfig, act_dim: int) -> Hyperparams:
        learner, entropy = config.learner, config.learner.target_entropy
        demos = config.sampler.demo_episodes > 0
        return cls(
            objective=Objective(
                gamma=learner.gamma,
                target_entropy=entropy if entropy is not None else -float(act_dim),
                n_step=learner.n_step,
                clip_return=config.sim.reward == "sparse",  # a shaped reward's returns are not in [-1/(1-gamma), 0]
            ),
            algorithm=build_algorithm(learner),
            balance_coef=config.model.balance_coef,
            router_decay=config.model.router_decay,
            autocast=resolve_autocast(learner.autocast, learner.device),
            compile=learner.compile,
            mix_once=learner.mix_once,
            demos=demos,
            demo_bc_coef=learner.demo_bc_coef if demos else 0.0,
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


class _Losses:
    """An algorithm's two losses, under torch.compile with learner.compile."""

    def __init__(self, algorithm: Algorithm, compiled: bool) -> None:
        self.critic: Callable[[SACModel, Batch, Objective], torch.Tensor] = algorithm.critic_loss
        self.actor: Callable[[SACModel, Batch, Objective], ActorLoss] = algorithm.actor_loss
        if compiled:
            self.critic = torch.compile(self.critic, dynamic=False)
            self.actor = torch.compile(self.actor, dynamic=False)


_COMPILED: dict[Algorithm, _Losses] = {}


def _losses(hp: Hyperparams, model: SACModel) -> _Losses:
    """The algorithm's losses as this update runs them: compiled with hp.compile on a dense model
    without batch-renorm critics (a MoE's rows per task and routing are data-dependent; renorm
    layers update their running statistics in place), compiled once per algorithm and process."""
    if not (hp.compile and model.spec.kind != "moe" and not model.spec.critic_renorm):
        return _Losses(hp.algorithm, compiled=False)
    if hp.algorithm not in _COMPILED:
        # Each loss is backpropagated once, but autograd.grad asks for its parameters in two
        # calls for a MoE's balancing term; donated buffers would forbid that, and the dense
        # path does not need them.
        import torch._functorch.config as functorch_config

        functorch_config.donated_buffer = False
        _COMPILED[hp.algorithm] = _Losses(hp.algorithm, compiled=True)
    return _COMPILED[hp.algorithm]


def compute_gradients(model: SACModel, batch: Batch, hp: Hyperparams, out: FlatSet | None = None) -> GradientResult:
    """Every gradient group's gradient against the model's current weights, without touching the
    weights. With hp.autocast "bf16" the matmuls run in bfloat16; parameters and gradients stay
    float32. `out` (GradientBuffers.next()): the flat gradients are written there, and stay valid
    only until that set is handed out again."""
    modules = (model.actor, model.critic, model.critic_target) if hp.mix_once else ()
    with one_mix_per_update(*modules):
        if hp.autocast == "bf16":
            with torch.autocast(batch.obs_goal.device.type, dtype=torch.bfloat16):
                return _gradients(model, batch, hp, out)
        return _gradients(model, batch, hp, out)


def _gradients(model: SACModel, batch: Batch, hp: Hyperparams, out: FlatSet | None) -> GradientResult:
    losses = _losses(hp, model)
    critic_params = model.group_parameters("critic")
    actor_params = model.group_parameters("actor")
    metrics: dict[str, float] = {}
    q_loss = losses.critic(model, batch, hp.objective)
    critic_grads = with_balance(q_loss, critic_params, moe_layers(model.critic), hp, "critic", metrics)
    pi = losses.actor(model, batch, hp.objective)
    rl_actor_loss = pi.actor
    pi = _with_demonstrations(model, batch, hp, pi, metrics)
    # The actor's gradient must not flow into the critic: ask autograd for actor params only.
    actor_layers = moe_layers(model.actor)
    if actor_layers:
        actor_grads = with_balance(pi.actor, actor_params, actor_layers, hp, "actor", metrics)
        alpha_grads = torch.autograd.grad(pi.alpha, [model.log_alpha])
    else:  # one backward: each loss reads the other's input detached (alpha; log pi), so neither reaches the other
        both = torch.autograd.grad(pi.actor + pi.alpha, [*actor_params, model.log_alpha])
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
            "loss/actor": rl_actor_loss.item(),
            "loss/alpha": pi.alpha.item(),
            **_alpha_metrics(model),
            **metrics,
        },
    )


def _with_demonstrations(
    model: SACModel, batch: Batch, hp: Hyperparams, pi: ActorLoss, metrics: dict[str, float]
) -> ActorLoss:
    """`pi` with the behaviour cloning of the batch's demonstration rows added to the actor's loss
    (learner/demos.py), its figures in `metrics`; `pi` itself in a run without demonstrations."""
    if not hp.demos or batch.demo is None:
        return pi
    if hp.demo_bc_coef <= 0:  # demonstrations as plain replay rows
        metrics["demo/share"] = batch.demo.mean().item()
        return pi
    bc = demo_bc(model, batch, hp.demo_bc_coef, hp.algorithm.value)
    metrics.update(bc.metrics())
    return ActorLoss(pi.actor + bc.loss, pi.alpha)


def _alpha_metrics(model: SACModel) -> dict[str, float]:
    """'alpha' (the mean over tasks with one per task) and, per task, 'alpha/task<i>'."""
    alpha = model.log_alpha.detach().exp()
    per_task = {f"alpha/task{i}": a for i, a in enumerate(alpha.tolist())} if len(alpha) > 1 else {}
    return {"alpha": alpha.mean().item(), **per_task}


def _batch_norm_stats(model: SACModel, batch: Batch) -> np.ndarray:
    rows = model.spec.norm_rows
    task = None if rows == 1 or batch.task is None else batch.task.cpu().numpy()
    return norm_stats(batch.obs_goal.cpu().numpy(), task, rows)
