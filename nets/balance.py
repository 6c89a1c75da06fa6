"""The MoE routers' load balancing and load metrics, added to the losses' gradients (learner/gradients.py).

    layers = moe_layers(model.critic)                          # the MoE layers, found once
    grads = with_balance(q_loss, params, layers, hp, "critic", metrics)
    balance_loss(layers)                                       # 1 per layer when the load is even
    expert_load(layers, "moe/critic")                          # per layer: shares, std/mean, max/mean

Each reads the routing the layers kept from their newest training forward (nets/moe.py).
"""

from __future__ import annotations

from typing import Protocol

import torch

from nets.flat import grad_norm
from nets.moe import MoELinear


class BalanceSettings(Protocol):
    """What with_balance reads of the hyperparameters (learner.gradients.Hyperparams has both)."""

    @property
    def router_decay(self) -> float: ...

    @property
    def balance_coef(self) -> float: ...


def moe_layers(module: torch.nn.Module) -> list[MoELinear]:
    """The MoE layers of `module`, found once (a module tree does not change after construction)."""
    found = module.__dict__.get("_moe_layers")
    if found is None:
        found = module.__dict__["_moe_layers"] = [m for m in module.modules() if isinstance(m, MoELinear)]
    return found


def balance_loss(layers: list[MoELinear]) -> torch.Tensor:
    """The routers' load-balancing loss summed over layers; 1 per layer when the load is even.

    State router: Switch Transformer's E * sum_e f_e * P_e, with f_e the share of routing slots
    expert e got in the last batch and P_e its mean gate probability; up to E when one expert
    takes everything.

    Task router: the unit routed is a task, so tasks are counted, not rows (a task's batch share
    must not make its experts look overloaded), and only an expert holding more than its fair
    number of the tasks' slots (one, or tasks * k / E when the slots outnumber the experts) is
    pushed away from: 1 + E * sum_e excess_e * P_e, excess_e that surplus as a share of the
    slots. Switch's form never reaches its minimum when tasks * k < E (most experts must stay
    idle), so its gradient kept lowering the chosen experts' logits until another expert
    overtook one: a task's experts were swapped for untrained ones every few thousand updates
    (docs/architecture.md, "Routing that settles").

    Shared experts (model.shared_experts) are in every input's top_k whatever the gate says:
    both forms balance the routed slots over the other experts only, so the loss never pushes
    on what it cannot move."""
    total = torch.zeros(())
    for layer in layers:
        routed = layer.top_k - layer.shared  # the balance of the routed slots: shared experts take every input
        if layer.last_task_logits is not None:
            logits = layer.last_task_logits[..., layer.shared :]
            experts = logits.shape[-1]
            chosen = torch.zeros_like(logits).scatter(-1, logits.topk(routed, dim=-1).indices, 1.0)
            slots = chosen.shape[0] * routed
            # In whole slots, so an even load is exactly 0 (a rounding residue would be a
            # gradient, and Adam scales any gradient up to a full step).
            excess = (chosen.sum(0) - max(1.0, slots / experts)).clamp_min(0.0) / slots
            prob = torch.softmax(logits, dim=-1).mean(0)
            total = total + 1.0 + experts * (excess * prob).sum()
            continue
        assert layer.last_gates is not None and layer.last_logits is not None, "run a training forward first"
        logits = layer.last_logits[..., layer.shared :]
        experts = logits.shape[-1]
        share = (layer.last_gates[..., layer.shared :] > 0).float().mean(0) / routed
        prob = torch.softmax(logits, dim=-1).mean(0)
        total = total + experts * (share * prob).sum()
    return total


def expert_load(layers: list[MoELinear], prefix: str) -> dict[str, float]:
    """Per layer: each expert's share of the routing slots, and std/mean and max/mean of the
    shares (0 and 1 when even)."""
    out = {}
    for i, layer in enumerate(layers):
        share = _slot_shares(layer)
        mean = share.mean().clamp_min(1e-12)
        out[f"{prefix}/l{i}/load_std_over_mean"] = (share.std(unbiased=False) / mean).item()
        out[f"{prefix}/l{i}/load_max_over_mean"] = (share.max() / mean).item()
        out |= {f"{prefix}/l{i}/share_e{e}": float(v) for e, v in enumerate(share.tolist())}
    return out


def _slot_shares(layer: MoELinear) -> torch.Tensor:
    """Each expert's share of the newest batch's routing slots [experts]; the task router's
    from its per-task routing and rows per task (no per-row tensors)."""
    per_task = layer.task_load()
    if per_task is not None:
        gates, rows = per_task
        return (rows.to(gates.dtype) @ (gates > 0).to(gates.dtype)) / (rows.sum() * layer.top_k)
    assert layer.last_gates is not None, "run a training forward first"
    return ((layer.last_gates > 0).float().mean(0) / layer.top_k).detach()


def with_balance(
    loss: torch.Tensor, params: list[torch.Tensor], layers: list[MoELinear], hp: BalanceSettings, name: str, metrics
) -> tuple[torch.Tensor, ...]:
    """Gradients of `loss`; with MoE layers, plus those of beta_t * balance_coef * balance_loss,
    beta_t = exp(-router_decay * ||grad loss||): routing may specialize while the gradient is
    large, and is pulled toward balance as it shrinks."""
    if not layers:
        return torch.autograd.grad(loss, params)
    # allow_unused: with model.gate_grad false the task losses never reach the routers
    used = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    grads = tuple(torch.zeros_like(p) if g is None else g for g, p in zip(used, params, strict=True))
    norm = grad_norm(grads)
    beta = torch.exp(-hp.router_decay * norm).detach()
    balance = balance_loss(layers)
    extra = torch.autograd.grad(hp.balance_coef * beta * balance, params, allow_unused=True)
    metrics |= {f"moe/{name}_beta": beta.item(), f"moe/{name}_balance_loss": balance.item()}
    metrics |= expert_load(layers, f"moe/{name}")
    return tuple(g if e is None else g + e for g, e in zip(grads, extra, strict=True))
