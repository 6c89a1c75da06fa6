"""The door of the aggregator's math: a pushed gradient fits the model, or it is refused.

    validator = GradientValidator(spec, sizes, max_input_abs=config.max_input_abs)
    squares = validator.check(grads, norm_stats, batch_size)   # raises GradientError
    norm = math.sqrt(squares)                                  # the gradient's L2 norm

A gradient has exactly the model's gradient groups, each a flat vector of the group's size with
no NaN or inf; its normalizer statistics describe a real batch (see check_norm_stats). A refused
push raises GradientError naming the offending field and changes nothing: nothing is pending
or stepped before a push passes here.
"""

from __future__ import annotations

import numpy as np

from foundation.errors import FleetrlError
from foundation.policy import GRADIENT_GROUPS, ModelSpec
from foundation.wire import cap

NORM_STATS_FIELD = "tensors[norm_stats]"


class GradientError(FleetrlError, ValueError):
    """A pushed gradient does not fit the model; `field` names the tensor."""

    field: str  # always set: the offending field

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def norm_stats_size(spec: ModelSpec) -> int:
    """Length of a batch's normalizer statistics: per block [count, sums..., sums of squares...]."""
    return spec.norm_rows * (1 + 2 * spec.input_dim)


class GradientValidator:
    """Checks pushes against one model: `sizes` is each gradient group's flat length."""

    def __init__(self, spec: ModelSpec, sizes: dict[str, int], max_input_abs: float) -> None:
        self.spec = spec
        self.sizes = {g: sizes[g] for g in GRADIENT_GROUPS}
        self.max_input_abs = max_input_abs

    def check(self, grads: dict[str, np.ndarray], norm_stats: np.ndarray, batch_size: int = 0) -> float:
        """Raise GradientError unless grads has exactly the gradient groups, right sizes, finite,
        and the normalizer statistics describe a real batch (see check_norm_stats). Returns the
        gradient's sum of squares over every group (its squared L2 norm, float64)."""
        self.check_norm_stats(norm_stats, batch_size)
        missing = [g for g in GRADIENT_GROUPS if g not in grads]
        if missing:
            raise GradientError("tensors", f"missing group(s) {missing}; expected {list(GRADIENT_GROUPS)}")
        extra = sorted(set(grads) - set(GRADIENT_GROUPS))
        if extra:
            shown = [cap(name, 30) for name in extra[:3]] + ([f"and {len(extra) - 3} more"] if len(extra) > 3 else [])
            raise GradientError("tensors", f"unknown group(s) {shown}; expected {list(GRADIENT_GROUPS)}")
        squares = 0.0
        for g in GRADIENT_GROUPS:
            if grads[g].shape != (self.sizes[g],):
                raise GradientError(f"tensors[{g}].shape", f"{list(grads[g].shape)}, expected [{self.sizes[g]}]")
            part = sum_of_squares(grads[g])  # one pass, no temporary: finite iff every element is
            if not np.isfinite(part):
                raise GradientError(f"tensors[{g}].data", "contains NaN or inf")
            squares += part
        return squares

    def check_norm_stats(self, stats: np.ndarray, batch_size: int = 0) -> None:
        """[count, sums, sums of squares] of a batch: count >= 1 (and <= batch_size when given),
        finite, inputs within max_input_abs, and sums of squares consistent with the sums.
        These totals are never forgotten, so one bad push would skew every later version."""
        field = NORM_STATS_FIELD
        size = norm_stats_size(self.spec)
        if stats.shape != (size,):
            raise GradientError(f"{field}.shape", f"{list(stats.shape)}, expected [{size}]")
        if not np.all(np.isfinite(stats)):
            raise GradientError(f"{field}.data", "contains NaN or inf")
        dim = self.spec.input_dim
        blocks = stats.astype(np.float64).reshape(self.spec.norm_rows, 1 + 2 * dim)  # one per task with task_norm
        counts = blocks[:, 0]
        total = float(counts.sum())
        if np.any(counts < 0) or np.any(counts != np.round(counts)) or total < 1 or (batch_size and total > batch_size):
            limit = f" and <= batch_size ({batch_size})" if batch_size else ""
            raise GradientError(f"{field}.data", f"count {total:g} must be a whole number >= 1{limit}")
        count = counts[:, None]
        sums, squares = blocks[:, 1 : 1 + dim], blocks[:, 1 + dim :]
        bound = self.max_input_abs
        if np.any(np.abs(sums) > count * bound) or np.any(squares > count * bound * bound):
            raise GradientError(f"{field}.data", f"implies inputs beyond max_input_abs ({bound:g})")
        # Cauchy-Schwarz: sum(x)^2 <= n * sum(x^2), up to float32 rounding.
        if np.any(squares < 0) or np.any(sums * sums > count * squares * (1 + 1e-3) + 1e-3):
            raise GradientError(f"{field}.data", "sums of squares are inconsistent with the sums")


def global_norm(vectors: dict[str, np.ndarray]) -> float:
    """L2 norm over every group."""
    return float(np.sqrt(sum(sum_of_squares(v) for v in vectors.values())))


def sum_of_squares(v: np.ndarray) -> float:
    """sum(v * v) in one pass without a temporary: finite exactly when every element is (a NaN
    or inf element makes it NaN or inf; finite float32 elements square and sum within float64's
    range). einsum, not np.dot: a BLAS call here woke OpenBLAS's thread pool on every step (4 ms,
    and spinning threads that took CPU from the learner). float32 squares of elements past
    ~1.8e19 overflow: those are summed again in float64."""
    part = float(np.einsum("i,i->", v, v))
    if not np.isfinite(part) and v.dtype != np.float64:
        part = float(np.einsum("i,i->", v.astype(np.float64), v.astype(np.float64)))
    return part
