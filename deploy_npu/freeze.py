"""Checkpoint -> plain torch module: the seam between training and export.

    ckpt = load_policy_checkpoint("runs/r1/checkpoints")   # a ckpt_<version>.pt, a directory, or a state dict
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
import os
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from deploy_npu.layers import mean_head
from deploy_npu.routing import FrozenRoutingPolicy, RoutingTable
from foundation.checkpoint import load_checkpoint
from learner.models import ACTOR_GROUPS, ModelSpec, Normalizer, SquashedGaussianActor, build_actor

if TYPE_CHECKING:
    from sim.tasks import TaskSet


class CheckpointError(ValueError):
    """A checkpoint exists but cannot be turned into a policy; the message says what is wrong."""


@dataclass(frozen=True)
class PolicyCheckpoint:
    """The part of an aggregator checkpoint that a deployed policy needs (ACTOR_GROUPS)."""

    version: int
    spec: ModelSpec
    actor: np.ndarray  # flat float32 actor parameters
    obs_norm: np.ndarray  # flat float32 input mean ++ std
    source: str  # where it came from, for reports and error messages
    task: str | None = None  # task(s) the run trained on (checkpoints record it); None if unknown
    weights: str = "live"  # "live": the aggregator's newest actor; "swa": its weight average

    @property
    def task_names(self) -> list[str]:
        """The run's tasks, in order (several for a multi-task run; [] when not recorded)."""
        return [name for name in (self.task or "").split(",") if name]


CheckpointSource = str | os.PathLike | Mapping[str, Any] | PolicyCheckpoint


def _read_state(checkpoint: str | os.PathLike | Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    if isinstance(checkpoint, Mapping):
        return checkpoint, "<in-memory checkpoint>"
    path = pathlib.Path(checkpoint)
    if not path.exists():
        raise FileNotFoundError(
            f"checkpoint {str(path)!r} does not exist: pass a ckpt_<version>.pt file or the directory holding them"
        )
    try:
        state = load_checkpoint(path)
    except FileNotFoundError:
        raise  # an empty directory: load_checkpoint's message already names it
    except Exception as exc:  # torch.load raises pickle, zip and EOF errors alike on a bad file
        raise CheckpointError(
            f"cannot read checkpoint {str(path)!r} ({type(exc).__name__}: {exc}); "
            "expected a file written by foundation.checkpoint.save_checkpoint"
        ) from exc
    if not isinstance(state, Mapping):
        raise CheckpointError(f"checkpoint {str(path)!r} holds a {type(state).__name__}, expected a dict")
    return state, str(path)


WEIGHT_CHOICES = ("best", "live", "swa", "swa_plain")


def load_policy_checkpoint(checkpoint: CheckpointSource, weights: str = "best") -> PolicyCheckpoint:
    """Read and validate a checkpoint (path, directory = newest in it, or AggregatorCore.state() dict).

    `weights`: "live" the newest actor; "swa" the weight average of a run with aggregator.swa
    on ("swa_plain": a layered run's plain average, for comparisons); "best" the average when
    the evaluator scored it above the live policy, else live.
    A PolicyCheckpoint is returned as it is, so callers can load once and pass it on.
    Raises FileNotFoundError for a missing path and CheckpointError for anything unusable.
    """
    if weights not in WEIGHT_CHOICES:
        raise ValueError(f"weights {weights!r}: expected one of {WEIGHT_CHOICES}")
    choice = weights
    if isinstance(checkpoint, PolicyCheckpoint):
        return checkpoint
    state, source = _read_state(checkpoint)
    missing = [k for k in ("version", "spec", "weights") if k not in state]
    if missing:
        raise CheckpointError(f"checkpoint {source} lacks {missing}: not an AggregatorCore.state() dict")
    groups = state["weights"]
    absent = [g for g in ACTOR_GROUPS if g not in groups]
    if absent:
        raise CheckpointError(f"checkpoint {source} has no weight group(s) {absent}; a policy needs {ACTOR_GROUPS}")
    try:
        spec = ModelSpec.from_json(state["spec"])
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {source}: unreadable model spec {state['spec']!r} ({exc})") from exc
    flats = {g: np.asarray(groups[g], np.float32) for g in ACTOR_GROUPS}
    chosen = _choose_weights(state, choice, source)
    if chosen != "live":
        flats["actor"] = np.asarray(state[chosen]["actor"], np.float32)
    for group, flat in flats.items():
        if not np.all(np.isfinite(flat)):
            raise CheckpointError(f"checkpoint {source}: weights[{group!r}] contain NaN or inf; the policy is unusable")
    task = state.get("task") or None
    return PolicyCheckpoint(int(state["version"]), spec, flats["actor"], flats["obs_norm"], source, task, chosen)


def _choose_weights(state: Mapping[str, Any], choice: str, source: str) -> str:
    if choice in ("swa", "swa_plain") and (state.get(choice) or {}).get("actor") is None:
        raise CheckpointError(f"checkpoint {source} holds no {choice} weight average (train with aggregator.swa on)")
    swa = state.get("swa") or {}
    has_average = swa.get("actor") is not None
    if choice != "best":
        return choice
    score, live = swa.get("score"), swa.get("live_score")
    better = has_average and score is not None and live is not None and score > live
    return "swa" if better else "live"


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
