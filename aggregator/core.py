"""The aggregator's math, free of any transport: master weights, optimizers, versions.

    core = AggregatorCore(spec, config)
    while running:
        grads, stats = <one flat vector per group, and batch input statistics, from a learner>
        step = core.submit(base_version, grads, stats)   # averages, steps when enough arrived
        if step.applied: broadcast(core.version, core.weights())

A version is one optimizer step. It only ever grows and survives restarts through
checkpoints (see aggregator/checkpoint.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fleetrl.config import AggregatorConfig
from learner.models import GRADIENT_GROUPS, GROUPS, ModelSpec, SACModel, norm_from_stats


class GradientError(ValueError):
    """A pushed gradient does not fit the model; `field` names the tensor."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class SubmitResult:
    applied: bool  # this push completed a step (or was folded into the pending one)
    stale: bool  # dropped: computed against weights too old to help
    version: int


class AggregatorCore:
    def __init__(
        self, spec: ModelSpec, config: AggregatorConfig, grads_per_step: int, max_staleness: int, task: str = ""
    ) -> None:
        if grads_per_step < 1:
            raise ValueError(f"grads_per_step ({grads_per_step}) must be >= 1: no gradient, no step")
        torch.manual_seed(config.seed)
        self.spec = spec
        self.task = task  # recorded in checkpoints, so an exported policy knows its task
        self.config = config
        self.grads_per_step = grads_per_step
        self.max_staleness = max_staleness
        self.model = SACModel(spec, init_log_alpha=config.init_log_alpha)
        self.version = 0
        # Adam per group, each group one flat leaf tensor: the optimizer state is then a
        # handful of vectors that checkpoint and restore trivially.
        self._flat = {g: torch.nn.Parameter(torch.from_numpy(self.model.get_flat(g))) for g in GROUPS}
        self._optim = {g: torch.optim.Adam([self._flat[g]], lr=config.lr) for g in GRADIENT_GROUPS}
        self._pending: list[dict[str, np.ndarray]] = []
        self.sizes = {g: self._flat[g].numel() for g in GROUPS}
        # Running totals behind the shared input normalizer: [count, sum..., sum of squares...].
        self._norm_totals = np.zeros(1 + 2 * spec.input_dim, np.float64)

    def check(self, grads: dict[str, np.ndarray], norm_stats: np.ndarray) -> None:
        """Raise GradientError unless grads has exactly the gradient groups, right sizes, finite."""
        if norm_stats.shape != self._norm_totals.shape:
            raise GradientError(
                "tensors[norm_stats].shape", f"{list(norm_stats.shape)}, expected [{self._norm_totals.size}]"
            )
        if not np.all(np.isfinite(norm_stats)) or norm_stats[0] < 0:
            raise GradientError("tensors[norm_stats].data", "contains NaN, inf or a negative count")
        missing = [g for g in GRADIENT_GROUPS if g not in grads]
        if missing:
            raise GradientError("tensors", f"missing group(s) {missing}; expected {list(GRADIENT_GROUPS)}")
        extra = sorted(set(grads) - set(GRADIENT_GROUPS))
        if extra:
            raise GradientError("tensors", f"unknown group(s) {extra}; expected {list(GRADIENT_GROUPS)}")
        for g in GRADIENT_GROUPS:
            if grads[g].shape != (self.sizes[g],):
                raise GradientError(f"tensors[{g}].shape", f"{list(grads[g].shape)}, expected [{self.sizes[g]}]")
            if not np.all(np.isfinite(grads[g])):
                raise GradientError(f"tensors[{g}].data", "contains NaN or inf")

    def submit(self, base_version: int, grads: dict[str, np.ndarray], norm_stats: np.ndarray) -> SubmitResult:
        """Queue one learner's gradients; step once `grads_per_step` are pending."""
        self.check(grads, norm_stats)
        if base_version > self.version:
            raise GradientError("base_version", f"{base_version} is ahead of the aggregator ({self.version})")
        if self.version - base_version > self.max_staleness:
            return SubmitResult(applied=False, stale=True, version=self.version)
        self._pending.append(grads)
        self._norm_totals += norm_stats
        if len(self._pending) >= self.grads_per_step:
            self._step()
        return SubmitResult(applied=True, stale=False, version=self.version)

    def _step(self) -> None:
        for g in GRADIENT_GROUPS:
            mean = np.mean([p[g] for p in self._pending], axis=0)
            self._optim[g].zero_grad(set_to_none=False)
            self._flat[g].grad = torch.from_numpy(np.asarray(mean, dtype=np.float32))
            self._optim[g].step()
        self._pending.clear()
        with torch.no_grad():
            # Polyak averaging of the target critics, once per version.
            self._flat["critic_target"].mul_(1.0 - self.config.tau).add_(self._flat["critic"], alpha=self.config.tau)
            norm = norm_from_stats(self._norm_totals, self.spec.input_dim)
            self._flat["obs_norm"].copy_(torch.from_numpy(norm))
        self.version += 1

    def weights(self, groups: tuple[str, ...] = GROUPS) -> dict[str, np.ndarray]:
        """Copies of the current flat vectors (safe to serialize while the next step runs)."""
        return {g: self._flat[g].detach().numpy().copy() for g in groups}

    def state(self) -> dict:
        return {
            "version": self.version,
            "task": self.task,
            "spec": self.spec.to_json(),
            "weights": self.weights(),
            "optim": {g: self._optim[g].state_dict() for g in GRADIENT_GROUPS},
            "norm_totals": self._norm_totals.copy(),
        }

    def load_state(self, state: dict) -> None:
        if state["spec"] != self.spec.to_json():
            raise ValueError(f"checkpoint model {state['spec']} does not match {self.spec.to_json()}")
        with torch.no_grad():
            for g in GROUPS:
                self._flat[g].copy_(torch.from_numpy(state["weights"][g]))
        for g in GRADIENT_GROUPS:
            self._optim[g].load_state_dict(state["optim"][g])
        self._norm_totals = np.array(state["norm_totals"], np.float64)
        self.version = int(state["version"])
        self._pending.clear()
