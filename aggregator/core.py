"""The aggregator's math, free of any transport: master weights, optimizers, versions.

    core = AggregatorCore(spec, config, grads_per_step, max_staleness, task)
    while running:
        grads, stats = <one flat vector per group, and batch input statistics, from a learner>
        step = core.submit(base_version, grads, stats, learner, batch_size)  # steps when K arrived
        core.close_due()        # ... or, called every few ms, when the step's deadline passed
        if core.version rose: broadcast(core.version, core.weights())

K-of-M: a step closes once K learners (`grads_per_step`) have a gradient pending, or once the
first of them is `step_deadline_ms` old, or once a learner with a gradient pending sends its
next, with what has arrived; a straggler's gradient then joins a later step (discounted by
its staleness) instead of stalling this one. The step's gradient is the weighted mean
sum(w_i g_i) / sum(w_i), w_i = batch_i / (1 + staleness_i)^p: each gradient is a mean over its
batch, so weighting by batch size makes M learners of batch B one learner of batch M*B on the
same data (tests/test_aggregator_core.py), and the staleness discount trusts gradients
computed on older weights less (staleness-aware async SGD, Zhang et al. 2016).

A version is one optimizer step. It only ever grows and survives restarts through
checkpoints: `state()` and `load_state()`, written and restored by aggregator/persistence.py
in the file format of foundation/checkpoint.py.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np
import torch

from aggregator.sparse import ExpertSegments, lazy_adam_step, lazy_polyak
from aggregator.swa import LayeredSWA
from foundation.config import AggregatorConfig
from foundation.errors import FleetrlError
from foundation.policy import SWA_GROUP
from foundation.wire import cap
from nets.models import GRADIENT_GROUPS, GROUPS, ModelSpec, SACModel, norm_from_stats

CRITICS = ("critic", "critic_target")
HUGE_GRADIENT = 1e15  # an element this large squares past float32 range inside Adam


class GradientError(FleetrlError, ValueError):
    """A pushed gradient does not fit the model; `field` names the tensor."""

    field: str  # always set: the offending field

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class SubmitResult:
    applied: bool  # this push completed a step (or was folded into the pending one)
    stale: bool  # dropped: computed against weights too old to help
    version: int
    reason: str = ""  # why it was not applied ("" when applied)


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
        # fused: one kernel per step instead of several (0.21 vs 0.30 ms for 150k params here).
        # One optimizer, one parameter group per gradient group: one step() call per version (each
        # call costs ~0.25 ms of Python around a 0.02 ms kernel). Checkpoints keep one state
        # dict per group (per_group_state), the format of the one-optimizer-per-group days.
        groups = [{"params": [self._flat[g]]} for g in GRADIENT_GROUPS]
        self._optim = torch.optim.Adam(groups, lr=config.lr, betas=(config.adam_beta1, 0.999), fused=True)
        # MoE: Adam and the Polyak average skip the experts a version leaves untouched.
        self._segments: ExpertSegments | None = None
        if spec.kind == "moe" and config.expert_adam == "lazy":
            self._segments = ExpertSegments(self.model, GRADIENT_GROUPS)
        self._critic_ever: list[np.ndarray] | None = None  # experts the critic's gradient ever touched
        self._pending: dict[str, dict[str, np.ndarray]] = {}  # learner -> its gradient for this step
        self._weights: dict[str, float] = {}  # learner -> its gradient's weight in the step's mean
        self._squares: dict[str, float] = {}  # learner -> its gradient's squared norm (from check)
        self._opened = 0.0  # monotonic time the pending step's first gradient arrived
        self.deadline_steps = 0  # steps closed by the deadline with fewer than grads_per_step
        self.repeat_steps = 0  # ... closed early by a pending learner's next gradient
        self.steps_skipped = 0  # steps whose mean gradient was not finite: nothing applied
        self.clipped = 0  # steps whose mean gradient was clipped to max_grad_norm
        self.sizes = {g: self._flat[g].numel() for g in GROUPS}
        # The actor's weight average (aggregator/swa.py), fed by the evaluator's scores. A
        # layered run also keeps the plain average of the same offers, never served or scored
        # live: checkpoints hold both, so one run compares them (benchmarks/moe_ablation.py).
        self.swa = self.swa_plain = None
        if config.swa != "off":
            self.swa = LayeredSWA(spec, config.swa, config.swa_router_window, config.swa_expert_window)
        if config.swa == "layered":
            self.swa_plain = LayeredSWA(spec, "plain", config.swa_expert_window, config.swa_expert_window)
        self.live_score: float | None = None  # the evaluator's newest curve score of the live policy
        # Running totals behind the shared input normalizer: [count, sum..., sum of squares...].
        self._norm_totals = np.zeros(spec.norm_rows * (1 + 2 * spec.input_dim), np.float64)

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
            part = _sum_of_squares(grads[g])  # one pass, no temporary: finite iff every element is
            if not np.isfinite(part):
                raise GradientError(f"tensors[{g}].data", "contains NaN or inf")
            squares += part
        return squares

    def check_norm_stats(self, stats: np.ndarray, batch_size: int = 0) -> None:
        """[count, sums, sums of squares] of a batch: count >= 1 (and <= batch_size when given),
        finite, inputs within max_input_abs, and sums of squares consistent with the sums.
        These totals are never forgotten, so one bad push would skew every later version."""
        field = "tensors[norm_stats]"
        if stats.shape != self._norm_totals.shape:
            raise GradientError(f"{field}.shape", f"{list(stats.shape)}, expected [{self._norm_totals.size}]")
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
        bound = self.config.max_input_abs
        if np.any(np.abs(sums) > count * bound) or np.any(squares > count * bound * bound):
            raise GradientError(f"{field}.data", f"implies inputs beyond max_input_abs ({bound:g})")
        # Cauchy-Schwarz: sum(x)^2 <= n * sum(x^2), up to float32 rounding.
        if np.any(squares < 0) or np.any(sums * sums > count * squares * (1 + 1e-3) + 1e-3):
            raise GradientError(f"{field}.data", "sums of squares are inconsistent with the sums")

    def submit(
        self,
        base_version: int,
        grads: dict[str, np.ndarray],
        norm_stats: np.ndarray,
        learner: str = "",
        batch_size: int = 0,
    ) -> SubmitResult:
        """Queue one learner's gradients; step once `grads_per_step` learners have one pending.

        A learner contributes at most one gradient to a step: its next one while its first is
        pending closes the step with what has arrived (the others are slower than it) and opens
        the next, so one fast learner cannot fill a step alone, and none waits for a straggler.
        `batch_size` (0: unknown, taken as 1) weighs it in the step's mean.
        """
        squares = self.check(grads, norm_stats, batch_size)
        if base_version > self.version:
            raise GradientError("base_version", f"{base_version} is ahead of the aggregator ({self.version})")
        if self.version - base_version > self.max_staleness:
            reason = "stale: computed against weights older than max_grad_staleness"
            return SubmitResult(applied=False, stale=True, version=self.version, reason=reason)
        if learner in self._pending:
            self.repeat_steps += 1
            self._step()
        if not self._pending:
            self._opened = time.monotonic()
        self._pending[learner] = grads
        self._squares[learner] = squares
        staleness = self.version - base_version
        self._weights[learner] = max(batch_size, 1) / (1.0 + staleness) ** self.config.staleness_power
        self._norm_totals += norm_stats
        if len(self._pending) >= self.grads_per_step:
            self._step()
        return SubmitResult(applied=True, stale=False, version=self.version)

    def close_due(self, now: float | None = None) -> bool:
        """Close the pending step if its deadline passed (call every few ms). True: a version
        was made."""
        deadline = self.config.step_deadline_ms / 1000.0
        if not self._pending or deadline <= 0:
            return False
        if (time.monotonic() if now is None else now) - self._opened < deadline:
            return False
        before = self.version
        self.deadline_steps += 1
        self._step()
        return self.version > before

    def _mean_gradient(self) -> tuple[dict[str, np.ndarray], float] | None:
        """The pending gradients' weighted mean, clipped to max_grad_norm, and its L2 norm; None
        when it is not finite. One gradient (one learner, or a step closed with one) is its own
        mean, in float32 and uncopied unless clipped, its norm the one check() took: the common
        case costs no pass over the weights."""
        learners = list(self._pending)
        if len(learners) == 1:
            mean = self._pending[learners[0]]
            norm = float(np.sqrt(self._squares[learners[0]]))
        else:
            weights = np.array([self._weights[name] for name in learners], np.float64)
            weights /= weights.sum()
            mean = {}
            for g in GRADIENT_GROUPS:
                # float64 accumulation: two float32 gradients near 3e38 would overflow their sum.
                total = np.zeros(self.sizes[g], np.float64)
                for weight, name in zip(weights, learners, strict=True):
                    total += weight * self._pending[name][g]
                mean[g] = total
            norm = _global_norm(mean)
        if not np.isfinite(norm):
            return None
        scale = 1.0
        if self.config.max_grad_norm > 0 and norm > self.config.max_grad_norm:
            scale = self.config.max_grad_norm / norm
            self.clipped += 1
        if scale == 1.0 and all(v.dtype == np.float32 for v in mean.values()):
            return dict(mean), norm  # finite: check() saw every element, and the norm is finite
        out = {g: np.asarray(v * scale, dtype=np.float32) for g, v in mean.items()}
        if not all(np.all(np.isfinite(v)) for v in out.values()):
            return None
        return out, norm * scale

    def _step(self) -> None:
        result = self._mean_gradient()
        self._pending.clear()
        self._weights.clear()
        self._squares.clear()
        if result is None:
            self.steps_skipped += 1  # nothing applied and no new version: the weights stay sound
            return
        mean, grad_norm = result
        # Without clipping, a huge finite gradient could overflow Adam's float32 moments. Such a
        # step is checked afterwards and undone (kept cheap: only huge ones are snapshotted).
        # No element exceeds the L2 norm, so a norm below the bound rules one out without a pass.
        huge = grad_norm > HUGE_GRADIENT and max(float(np.abs(v).max(initial=0)) for v in mean.values()) > HUGE_GRADIENT
        saved = self._optimizer_snapshot() if huge else None
        for g in GRADIENT_GROUPS:
            grad = mean[g] if mean[g].flags.writeable else mean[g].copy()  # a decoded push is read-only
            self._flat[g].grad = torch.from_numpy(grad)
        critic_ranges = self._optimize(mean)
        if saved is not None and not self._optimizer_finite():
            self._restore_optimizer(saved)
            self.steps_skipped += 1
            return
        with torch.no_grad():
            # Polyak averaging of the target critics, once per version.
            if critic_ranges is None:
                target = self._flat["critic_target"]
                target.mul_(1.0 - self.config.tau).add_(self._flat["critic"], alpha=self.config.tau)
            else:
                lazy_polyak(self._flat["critic_target"], self._flat["critic"], critic_ranges, self.config.tau)
            norm = norm_from_stats(self._norm_totals, self.spec.input_dim, self.spec.norm_rows, self.spec.one_hot)
            self._flat["obs_norm"].copy_(torch.from_numpy(norm))
        self.version += 1

    def _optimize(self, mean: dict[str, np.ndarray]) -> list[tuple[int, int]] | None:
        """Adam on every gradient group (their .grad set); with lazy expert steps, only on what
        the gradient touches, and returns the critic ranges the Polyak average must cover (None:
        all of it). The first step is dense: it makes the optimizer's state (and, every moment
        being zero, moves no untouched expert). Its learning rate is the version's (lr_at)."""
        if self.config.lr_final > 0:
            for param_group in self._optim.param_groups:
                param_group["lr"] = self.config.lr_at(self.version)
        if self._segments is None or not self._optim.state:
            self._optim.step()
            if self._segments is not None:
                self._critic_ever = self._segments.hits("critic", mean["critic"])
            return None
        for group, param_group in zip(GRADIENT_GROUPS, self._optim.param_groups, strict=True):
            param = self._flat[group]
            hits = self._segments.hits(group, mean[group])
            if group == "critic":  # after a restore: the experts whose target copy differs
                ever = self._critic_ever or self._segments.differing("critic", *self.views(CRITICS).values())
                self._critic_ever = [a | b for a, b in zip(ever, hits, strict=True)]
            ranges = self._segments.ranges(group, hits)
            lr, betas, eps = param_group["lr"], param_group["betas"], param_group["eps"]
            grad = param.grad
            assert grad is not None  # set by _step
            lazy_adam_step(param, grad, self._optim.state[param], ranges, lr, betas, eps)
        assert self._critic_ever is not None
        return self._segments.ranges("critic", self._critic_ever)  # the target copy: the same layout

    def _optimizer_snapshot(self) -> dict:
        return {
            "flat": {g: self._flat[g].detach().clone() for g in GRADIENT_GROUPS},
            "optim": copy.deepcopy(self._optim.state_dict()),
        }

    def _optimizer_finite(self) -> bool:
        tensors: list[torch.Tensor] = [self._flat[g] for g in GRADIENT_GROUPS]
        for state in self._optim.state.values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
        return all(bool(torch.isfinite(t).all()) for t in tensors)

    def _restore_optimizer(self, saved: dict) -> None:
        with torch.no_grad():
            for g in GRADIENT_GROUPS:
                self._flat[g].copy_(saved["flat"][g])
            self._optim.load_state_dict(saved["optim"])

    def views(self, groups: tuple[str, ...] = GROUPS) -> dict[str, np.ndarray]:
        """The live flat vectors, uncopied: read them before the next step (under a lock).
        "actor_swa" is the weight average (the live actor until one exists)."""
        return {g: self._view(g) for g in groups}

    def weights(self, groups: tuple[str, ...] = GROUPS) -> dict[str, np.ndarray]:
        """Copies of the current flat vectors (safe to serialize while the next step runs)."""
        return {g: self._view(g).copy() for g in groups}

    def _view(self, group: str) -> np.ndarray:
        if group == SWA_GROUP:
            average = self.swa.average() if self.swa is not None else None
            return average if average is not None else self._flat["actor"].detach().numpy()
        return self._flat[group].detach().numpy()

    def state(self) -> dict:
        return {
            "version": self.version,
            "task": self.task,
            "spec": self.spec.to_json(),
            "weights": self.weights(),
            # Copies: the moments are stepped in place, and a checkpoint is written by another
            # thread after this returns (it once could hold moments a few steps past its weights).
            "optim": copy.deepcopy(per_group_state(self._optim.state_dict())),
            "norm_totals": self._norm_totals.copy(),
            **({"swa": self.swa.state() | {"live_score": self.live_score}} if self.swa is not None else {}),
            **({"swa_plain": self.swa_plain.state()} if self.swa_plain is not None else {}),
        }

    def load_state(self, state: dict) -> None:
        if ModelSpec.from_json(state["spec"]) != self.spec:  # a spec from before the MoE fields is dense
            raise ValueError(f"checkpoint model {state['spec']} does not match {self.spec.to_json()}")
        with torch.no_grad():
            for g in GROUPS:
                self._flat[g].copy_(torch.from_numpy(state["weights"][g]))
        self._optim.load_state_dict(merged_state(state["optim"]))
        self._norm_totals = np.array(state["norm_totals"], np.float64)
        self.version = int(state["version"])
        saved = state.get("swa") or {}
        if self.swa is not None and saved.get("actor") is not None:  # the window restarts from the average
            self.swa.offer(self.version, saved["actor"], saved.get("score") or 0.0)
            self.swa.score = saved.get("score")
        self._pending.clear()
        self._weights.clear()
        self._squares.clear()
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


def _global_norm(vectors: dict[str, np.ndarray]) -> float:
    """L2 norm over every group."""
    return float(np.sqrt(sum(_sum_of_squares(v) for v in vectors.values())))


def _sum_of_squares(v: np.ndarray) -> float:
    """sum(v * v) in one pass without a temporary: finite exactly when every element is (a NaN
    or inf element makes it NaN or inf; finite float32 elements square and sum within float64's
    range). einsum, not np.dot: a BLAS call here woke OpenBLAS's thread pool on every step (4 ms,
    and spinning threads that took CPU from the learner). float32 squares of elements past
    ~1.8e19 overflow: those are summed again in float64."""
    part = float(np.einsum("i,i->", v, v))
    if not np.isfinite(part) and v.dtype != np.float64:
        part = float(np.einsum("i,i->", v.astype(np.float64), v.astype(np.float64)))
    return part
