"""Plain nn.Linear layers cut out of the learner's actor: what the exported graphs are built from.

    head = mean_head(actor.body.out)        # the output layer without its log_std rows
    expert = expert_linear(moe_layer, 3)    # expert 3 of a MoE layer, as its own Linear

Both copy the weights (no gradient flows back into the actor); the frozen graphs of freeze.py,
routing.py and multitask.py build their hidden and output layers from these.
"""

from __future__ import annotations

import torch
from torch import nn

from nets.moe import MoELinear, stacked_linear


def mean_head(head: nn.Linear) -> nn.Linear:
    """The actor's output layer (mean ++ log_std) without its log_std rows."""
    act_dim = head.out_features // 2
    linear = nn.Linear(head.in_features, act_dim)
    with torch.no_grad():
        linear.weight.copy_(head.weight[:act_dim])
        linear.bias.copy_(head.bias[:act_dim])
    return linear


def expert_linear(layer: MoELinear, index: int) -> nn.Linear:
    """Expert `index` of a MoE layer as a plain Linear (its weight [out, in] and bias)."""
    return stacked_linear(layer.weight, layer.bias, index)
