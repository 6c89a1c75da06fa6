"""Input standardization with running statistics: the obs_norm group (nets/models.py).

    stats = norm_stats(obs_goal, task, rows)        # a learner's batch: count, sums, sums of squares
    flat = norm_from_stats(totals, dim, rows)       # the aggregator's running totals -> mean ++ std
    norm = Normalizer.for_spec(spec); norm.load_flat(flat); x = norm(obs_goal)

Every network (actor, critics, the exported ONNX) standardizes its input with the same
versioned statistics; with ModelSpec.task_norm, one row of them per task.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from foundation.policy import NORM_CLIP, ModelSpec

NORM_MIN_STD = 0.01


class Normalizer(nn.Module):
    """x -> clip((x - mean) / std, +-NORM_CLIP); mean and std are buffers, not trained.

    With one row per task (ModelSpec.task_norm), each input row is standardized with its task's
    statistics, picked by the task one-hot the input carries: mean = one_hot @ means, a MatMul,
    so the exported graph has no data-dependent control flow (as MultiTaskPolicy's routing)."""

    mean: torch.Tensor  # registered buffers: declared so they type as tensors, not Tensor | Module
    std: torch.Tensor

    def __init__(
        self, dim: int, rows: int = 1, one_hot: tuple[int, int] | None = None, hide: tuple[int, int] | None = None
    ) -> None:
        """`hide`: columns set to zero after standardizing (model.task_onehot false: the task one-hot
        picks the statistics' row, and the networks do not read it), by a constant mask: a Mul in
        an exported graph."""
        super().__init__()
        if rows > 1 and (one_hot is None or one_hot[1] - one_hot[0] != rows):
            raise ValueError(f"{rows} rows of statistics need a {rows}-column task one-hot, got {one_hot}")
        shape = (rows, dim) if rows > 1 else (dim,)
        self.one_hot = one_hot if rows > 1 else None
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("std", torch.ones(shape))
        self.keep: torch.Tensor | None = None  # not a buffer: no state_dict key, the same in every copy
        if hide is not None:
            self.keep = torch.ones(dim)
            self.keep[hide[0] : hide[1]] = 0.0

    @classmethod
    def for_spec(cls, spec: ModelSpec) -> Normalizer:
        return cls(spec.input_dim, spec.norm_rows, spec.one_hot, spec.hidden_one_hot)

    def row(self, task: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) that standardize task `task`'s inputs (ModelSpec.norm_row's, as tensors)."""
        return (self.mean, self.std) if self.one_hot is None else (self.mean[task], self.std[task])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.one_hot is None:
            out = ((x - self.mean) / self.std).clamp(-NORM_CLIP, NORM_CLIP)
        else:
            task = x[:, self.one_hot[0] : self.one_hot[1]]
            out = ((x - task @ self.mean) / (task @ self.std)).clamp(-NORM_CLIP, NORM_CLIP)
        return out if self.keep is None else out * self.keep.to(out.device)

    def load_flat(self, flat: np.ndarray) -> None:
        size = self.mean.numel()
        if flat.shape != (2 * size,):
            raise ValueError(f"obs_norm flat vector shape {flat.shape}, expected ({2 * size},)")
        with torch.no_grad():
            self.mean.copy_(torch.from_numpy(np.array(flat[:size], np.float32)).view_as(self.mean))
            self.std.copy_(torch.from_numpy(np.array(flat[size:], np.float32)).view_as(self.std))


def norm_stats(obs_goal: np.ndarray, task: np.ndarray | None = None, rows: int = 1) -> np.ndarray:
    """[count, sum..., sum of squares...] of a batch: what learners report to the aggregator;
    with rows > 1, one such block per task (`task`: each row's place in the run)."""
    x = np.asarray(obs_goal, np.float64)
    if rows == 1:
        return np.concatenate([[len(x)], x.sum(0), (x * x).sum(0)]).astype(np.float32)
    if task is None:
        raise ValueError(f"per-task statistics ({rows} rows) need each row's task")
    place = np.asarray(task, np.int64)
    return np.concatenate([norm_stats(x[place == r]) for r in range(rows)]).astype(np.float32)


def norm_from_stats(totals: np.ndarray, dim: int, rows: int = 1, one_hot: tuple[int, int] | None = None) -> np.ndarray:
    """Flat obs_norm (mean ++ std, each [rows, dim] flattened) from accumulated norm_stats totals.
    Per task: a task not seen yet keeps the identity (mean 0, std 1), and the one-hot columns
    pass unchanged (a task's own statistics would make them constant: every task 0)."""
    if rows == 1:
        count = max(float(totals[0]), 1.0)
        mean = totals[1 : 1 + dim] / count
        var = totals[1 + dim :] / count - mean * mean
        std = np.sqrt(np.maximum(var, NORM_MIN_STD**2))
        return np.concatenate([mean, std]).astype(np.float32)
    blocks = np.asarray(totals, np.float64).reshape(rows, 1 + 2 * dim)
    means, stds = np.zeros((rows, dim)), np.ones((rows, dim))
    for r, block in enumerate(blocks):
        if block[0] > 0:
            flat = norm_from_stats(block, dim)
            means[r], stds[r] = flat[:dim], flat[dim:]
    if one_hot is not None:
        means[:, one_hot[0] : one_hot[1]], stds[:, one_hot[0] : one_hot[1]] = 0.0, 1.0
    return np.concatenate([means.ravel(), stds.ravel()]).astype(np.float32)
