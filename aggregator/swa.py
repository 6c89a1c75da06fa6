"""Weight averaging of the actor that skips degraded versions: layered, trajectory-aware SWA.

Plain SWA (Izmailov et al. 2018) averages the weights of the versions along a run. In RL the
policy's quality moves up and down along the run, so plain SWA averages in versions that
performed badly. Layered trajectory-aware SWA (`mode="layered"`):

- a version joins the average only when the evaluator scored it at least as well as the
  current average (the average is scored beside the live policy);
- the routers (each MoE layer's gate and the task embedding) average over a short window of
  admitted versions (default 3): routing must follow the experts it routes to;
- each expert averages over a long window (default 15), every admitted version weighted by
  how often that expert was active in it, so a version where the expert was idle adds little;
- everything else (a dense network's layers, the output layer) averages over the long window.

`mode="plain"` admits every scored version, uniformly over the long window, for comparison.

    swa = LayeredSWA(spec)
    swa.offer(version, actor_flat, score=0.4, shares=[layer0_shares, layer1_shares])
    swa.average()            # flat actor, or None before the first admission
    swa.scored(0.45)         # the evaluator's score of the current average
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from foundation.config_learning import SWA_MODES
from foundation.policy import ModelSpec


@dataclass(frozen=True)
class Admitted:
    version: int
    actor: np.ndarray
    shares: tuple[np.ndarray, ...]  # per MoE layer: each expert's share of the routing slots


def actor_parts(spec: ModelSpec) -> tuple[np.ndarray, list[list[np.ndarray]]]:
    """Index arrays into the flat actor (foundation/policy.py's layout): the router part, and per
    MoE layer, per expert, that expert's weights and bias. What is in neither is shared."""
    router: list[np.ndarray] = []
    experts: list[list[np.ndarray]] = []
    if spec.kind != "moe":
        return np.empty(0, np.int64), experts
    start = 0

    def take(size: int) -> np.ndarray:
        nonlocal start
        start += size
        return np.arange(start - size, start)

    router.append(take(spec.tasks * spec.task_embed_dim))
    for fan_in, fan_out in spec.actor_layer_dims()[:-1]:
        weights = take(spec.experts * fan_out * fan_in).reshape(spec.experts, -1)
        biases = take(spec.experts * fan_out).reshape(spec.experts, -1)
        experts.append([np.concatenate([w, b]) for w, b in zip(weights, biases, strict=True)])
        router.append(take(spec.experts * spec.gate_dim + spec.experts))
    return np.concatenate(router), experts


class LayeredSWA:
    def __init__(self, spec: ModelSpec, mode: str = "layered", router_window: int = 3, expert_window: int = 15) -> None:
        if mode not in SWA_MODES or mode == "off":
            raise ValueError(f"swa mode {mode!r}: expected 'plain' or 'layered'")
        if not 1 <= router_window <= expert_window:
            raise ValueError(f"windows: need 1 <= router_window ({router_window}) <= expert_window ({expert_window})")
        self.spec, self.mode = spec, mode
        self.router_window = router_window if mode == "layered" else expert_window
        self.window: deque[Admitted] = deque(maxlen=expert_window)
        self.router, self.experts = actor_parts(spec)
        self.score: float | None = None  # the evaluator's newest score of the current average
        self.offered = self.admitted = 0
        self._average: np.ndarray | None = None

    def offer(self, version: int, actor: np.ndarray, score: float, shares: list[np.ndarray] | None = None) -> bool:
        """A scored version; admitted (True) when plain, or when it scored at least as well as
        the average. `shares`: per MoE layer, each expert's activation share at this version."""
        actor = np.asarray(actor, np.float32)
        if actor.shape != (self.spec.actor_size(),):
            raise ValueError(f"actor flat vector shape {actor.shape}, expected ({self.spec.actor_size()},)")
        self.offered += 1
        if self.mode == "layered" and self.score is not None and score < self.score:
            return False
        experts = self.spec.experts if self.spec.kind == "moe" else 0
        layers = len(self.experts)
        if shares is None or len(shares) != layers:
            shares = [np.full(experts, 1.0 / max(experts, 1))] * layers
        self.window.append(Admitted(version, actor.copy(), tuple(np.asarray(s, np.float64) for s in shares)))
        self.admitted += 1
        self._average = None
        if self.score is None:
            self.score = score  # the average is this version until the evaluator scores it
        return True

    def scored(self, score: float) -> None:
        self.score = score

    def average(self) -> np.ndarray | None:
        if not self.window:
            return None
        if self._average is None:
            self._average = self._compute()
        return self._average

    @property
    def versions(self) -> list[int]:
        return [a.version for a in self.window]

    def _compute(self) -> np.ndarray:
        stack = np.stack([a.actor for a in self.window]).astype(np.float64)
        out = stack.mean(0)  # shared parameters: the long window, uniformly
        if len(self.router):
            out[self.router] = stack[-self.router_window :, self.router].mean(0)
        if self.mode == "layered":
            for layer, experts in enumerate(self.experts):
                share = np.stack([a.shares[layer] for a in self.window])  # [versions, experts]
                for e, idx in enumerate(experts):
                    w = share[:, e]
                    w = w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))
                    out[idx] = w @ stack[:, idx]
        return out.astype(np.float32)

    def state(self) -> dict:
        average = self.average()
        return {
            "mode": self.mode,
            "actor": None if average is None else average.copy(),
            "score": self.score,
            "versions": self.versions,
            "offered": self.offered,
            "admitted": self.admitted,
        }
