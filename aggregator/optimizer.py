"""The master weights and the optimizer step that makes a version from a step's mean gradient.

    optimizer = WeightOptimizer(model_flat, config, segments)   # segments: lazy expert Adam, or None
    if optimizer.step(mean.grads, mean.norm, version):          # Adam, then the Polyak update
        version += 1
    else:                                                       # Adam overflowed: rolled back
        steps_skipped += 1

One step is Adam on every gradient group at the version's learning rate
(AggregatorConfig.lr_at), then the target critics' Polyak average
critic_target = (1 - tau) critic_target + tau critic. With `segments` (a MoE model under
`aggregator.expert_adam "lazy"`), both skip the experts the gradient left untouched
(aggregator/sparse.py). Without clipping, a huge finite gradient could overflow Adam's float32
moments: such a step is checked afterwards and undone, leaving weights and moments as they were.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from aggregator.sparse import ExpertSegments, lazy_adam_step, lazy_polyak
from foundation.config import AggregatorConfig
from foundation.policy import GRADIENT_GROUPS, GROUPS

CRITICS = ("critic", "critic_target")
HUGE_GRADIENT = 1e15  # an element this large squares past float32 range inside Adam


class WeightOptimizer:
    """Flat weights per group (GROUPS), and one Adam over the gradient groups."""

    def __init__(
        self, flat: dict[str, np.ndarray], config: AggregatorConfig, segments: ExpertSegments | None = None
    ) -> None:
        self.config = config
        # Each group one flat leaf tensor: the optimizer state is then a handful of vectors that
        # checkpoint and restore trivially.
        self.flat = {g: torch.nn.Parameter(torch.from_numpy(flat[g])) for g in GROUPS}
        # fused: one kernel per step instead of several (0.21 vs 0.30 ms for 150k params here).
        # One optimizer, one parameter group per gradient group: one step() call per version (each
        # call costs ~0.25 ms of Python around a 0.02 ms kernel). Checkpoints keep one state
        # dict per group (per_group_state).
        groups = [{"params": [self.flat[g]]} for g in GRADIENT_GROUPS]
        self.adam = torch.optim.Adam(groups, lr=config.lr, betas=(config.adam_beta1, 0.999), fused=True)
        self.segments = segments  # MoE: Adam and the Polyak average skip untouched experts
        self._critic_ever: list[np.ndarray] | None = None  # experts the critic's gradient ever touched
        self.sizes = {g: self.flat[g].numel() for g in GROUPS}

    def step(self, grads: dict[str, np.ndarray], grad_norm: float, version: int) -> bool:
        """Adam on `grads` (finite, float32; `grad_norm` their L2 norm) at version's learning
        rate, then the Polyak update. False: Adam overflowed and the step was undone."""
        # No element exceeds the L2 norm, so a norm below the bound rules one out without a pass;
        # only huge steps are snapshotted, which keeps the common step cheap.
        huge = (
            grad_norm > HUGE_GRADIENT and max(float(np.abs(v).max(initial=0)) for v in grads.values()) > HUGE_GRADIENT
        )
        saved = self._snapshot() if huge else None
        for g in GRADIENT_GROUPS:
            grad = grads[g] if grads[g].flags.writeable else grads[g].copy()  # a decoded push is read-only
            self.flat[g].grad = torch.from_numpy(grad)
        critic_ranges = self._adam(grads, version)
        if saved is not None and not self._finite():
            self._restore(saved)
            return False
        self._polyak(critic_ranges)
        return True

    def _adam(self, grads: dict[str, np.ndarray], version: int) -> list[tuple[int, int]] | None:
        """Adam on every gradient group (their .grad set); with lazy expert steps, only on what
        the gradient touches, and returns the critic ranges the Polyak average must cover (None:
        all of it). The first step is dense: it makes the optimizer's state (and, every moment
        being zero, moves no untouched expert)."""
        if self.config.lr_final > 0:
            for param_group in self.adam.param_groups:
                param_group["lr"] = self.config.lr_at(version)
        if self.segments is None or not self.adam.state:
            self.adam.step()
            if self.segments is not None:
                self._critic_ever = self.segments.hits("critic", grads["critic"])
            return None
        for group, param_group in zip(GRADIENT_GROUPS, self.adam.param_groups, strict=True):
            param = self.flat[group]
            hits = self.segments.hits(group, grads[group])
            if group == "critic":  # after a restore: the experts whose target copy differs
                ever = self._critic_ever or self.segments.differing("critic", *self.views(CRITICS).values())
                self._critic_ever = [a | b for a, b in zip(ever, hits, strict=True)]
            ranges = self.segments.ranges(group, hits)
            lr, betas, eps = param_group["lr"], param_group["betas"], param_group["eps"]
            grad = param.grad
            assert grad is not None  # set by step
            lazy_adam_step(param, grad, self.adam.state[param], ranges, lr, betas, eps)
        assert self._critic_ever is not None
        return self.segments.ranges("critic", self._critic_ever)  # the target copy: the same layout

    def _polyak(self, critic_ranges: list[tuple[int, int]] | None) -> None:
        """The target critics move by tau toward the critics, once per version."""
        with torch.no_grad():
            if critic_ranges is None:
                target = self.flat["critic_target"]
                target.mul_(1.0 - self.config.tau).add_(self.flat["critic"], alpha=self.config.tau)
            else:
                lazy_polyak(self.flat["critic_target"], self.flat["critic"], critic_ranges, self.config.tau)

    def _snapshot(self) -> dict:
        return {
            "flat": {g: self.flat[g].detach().clone() for g in GRADIENT_GROUPS},
            "optim": copy.deepcopy(self.adam.state_dict()),
        }

    def _finite(self) -> bool:
        tensors: list[torch.Tensor] = [self.flat[g] for g in GRADIENT_GROUPS]
        for state in self.adam.state.values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
        return all(bool(torch.isfinite(t).all()) for t in tensors)

    def _restore(self, saved: dict) -> None:
        with torch.no_grad():
            for g in GRADIENT_GROUPS:
                self.flat[g].copy_(saved["flat"][g])
            self.adam.load_state_dict(saved["optim"])

    def view(self, group: str) -> np.ndarray:
        """The live flat vector of `group`, uncopied: the next step changes it in place."""
        return self.flat[group].detach().numpy()

    def views(self, groups: tuple[str, ...] = GROUPS) -> dict[str, np.ndarray]:
        return {g: self.view(g) for g in groups}

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Overwrite the named groups' flat vectors (a restore, or the normalizer's new state)."""
        with torch.no_grad():
            for g, values in weights.items():
                self.flat[g].copy_(torch.from_numpy(np.asarray(values)))

    def state(self) -> dict[str, dict]:
        """Adam's state, one plain Adam state dict per gradient group, copied: the moments are
        stepped in place, and a checkpoint is written by another thread after this returns."""
        return copy.deepcopy(per_group_state(self.adam.state_dict()))

    def load_state(self, groups: dict[str, dict]) -> None:
        """Adam's state from state(); the lazy step relearns which target experts differ."""
        self.adam.load_state_dict(merged_state(groups))
        self._critic_ever = None


def per_group_state(state: dict) -> dict[str, dict]:
    """The optimizer's state dict as one Adam state dict per gradient group (parameter 0 each):
    the checkpoint format."""
    return {
        g: {
            "state": {0: state["state"][i]} if i in state["state"] else {},
            "param_groups": [dict(state["param_groups"][i], params=[0])],
        }
        for i, g in enumerate(GRADIENT_GROUPS)
    }


def merged_state(groups: dict[str, dict]) -> dict:
    """per_group_state's inverse: one state dict, parameter i for the i-th gradient group."""
    state = {i: groups[g]["state"][0] for i, g in enumerate(GRADIENT_GROUPS) if 0 in groups[g]["state"]}
    params = [dict(groups[g]["param_groups"][0], params=[i]) for i, g in enumerate(GRADIENT_GROUPS)]
    return {"state": state, "param_groups": params}
