"""CrossQ's critics (learner.algo 'crossq'): batch renormalization, the running statistics a learner's own.

Bhatt et al. 2024, "CrossQ: Batch Normalization in Deep Reinforcement Learning for Greater Sample
Efficiency and Simplicity"; the layout is sb3-contrib's (and sbx's) CrossQ critic. Both critics
batch-renormalize their input and every hidden layer, and see the current and next state-actions
as one batch, so the statistics they normalize with are those of both halves; there are no
target networks (learner/algos/crossq.py):

    Q_i([s; s'], [a; a'])  ->  (Q_i(s,a), Q_i(s',a')),   a' ~ pi(.|s',g)
    critic:  J_Q  = E[(Q_i(s,g,a) - y)^2],   y = r + gamma (1 - d) sg(min_j Q_j(s',g,a') - alpha log pi(a'|s',g))
    actor:   J_pi = E[alpha log pi(a|s,g) - min_j Q_j(s,g,a)]   (critics on their running statistics)

The running statistics are buffers, not a weight group: each learner estimates them from its own
batches of the one replay buffer, and a restarted learner starts them anew. The scale and shift
are critic parameters and travel in its flat group. The critic_target group is kept and
Polyak-averaged as for SAC but never read. Unlike sb3-contrib's, the actor has no batch
renormalization (samplers, evaluator and export stay SAC's), the critics are learner.hidden_sizes
wide (sb3-contrib: 1024; the paper: 2048), and every update trains the actor (no policy delay).

sb3-contrib's BatchRenorm1d would do, but only the optional peers extra installs sb3-contrib, and
it would bring stable-baselines3 into every learner for 40 lines tested against hand-computed
values (tests/test_crossq.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn import functional as F


class BatchRenorm(nn.Module):
    """Batch renormalization (Ioffe 2017) as CrossQ's critics use it (sbx's BatchRenorm).

    Training: each feature is standardized with the batch's mean and std; once `warmup` training
    passes have built the running statistics, the result is corrected toward them,
    y = (x - mean_B) / std_B * r + d with r = clip(std_B / std, 1/r_max, r_max) and
    d = clip((mean_B - mean) / std, -d_max, d_max), both constants to autograd; before that it is
    plain batch normalization. Every training pass moves the running statistics `momentum` of the
    way to the batch's (the unbiased variance, as torch's BatchNorm1d and sb3-contrib's). Eval
    mode: the running statistics alone. Then a learned scale and shift (parameters, so they
    travel in the critic's flat group); the running statistics are buffers, the learner's own."""

    running_mean: torch.Tensor
    running_var: torch.Tensor
    steps: torch.Tensor

    def __init__(
        self, features: int, momentum: float = 0.01, warmup: int = 100_000, r_max: float = 3.0, d_max: float = 5.0
    ) -> None:
        super().__init__()
        self.momentum, self.warmup, self.r_max, self.d_max = momentum, warmup, r_max, d_max
        self.eps = 1e-3  # sbx's
        self.weight = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("running_var", torch.ones(features))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Each path is one fused batch_norm kernel forward and backward: the same arithmetic in
        # elementwise ops made a CrossQ update cost 2x a SAC one (benchmarks/learner_throughput.py).
        x = x.float()  # statistics in float32, under bf16 autocast too
        w, b, eps = self.weight, self.bias, self.eps
        if not self.training:
            return F.batch_norm(x, self.running_mean, self.running_var, w, b, False, 0.0, eps)
        if self.steps.item() < self.warmup:  # plain batch norm; it moves the running statistics itself
            self.steps.add_(1)
            return F.batch_norm(x, self.running_mean, self.running_var, w, b, True, self.momentum, eps)
        with torch.no_grad():  # corrected toward the statistics before this batch
            var, mean = torch.var_mean(x, 0, correction=0)
            running_std = (self.running_var + eps).sqrt()
            r = ((var + eps).sqrt() / running_std).clamp(1.0 / self.r_max, self.r_max)
            d = ((mean - self.running_mean) / running_std).clamp(-self.d_max, self.d_max)
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var * (len(x) / max(len(x) - 1, 1)), self.momentum)  # unbiased, as batch_norm's
            self.steps.add_(1)
        # w (x_hat r + d) + b: batch norm with the scale w r and the shift w d + b
        return F.batch_norm(x, None, None, w * r, w * d + b, True, 0.0, eps)


def renorm_mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int) -> nn.Sequential:
    """CrossQ's critic (sbx's layout): batch renorm on the input and after every hidden ReLU."""
    layers: list[nn.Module] = [BatchRenorm(in_dim)]
    for width in hidden:
        layers += [nn.Linear(in_dim, width), nn.ReLU(), BatchRenorm(width)]
        in_dim = width
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


def renorm_layers(module: nn.Module) -> list[BatchRenorm]:
    return [m for m in module.modules() if isinstance(m, BatchRenorm)]


def set_renorm(module: nn.Module, momentum: float, warmup: int) -> None:
    """learner.crossq.momentum and learner.crossq.warmup on every BatchRenorm of `module`."""
    for layer in renorm_layers(module):
        layer.momentum, layer.warmup = momentum, warmup


@contextlib.contextmanager
def running_statistics(module: nn.Module) -> Iterator[None]:
    """`module`'s batch renorm layers in eval mode (their running statistics, no update) inside."""
    layers = [layer for layer in renorm_layers(module) if layer.training]
    for layer in layers:
        layer.eval()
    try:
        yield
    finally:
        for layer in layers:
            layer.train()
