"""K-of-M step assembly: which learners' gradients make one version, and their mean.

    assembly = StepAssembly(config, grads_per_step=K, max_staleness=S)
    staleness = assembly.staleness(base_version, version)    # None: too stale, drop the push
    if assembly.holds(learner): step(assembly.close())        # its next gradient closes the step
    if assembly.add(learner, grads, squares, staleness, batch_size):
        step(assembly.close())                                # K learners have one pending
    if assembly.due(): step(assembly.close())                 # ... or the deadline passed

A step closes once K learners (`grads_per_step`) have a gradient pending, or once the first of
them is `step_deadline_ms` old, or once a learner with a gradient pending sends its next, with
what has arrived; a straggler's gradient then joins a later step (discounted by its staleness)
instead of stalling this one. The step's gradient is the weighted mean sum(w_i g_i) / sum(w_i),
w_i = batch_i / (1 + staleness_i)^p: each gradient is a mean over its batch, so weighting by
batch size makes M learners of batch B one learner of batch M*B on the same data
(tests/test_aggregator_core.py), and the staleness discount trusts gradients computed on older
weights less (staleness-aware async SGD, Zhang et al. 2016). The mean is clipped to
`max_grad_norm`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from aggregator.validation import GradientError, global_norm
from foundation.config import AggregatorConfig
from foundation.policy import GRADIENT_GROUPS


@dataclass(frozen=True)
class MeanGradient:
    """A closed step's gradient: float32 and finite per group, and its L2 norm (after clipping)."""

    grads: dict[str, np.ndarray]
    norm: float


@dataclass
class _Pending:
    grads: dict[str, np.ndarray]
    weight: float  # its weight in the step's mean
    squares: float  # its squared L2 norm, from the validator


class StepAssembly:
    """The pending step's gradients, at most one per learner, and the counts of how steps closed."""

    def __init__(self, config: AggregatorConfig, grads_per_step: int, max_staleness: int) -> None:
        if grads_per_step < 1:
            raise ValueError(f"grads_per_step ({grads_per_step}) must be >= 1: no gradient, no step")
        self.grads_per_step = grads_per_step
        self.max_staleness = max_staleness
        self.staleness_power = config.staleness_power
        self.deadline_sec = config.step_deadline_ms / 1000.0
        self.max_grad_norm = config.max_grad_norm
        self.opened = 0.0  # monotonic time the pending step's first gradient arrived
        self.deadline_steps = 0  # steps closed by the deadline with fewer than grads_per_step
        self.repeat_steps = 0  # ... closed early by a pending learner's next gradient
        self.clipped = 0  # steps whose mean gradient was clipped to max_grad_norm
        self._pending: dict[str, _Pending] = {}  # learner -> its gradient for this step

    @property
    def pending(self) -> int:
        """Learners with a gradient in the pending step."""
        return len(self._pending)

    def staleness(self, base_version: int, version: int) -> int | None:
        """Versions between a push's weights and the aggregator's; None when more than
        max_staleness (the push is dropped). A push from the future is an error."""
        if base_version > version:
            raise GradientError("base_version", f"{base_version} is ahead of the aggregator ({version})")
        staleness = version - base_version
        return None if staleness > self.max_staleness else staleness

    def holds(self, learner: str) -> bool:
        """True (counted as a repeat step) when `learner` already has a gradient pending: the
        caller closes the step before adding its next one."""
        if learner not in self._pending:
            return False
        self.repeat_steps += 1
        return True

    def add(self, learner: str, grads: dict[str, np.ndarray], squares: float, staleness: int, batch_size: int) -> bool:
        """Queue a checked gradient (`squares`: its squared norm); True once the step is full.
        `batch_size` (0: unknown, taken as 1) weighs it in the step's mean."""
        if not self._pending:
            self.opened = time.monotonic()
        weight = max(batch_size, 1) / (1.0 + staleness) ** self.staleness_power
        self._pending[learner] = _Pending(grads, weight, squares)
        return len(self._pending) >= self.grads_per_step

    def due(self, now: float | None = None) -> bool:
        """True (counted as a deadline step) when a step is pending past step_deadline_ms."""
        if not self._pending or self.deadline_sec <= 0:
            return False
        if (time.monotonic() if now is None else now) - self.opened < self.deadline_sec:
            return False
        self.deadline_steps += 1
        return True

    def clear(self) -> None:
        self._pending.clear()

    def close(self) -> MeanGradient | None:
        """The pending gradients' weighted mean, clipped to max_grad_norm, and clear the step;
        None when the mean is not finite. One gradient (one learner, or a step closed with one)
        is its own mean, in float32 and uncopied unless clipped, its norm the one the validator
        took: the common case costs no pass over the weights."""
        pending = list(self._pending.values())
        self._pending.clear()
        if len(pending) == 1:
            mean = pending[0].grads
            norm = float(np.sqrt(pending[0].squares))
        else:
            mean = _weighted_mean(pending)
            norm = global_norm(mean)
        if not np.isfinite(norm):
            return None
        scale = 1.0
        if self.max_grad_norm > 0 and norm > self.max_grad_norm:
            scale = self.max_grad_norm / norm
            self.clipped += 1
        if scale == 1.0 and all(v.dtype == np.float32 for v in mean.values()):
            return MeanGradient(dict(mean), norm)  # finite: the validator saw every element
        out = {g: np.asarray(v * scale, dtype=np.float32) for g, v in mean.items()}
        if not all(np.all(np.isfinite(v)) for v in out.values()):
            return None
        return MeanGradient(out, norm * scale)


def _weighted_mean(pending: list[_Pending]) -> dict[str, np.ndarray]:
    """sum(w_i g_i) / sum(w_i) per gradient group, accumulated in float64: two float32
    gradients near 3e38 would overflow their sum."""
    weights = np.array([p.weight for p in pending], np.float64)
    weights /= weights.sum()
    mean = {}
    for g in GRADIENT_GROUPS:
        total = np.zeros(pending[0].grads[g].shape, np.float64)
        for weight, p in zip(weights, pending, strict=True):
            total += weight * p.grads[g]
        mean[g] = total
    return mean
