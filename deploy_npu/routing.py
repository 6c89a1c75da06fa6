"""Frozen routing: a MoE policy's per-task expert table, and the static network built from it.

    states = calibration_states(ckpt.spec, ckpt.actor, ckpt.obs_norm, task, episodes=10)  # fresh rollouts
    table = freeze_routing(reference_actor(ckpt), task.name, states)  # per layer: experts, fixed gates
    table.agreement, table.action_error_max                      # how faithful the freeze is
    module = FrozenRoutingPolicy(reference_actor(ckpt), table)   # what export_onnx traces

A MoE actor's gates see only the normalized state and the task's embedding, so one task's
routing is a function of its states. Freezing keeps, per hidden layer, the top_k experts with
the largest mean gate weight over the calibration states and their mean weights, renormalized
to sum to 1. The frozen network then computes only those experts, mixed by constants: Gemm,
Mul, Add and Relu, no TopK and nothing that depends on data. `agreement` is the share of
calibration states whose dynamic top-k equals the frozen set in every layer; the action error
is |frozen - dynamic| over the same states.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass
from typing import cast

import numpy as np
import torch
from torch import nn

from deploy_npu.layers import expert_linear, mean_head
from foundation.acting import Policy, rollout
from foundation.policy import ModelSpec
from nets.models import SquashedGaussianActor
from sim.registry import TaskSpec, make_env
from sim.tasks import TaskSet


@dataclass(frozen=True)
class LayerRoute:
    experts: tuple[int, ...]  # the frozen set, by mean gate weight, largest first
    gates: tuple[float, ...]  # their fixed weights (sum 1)
    agreement: float  # share of calibration states whose dynamic top-k is exactly this set


@dataclass(frozen=True)
class RoutingTable:
    task: str
    task_index: int
    layers: tuple[LayerRoute, ...]
    states: int  # calibration states
    agreement: float  # share of states routed exactly as frozen in every layer
    action_error_max: float  # |frozen - dynamic action| over the calibration states
    action_error_mean: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def calibration_states(
    spec: ModelSpec,
    actor: np.ndarray,
    obs_norm: np.ndarray,
    task: TaskSpec,
    episodes: int,
    seed: int = 0,
    tasks: TaskSet | None = None,
) -> np.ndarray:
    """observation ++ desired_goal of every step of `episodes` fresh deterministic rollouts of
    the dynamic-routing policy in the nominal task (seeds `seed`, `seed + 1`, ...). A
    multi-task run's policy acts (and its states are kept) at the run's padded width, `tasks`."""
    policy = Policy.fixed(0, actor, obs_norm, spec)
    place = tasks.names.index(task.name) if tasks is not None else 0
    env = tasks.make_env(place) if tasks is not None else make_env(task)
    rng = np.random.default_rng(seed)
    rows = []
    try:
        for i in range(episodes):
            episode, _ = rollout(env, policy, seed=seed + i, rng=rng, deterministic=True, task=place)
            rows.append(np.concatenate([episode.obs, episode.desired_goal], axis=1))
    finally:
        env.close()
    return np.concatenate(rows).astype(np.float32)


def _gates(actor: SquashedGaussianActor, states: torch.Tensor, task_index: int) -> list[torch.Tensor]:
    """The dynamic gate weights [states, experts] of every MoE layer."""
    gate_in = actor.body.gate_input(actor.norm(states), torch.full((len(states),), task_index))
    return [layer.route(gate_in) for layer in actor.body.moe_layers()]


def freeze_routing(actor: SquashedGaussianActor, task: str, states: np.ndarray, task_index: int = 0) -> RoutingTable:
    """The per-layer frozen routing of `task` over `states`, with its agreement and action error."""
    with torch.no_grad():
        x = torch.from_numpy(np.asarray(states, np.float32))
        layers, exact = [], torch.ones(len(x), dtype=torch.bool)
        for gates, layer in zip(_gates(actor, x, task_index), actor.body.moe_layers(), strict=True):
            mean = gates.mean(0)
            chosen = torch.argsort(mean, descending=True)[: layer.top_k]
            weights = mean[chosen] / mean[chosen].sum()
            frozen = torch.zeros(gates.shape[-1], dtype=torch.bool)
            frozen[chosen] = True
            same = ((gates > 0) == frozen).all(dim=1)
            exact &= same
            route = LayerRoute(tuple(chosen.tolist()), tuple(weights.tolist()), float(same.float().mean()))
            layers.append(route)
        table = RoutingTable(task, task_index, tuple(layers), len(x), float(exact.float().mean()), 0.0, 0.0)
        frozen_action = FrozenRoutingPolicy(actor, table)(x)
        dynamic = actor.deterministic(x, torch.full((len(x),), task_index))
        error = (frozen_action - dynamic).abs()
    return RoutingTable(
        task, task_index, tuple(layers), len(x), table.agreement, float(error.max()), float(error.mean())
    )


class FrozenRoutingPolicy(nn.Module):
    """obs_goal [B, input_dim] -> tanh(mean) [B, act_dim] with one task's routing frozen: each
    hidden layer is its selected experts (plain Linear layers) mixed by constant gates."""

    def __init__(self, actor: SquashedGaussianActor, table: RoutingTable) -> None:
        super().__init__()
        self.norm = copy.deepcopy(actor.norm)
        self.experts = nn.ModuleList()  # flat: layer by layer, each layer's selected experts in order
        self.gates: list[tuple[float, ...]] = []
        for layer, route in zip(actor.body.moe_layers(), table.layers, strict=True):
            self.experts.extend(expert_linear(layer, e) for e in route.experts)
            self.gates.append(route.gates)
        self.head = mean_head(actor.body.head(table.task_index))  # its own with model.task_heads

    def first_layers(self) -> list[nn.Linear]:
        """The layers that read the normalized input: the first MoE layer's selected experts."""
        return [cast(nn.Linear, expert) for expert in self.experts[: len(self.gates[0])]]

    def forward(self, obs_goal: torch.Tensor) -> torch.Tensor:
        x = self.norm(obs_goal)
        experts = iter(self.experts)
        for gates in self.gates:
            mixed = sum(gate * next(experts)(x) for gate in gates)
            x = torch.relu(mixed)
        return torch.tanh(self.head(x))
