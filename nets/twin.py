"""Both critics of a task-routed MoE TwinCritic in one pass: each layer's two matmuls made one.

    q1, q2 = twin_forward(critic.q1, critic.q2, x, state, task)   # = critic.q1(x, ...), critic.q2(x, ...)

Q1 and Q2 read the same input and have the same shapes, so per task their first layers are one
Linear of twice the width (the two mixed weights stacked), and every later layer one batched
matmul over the pair ([2, task's rows, width]); with model.critic_norm 'layer', every hidden
layer's LayerNorm is one over the pair too, each critic's scale and shift on its half. The
parameters stay where they are (each critic its own, the flat layout unchanged): the stacking
happens in the forward pass and its backward splits the gradient again. Measured
(benchmarks/learner_throughput.py, 4 tasks, batch 256, one thread, 3 interleaved rounds): the
32-expert MoE 73.8 gradients per CPU-second fused against 69.9 apart (1.06x); the same for the
dense 256x256 pair lost (113.8 against 128.4: torch's CPU batched matmul over the pair, and
stacking the weights, cost more than the second addmm), so a dense pair, a state-routed MoE and
any traced or exported module run the two bodies apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn
from torch.nn import functional as F

from nets.moe import TaskLayout, exporting

Layer = tuple[torch.Tensor, torch.Tensor]  # (weight [tasks, ..., out, in], bias [tasks, ..., out])


class Body(Protocol):
    """What the twin pass reads of a critic body (nets.models.Body): its kind, each hidden layer's
    per-task mixed weights, and its output layer (an nn.Linear, or TaskHeads with a weight per task)."""

    @property
    def moe(self) -> bool: ...

    @property
    def task_routed(self) -> bool: ...

    @property
    def out(self) -> nn.Module: ...

    @property
    def norms(self) -> nn.ModuleList | None: ...  # a LayerNorm per hidden layer (critic_norm 'layer'), or None

    def __call__(self, x: torch.Tensor, state: torch.Tensor, task: torch.Tensor | None) -> torch.Tensor: ...

    def task_mixes(self, layout: TaskLayout) -> Sequence[Layer]: ...


def twin_forward(
    q1: Body, q2: Body, x: torch.Tensor, state: torch.Tensor, task: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q1(x, state, task), q2(x, state, task)) of two nets.models.Body of one spec, float32."""
    if exporting() or not (q1.moe and q1.task_routed):
        return q1(x, state, task), q2(x, state, task)
    out = _task_routed(q1, q2, x, task).float()
    return out[0], out[1]


def _task_routed(a: Body, b: Body, x: torch.Tensor, task: torch.Tensor | None) -> torch.Tensor:
    """Two task-routed MoE bodies (nets.models.Body._task_routed) on one input: [2, rows, out]."""
    layout = TaskLayout.of(task if task is not None else torch.zeros(len(x), dtype=torch.long))
    mixes = list(zip(a.task_mixes(layout), b.task_mixes(layout), strict=True))  # per layer: (a's, b's)
    first = mixes[0]
    weight, bias = torch.cat([first[0][0], first[1][0]], 1), torch.cat([first[0][1], first[1][1]], 1)
    hs = [
        torch.addmm(c, h, w.t()).view(len(h), 2, -1).transpose(0, 1)  # [2, task's rows, width]
        for h, w, c in zip(x[layout.order].split(layout.counts), weight.unbind(0), bias.unbind(0), strict=True)
    ]
    stacked = [_stack(*pair) for pair in mixes[1:]]
    stacked.append(_stack(*(_head(body, layout.present) for body in (a, b))))
    norms = _pair_norms(a, b)
    for depth, (weight, bias) in enumerate(stacked):
        if norms is not None:
            hs = [_layer_norm(h, *norms[depth]) for h in hs]
        hs = [torch.baddbmm(c, torch.relu(h), w) for h, w, c in zip(hs, weight.unbind(0), bias.unbind(0), strict=True)]
    out = torch.cat(hs, 1)  # rows in task order
    return out.new_empty(out.shape).index_copy(1, layout.order, out)


def _head(body: Body, present: torch.Tensor) -> Layer:
    """The output layer per present task: (weight [tasks, out, in], bias [tasks, out])."""
    out = body.out
    weight, bias = out.weight, out.bias
    assert isinstance(weight, torch.Tensor) and isinstance(bias, torch.Tensor)
    if isinstance(out, nn.Linear):
        return weight.expand(len(present), -1, -1), bias.expand(len(present), -1)
    return weight[present], bias[present]  # TaskHeads


def _stack(
    a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per task, both critics' layer for a batched matmul: (weight [tasks, 2, in, out], bias [tasks, 2, 1, out])."""
    return torch.stack([a[0], b[0]], 1).transpose(2, 3), torch.stack([a[1], b[1]], 1).unsqueeze(2)


Norm = tuple[torch.Tensor, torch.Tensor, float]  # (weight [2, 1, width], bias [2, 1, width], eps)


def _pair_norms(a: Body, b: Body) -> list[Norm] | None:
    """Per hidden layer, both critics' LayerNorm stacked for the pair [2, rows, width]; None without."""
    if a.norms is None or b.norms is None:
        return None
    pairs = []
    for na, nb in zip(a.norms, b.norms, strict=True):
        assert isinstance(na, nn.LayerNorm) and isinstance(nb, nn.LayerNorm)
        pairs.append(
            (torch.stack([na.weight, nb.weight]).unsqueeze(1), torch.stack([na.bias, nb.bias]).unsqueeze(1), na.eps)
        )
    return pairs


def _layer_norm(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """Each critic's LayerNorm on its half of `h` [2, rows, width]: normalized over the width,
    then that critic's scale and shift."""
    return torch.addcmul(bias, F.layer_norm(h, h.shape[-1:], eps=eps), weight)
