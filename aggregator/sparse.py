"""Adam and Polyak steps that skip the experts a version's gradient left untouched (MoE only).

    segments = ExpertSegments(model, GRADIENT_GROUPS)     # the flat layout, once
    hits = segments.hits("critic", flat_gradient)         # per MoE layer: experts touched
    ranges = segments.ranges("critic", hits)              # [(start, stop), ...] to step
    lazy_adam_step(param, grad, state, ranges, lr, betas, eps)
    lazy_polyak(target, critic, segments.ranges("critic", ever_hit), tau)

A MoE layer's gradient is zero on every expert no row was routed to: with the task router and
4 tasks on 32 experts, 24 of 32 experts of every layer (75% of a 3.7M-value MoE's weights).
Dense Adam still reads and writes all of them each version (param, gradient, both moments),
and the target critics' Polyak average reads and writes every weight again: in a 4-task MoE
fleet run the aggregator spent half a core, 28% of it in Adam. Here a version steps only the
experts whose bias gradient has a nonzero element, and every other parameter (gates, task
embedding, output layers, temperature). The bias decides, not the weights: an expert's bias
gradient sums each of its outputs' gradients over its rows, so it is zero when no row was
routed to it, or when every output's gradient is zero (all its units dead), and then its
weight gradient is zero too; that a nonzero sum cancels to exactly 0.0 in every output at
once is the only way to skip a touched expert (tests/test_aggregator_sparse.py checks real
gradients). Checking the weights instead read 75% of the gradient again, per expert: 2.3 ms
a version, more than the dense Adam step it replaced. The Polyak average covers every
expert the critic's gradient ever touched (the others' target copy still equals them).

What this changes, and what not: an expert never routed to has zero moments, so dense Adam
moves it by 0 / (0 + eps) = 0 and its target copy stays equal to it: skipping it is exact, and
while each task keeps its experts (the task router once routing settles; every task in every
batch, as task quotas give) the whole run is exact (tests/test_aggregator_sparse.py). An expert
that was routed to before and not in this version keeps its moments and weights, where dense
Adam would still move it by its decaying momentum: the "lazy" Adam of sparse embeddings
(TensorFlow's LazyAdam, torch.optim.SparseAdam). `aggregator.expert_adam "dense"` keeps the
dense step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from nets.models import SACModel


@dataclass(frozen=True)
class _Layer:
    """One MoE layer's experts in a group's flat vector: weights [E, out, in], biases [E, out]."""

    weight_start: int
    weight_size: int  # one expert's: out * in
    bias_start: int
    bias_size: int  # one expert's: out
    experts: int


class ExpertSegments:
    """Per gradient group of a MoE model: the flat ranges always stepped, and its MoE layers."""

    def __init__(self, model: SACModel, groups: tuple[str, ...]) -> None:
        self.always: dict[str, list[tuple[int, int]]] = {}
        self.layers: dict[str, list[_Layer]] = {}
        for group in groups:
            params = model.group_parameters(group)
            offsets, at = {}, 0
            for param in params:
                offsets[id(param)] = (at, param.numel())
                at += param.numel()
            experts = set()
            layers = []
            for weight, bias in model.expert_parameters(group):
                (w0, wn), (b0, bn) = offsets[id(weight)], offsets[id(bias)]
                n = weight.shape[0]
                layers.append(_Layer(w0, wn // n, b0, bn // n, n))
                experts |= {id(weight), id(bias)}
            self.layers[group] = layers
            self.always[group] = _merge([(a, a + n) for key, (a, n) in offsets.items() if key not in experts])

    def hits(self, group: str, grad: np.ndarray) -> list[np.ndarray]:
        """Per MoE layer of `group`: which experts this gradient touches (bool [experts])."""
        out: list[np.ndarray] = []
        for layer in self.layers[group]:
            biases = grad[layer.bias_start : layer.bias_start + layer.experts * layer.bias_size]
            out.append(np.asarray(biases.reshape(layer.experts, layer.bias_size).any(axis=1)))
        return out

    def differing(self, group: str, a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
        """Per MoE layer of `group`: which experts differ between two flat vectors of its layout."""
        out = []
        for layer in self.layers[group]:
            hit = np.zeros(layer.experts, bool)
            for e in range(layer.experts):
                w0, b0 = layer.weight_start + e * layer.weight_size, layer.bias_start + e * layer.bias_size
                hit[e] = not (
                    np.array_equal(a[w0 : w0 + layer.weight_size], b[w0 : w0 + layer.weight_size])
                    and np.array_equal(a[b0 : b0 + layer.bias_size], b[b0 : b0 + layer.bias_size])
                )
            out.append(hit)
        return out

    def ranges(self, group: str, hits: list[np.ndarray]) -> list[tuple[int, int]]:
        """The flat ranges to step: every non-expert parameter, and the experts in `hits`."""
        ranges = list(self.always[group])
        for layer, hit in zip(self.layers[group], hits, strict=True):
            for e in map(int, np.flatnonzero(hit)):
                w0, b0 = layer.weight_start + e * layer.weight_size, layer.bias_start + e * layer.bias_size
                ranges += [(w0, w0 + layer.weight_size), (b0, b0 + layer.bias_size)]
        return _merge(ranges)


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted ranges with touching or overlapping ones joined."""
    out: list[tuple[int, int]] = []
    for start, stop in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        elif stop > start:
            out.append((start, stop))
    return out


def lazy_adam_step(
    param: torch.Tensor,
    grad: torch.Tensor,
    state: dict,
    ranges: list[tuple[int, int]],
    lr: float,
    betas: tuple[float, float],
    eps: float,
) -> None:
    """One Adam step (torch's fused kernel, no weight decay) on `ranges` of the flat `param`,
    with its optimizer `state` ("step", "exp_avg", "exp_avg_sq"). The step count is the run's,
    one per version, as a dense step would count it."""
    step = state["step"]
    with torch.no_grad():
        step.add_(1)
        flat, m, v = param.detach(), state["exp_avg"], state["exp_avg_sq"]
        torch._fused_adam_(
            [flat[a:b] for a, b in ranges],
            [grad[a:b] for a, b in ranges],
            [m[a:b] for a, b in ranges],
            [v[a:b] for a, b in ranges],
            [],
            [step] * len(ranges),
            lr=lr,
            beta1=betas[0],
            beta2=betas[1],
            weight_decay=0.0,
            eps=eps,
            amsgrad=False,
            maximize=False,
        )


def lazy_polyak(target: torch.Tensor, source: torch.Tensor, ranges: list[tuple[int, int]], tau: float) -> None:
    """target = (1 - tau) target + tau source on `ranges` (the same two ops as the dense update)."""
    with torch.no_grad():
        parts = [target[a:b] for a, b in ranges]
        torch._foreach_mul_(parts, 1.0 - tau)
        torch._foreach_add_(parts, [source[a:b] for a, b in ranges], alpha=tau)
