"""Checkpoint -> plain torch module: the seam between training and export.

    ckpt = load_policy_checkpoint("runs/r1/checkpoints")   # foundation.checkpoint: a file, a directory, a state dict
    reference = reference_actor(ckpt)                    # the learner's SquashedGaussianActor, eval mode
    module = freeze_policy(ckpt)                         # obs_goal [B, in] -> action [B, act], no sampling
    export_onnx(...)                                     # exports `module` (deploy_npu/export.py)

`freeze_policy` is the one function a later freeze replaces: the Mixture-of-Experts routing
freeze will resolve the router for one task and hand back a module with the same contract
(float32 obs ++ desired_goal in, float32 action in (-1, 1) out, no data-dependent branches).
Everything downstream (export, audit, parity, latency, closed loop) only sees that contract.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from deploy_npu.layers import mean_head
from deploy_npu.routing import FrozenRoutingPolicy, RoutingTable
from foundation.checkpoint import CheckpointError, PolicyCheckpoint
from nets.models import Normalizer, SquashedGaussianActor, build_actor

if TYPE_CHECKING:
    from sim.tasks import TaskSet


def reference_actor(ckpt: PolicyCheckpoint) -> SquashedGaussianActor:
    """The learner's own actor rebuilt from the checkpoint: the ground truth parity compares with."""
    try:
        return build_actor(ckpt.spec, ckpt.actor, ckpt.obs_norm)
    except ValueError as exc:  # flat vector sizes do not fit the spec
        raise CheckpointError(f"checkpoint {ckpt.source}: {exc}") from exc


class DeterministicPolicy(nn.Module):
    """obs_goal [B, obs_dim + goal_dim] -> tanh(mean) [B, act_dim]: the actor minus its log-std head.

    SquashedGaussianActor.forward splits its last layer's output into (mean, log_std) with
    chunk(2); here that layer keeps only the mean rows, so the exported graph is
    Sub, Div, Clip, (Gemm, Relu)*, Gemm, Tanh with no Shape/Slice arithmetic, and does half
    the head's work. Parity against `reference_actor(...).deterministic` guards this copy.
    """

    def __init__(self, actor: SquashedGaussianActor, act_dim: int) -> None:
        super().__init__()
        self.norm = copy.deepcopy(actor.norm)
        *trunk, head = (copy.deepcopy(layer) for layer in actor.body.net)
        if not isinstance(head, nn.Linear) or head.out_features != 2 * act_dim:
            raise CheckpointError(f"actor head {head} is not Linear(*, 2 * act_dim={2 * act_dim})")
        self.net = nn.Sequential(*trunk, mean_head(head))

    def forward(self, obs_goal: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(self.norm(obs_goal)))

    def first_layers(self) -> list[nn.Linear]:
        """The layers that read the normalized input."""
        first = self.net[0]
        assert isinstance(first, nn.Linear)
        return [first]


@dataclass(frozen=True)
class TaskInput:
    """One task of a multi-task run, exported on its own observation ++ desired_goal.

    The run's networks read the padded input of sim/tasks.py: [task's observation | zeros |
    task one-hot | desired_goal]. For one task every column but its observation and goal is a
    constant, so `fold_task_input` moves them into the first layer's bias: the exported graph
    takes the task's own observation and gains no op (no Pad, Concat or Gather).
    """

    tasks: TaskSet
    index: int

    @property
    def name(self) -> str:
        return self.tasks.names[self.index]

    @property
    def input_dim(self) -> int:
        return self.tasks.tasks[self.index].obs_dim + self.tasks.goal_dim

    def columns(self) -> np.ndarray:
        """The padded input's columns this task's own input fills, in order."""
        obs, width = self.tasks.tasks[self.index].obs_dim, self.tasks.obs_dim
        return np.r_[np.arange(obs), width + np.arange(self.tasks.goal_dim)]

    def pad(self, obs_goal: np.ndarray) -> np.ndarray:
        """Rows of this task's own input [n, input_dim] at the run's padded width."""
        obs_goal = np.asarray(obs_goal, np.float32)
        obs = obs_goal[:, : self.tasks.tasks[self.index].obs_dim]
        return np.concatenate([self.tasks.pad(obs, self.index), obs_goal[:, obs.shape[1] :]], axis=1)


def fold_task_input(module: nn.Module, task: TaskInput) -> nn.Module:
    """`module` (a DeterministicPolicy or FrozenRoutingPolicy of the padded input) narrowed to
    `task`'s own input, the constant columns folded into its first layers' biases: exact,
    since the normalizer is per column (clip((x - mean) / std)) and the first layers linear."""
    policy: Any = module  # DeterministicPolicy or FrozenRoutingPolicy: .norm and .first_layers()
    source: Normalizer = policy.norm
    layers: list[nn.Linear] = policy.first_layers()
    real = torch.from_numpy(task.columns())
    width = source.mean.shape[-1]
    constant = torch.ones(width, dtype=torch.bool)
    constant[real] = False
    probe = np.zeros((1, task.input_dim), np.float32)
    values = torch.from_numpy(task.pad(probe)[0])  # zeros where the task's input goes, else the constants
    with torch.no_grad():
        folded = source(values[None])[0][constant]  # the constants as the first layers see them
        norm = Normalizer(len(real))
        mean, std = source.row(task.index)
        norm.mean.copy_(mean[real])
        norm.std.copy_(std[real])
        policy.norm = norm
        for layer in layers:
            bias = layer.bias + layer.weight[:, constant] @ folded
            narrowed = nn.Linear(len(real), layer.out_features)
            narrowed.weight.copy_(layer.weight[:, real])
            narrowed.bias.copy_(bias)
            layer.in_features, layer.weight, layer.bias = len(real), narrowed.weight, narrowed.bias
    return module


def freeze_policy(
    ckpt: PolicyCheckpoint, routing: RoutingTable | None = None, task_input: TaskInput | None = None
) -> nn.Module:
    """The module to export: deterministic, eval mode, gradients off. A MoE policy needs its
    task's frozen routing (deploy_npu/routing.py): only the selected experts, fixed gates.
    A multi-task run's policy is exported per task (`task_input`): that task's own input."""
    module = _frozen(ckpt, routing)
    return fold_task_input(module, task_input) if task_input is not None else module


def _frozen(ckpt: PolicyCheckpoint, routing: RoutingTable | None) -> nn.Module:
    if ckpt.spec.kind == "moe":
        if routing is None:
            raise CheckpointError(
                f"checkpoint {ckpt.source}: a moe policy exports with one task's frozen routing: "
                "freeze_routing(...) first (fleetrl export does)"
            )
        return FrozenRoutingPolicy(reference_actor(ckpt), routing).eval().requires_grad_(False)
    module = DeterministicPolicy(reference_actor(ckpt), ckpt.spec.act_dim).eval()
    return module.requires_grad_(False)
