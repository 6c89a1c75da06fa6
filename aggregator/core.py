"""The aggregator's math, free of any transport: master weights, optimizers, versions.

    core = AggregatorCore(spec, config, grads_per_step, max_staleness, task)
    while running:
        grads, stats = <one flat vector per group, and batch input statistics, from a learner>
        step = core.submit(base_version, grads, stats, learner, batch_size)  # steps when K arrived
        core.close_due()        # ... or, called every few ms, when the step's deadline passed
        if core.version rose: broadcast(core.version, core.weights())

A composition of units that each stand alone:

- `validator` (aggregator/validation.py): a push fits the model, or GradientError names the field;
- `assembly` (aggregator/assembly.py): K-of-M steps, staleness, the deadline, the weighted mean;
- `optimizer` (aggregator/optimizer.py): the master weights, Adam (lazy over MoE experts), the
  learning-rate schedule, overflow rollback, the target critics' Polyak update;
- `normalizer` (aggregator/normalizer.py): the run's input statistics behind obs_norm;
- `swa`, `swa_plain` (aggregator/swa.py): the actor's weight averages, fed by the evaluator.

A version is one optimizer step. It only ever grows and survives restarts through
checkpoints: `state()` and `load_state()`, written and restored by aggregator/persistence.py
in the file format of foundation/checkpoint.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from aggregator.assembly import StepAssembly
from aggregator.normalizer import NormalizerTotals
from aggregator.optimizer import WeightOptimizer
from aggregator.sparse import ExpertSegments
from aggregator.swa import LayeredSWA
from aggregator.validation import GradientError, GradientValidator
from foundation.config import AggregatorConfig
from foundation.policy import SWA_GROUP
from nets.models import GRADIENT_GROUPS, GROUPS, ModelSpec, SACModel

__all__ = ["AggregatorCore", "GradientError", "SubmitResult"]

STALE = "stale: computed against weights older than max_grad_staleness"


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
        self.assembly = StepAssembly(config, grads_per_step, max_staleness)
        torch.manual_seed(config.seed)
        self.spec = spec
        self.task = task  # recorded in checkpoints, so an exported policy knows its task
        self.config = config
        self.version = 0
        model = SACModel(spec, init_log_alpha=config.init_log_alpha)
        # MoE: Adam and the Polyak average skip the experts a version leaves untouched.
        lazy = spec.kind == "moe" and config.expert_adam == "lazy"
        segments = ExpertSegments(model, GRADIENT_GROUPS) if lazy else None
        self.optimizer = WeightOptimizer({g: model.get_flat(g) for g in GROUPS}, config, segments)
        self.sizes = self.optimizer.sizes
        self.validator = GradientValidator(spec, self.sizes, config.max_input_abs)
        self.normalizer = NormalizerTotals(spec)
        self.steps_skipped = 0  # steps that made no version: a mean not finite, or Adam overflowed
        # The actor's weight average (aggregator/swa.py), fed by the evaluator's scores. A
        # layered run also keeps the plain average of the same offers, never served or scored
        # live: checkpoints hold both, so one run compares them (benchmarks/moe_ablation.py).
        self.swa = self.swa_plain = None
        if config.swa != "off":
            self.swa = LayeredSWA(spec, config.swa, config.swa_router_window, config.swa_expert_window)
        if config.swa == "layered":
            self.swa_plain = LayeredSWA(spec, "plain", config.swa_expert_window, config.swa_expert_window)
        self.live_score: float | None = None  # the evaluator's newest curve score of the live policy

    @property
    def grads_per_step(self) -> int:
        return self.assembly.grads_per_step

    @property
    def max_staleness(self) -> int:
        return self.assembly.max_staleness

    @property
    def deadline_steps(self) -> int:
        """Steps closed by the deadline with fewer than grads_per_step."""
        return self.assembly.deadline_steps

    @property
    def repeat_steps(self) -> int:
        """Steps closed early by a pending learner's next gradient."""
        return self.assembly.repeat_steps

    @property
    def clipped(self) -> int:
        """Steps whose mean gradient was clipped to max_grad_norm."""
        return self.assembly.clipped

    def check(self, grads: dict[str, np.ndarray], norm_stats: np.ndarray, batch_size: int = 0) -> float:
        """GradientValidator.check: raises GradientError, returns the squared norm."""
        return self.validator.check(grads, norm_stats, batch_size)

    def check_norm_stats(self, stats: np.ndarray, batch_size: int = 0) -> None:
        """GradientValidator.check_norm_stats: raises GradientError."""
        self.validator.check_norm_stats(stats, batch_size)

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
        squares = self.validator.check(grads, norm_stats, batch_size)
        if self.assembly.staleness(base_version, self.version) is None:
            return SubmitResult(applied=False, stale=True, version=self.version, reason=STALE)
        if self.assembly.holds(learner):
            self._step()  # the version it lands in may be one newer: its staleness is counted after
        self.normalizer.add(norm_stats)
        if self.assembly.add(learner, grads, squares, self.version - base_version, batch_size):
            self._step()
        return SubmitResult(applied=True, stale=False, version=self.version)

    def close_due(self, now: float | None = None) -> bool:
        """Close the pending step if its deadline passed (call every few ms). True: a version
        was made."""
        if not self.assembly.due(now):
            return False
        before = self.version
        self._step()
        return self.version > before

    def _step(self) -> None:
        """Close the pending step: its mean through the optimizer, then the normalizer's new
        statistics, and version + 1; a mean not finite or an overflowing step changes nothing."""
        mean = self.assembly.close()
        if mean is None or not self.optimizer.step(mean.grads, mean.norm, self.version):
            self.steps_skipped += 1  # nothing applied and no new version: the weights stay sound
            return
        self.optimizer.set_weights({"obs_norm": self.normalizer.flat()})
        self.version += 1

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
            return average if average is not None else self.optimizer.view("actor")
        return self.optimizer.view(group)

    def state(self) -> dict:
        return {
            "version": self.version,
            "task": self.task,
            "spec": self.spec.to_json(),
            "weights": self.weights(),
            "optim": self.optimizer.state(),
            "norm_totals": self.normalizer.state(),
            **({"swa": self.swa.state() | {"live_score": self.live_score}} if self.swa is not None else {}),
            **({"swa_plain": self.swa_plain.state()} if self.swa_plain is not None else {}),
        }

    def load_state(self, state: dict) -> None:
        if ModelSpec.from_json(state["spec"]) != self.spec:  # a spec from before the MoE fields is dense
            raise ValueError(f"checkpoint model {state['spec']} does not match {self.spec.to_json()}")
        self.optimizer.set_weights({g: state["weights"][g] for g in GROUPS})
        self.optimizer.load_state(state["optim"])
        self.normalizer.load_state(state["norm_totals"])
        self.version = int(state["version"])
        saved = state.get("swa") or {}
        if self.swa is not None and saved.get("actor") is not None:  # the window restarts from the average
            self.swa.offer(self.version, saved["actor"], saved.get("score") or 0.0)
            self.swa.score = saved.get("score")
        self.assembly.clear()
