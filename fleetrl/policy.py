"""The policy contract shared by every role: ModelSpec and a torch-free actor.

`ModelSpec` is the whole recipe to rebuild the networks on any host (it travels as JSON in
`Weights.layout`). `NumpyActor` runs the actor from its flat weight vectors with numpy alone:
samplers and the evaluator act with it, so they never import torch (3 s of start-up per
process on these hosts) and pay no per-op framework overhead at batch size 1.

Flat actor layout (the order torch's `parameters_to_vector` gives for learner/models.py):
    for each Linear layer: weight [out, in] row-major, then bias [out]
Layers: input (obs ++ goal) -> hidden_sizes (ReLU) -> 2 * act_dim (mean ++ log_std).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

# Weight groups: one flat float32 vector each, versioned together by the aggregator.
GROUPS = ("actor", "critic", "critic_target", "log_alpha", "obs_norm")
GRADIENT_GROUPS = ("actor", "critic", "log_alpha")
ACTOR_GROUPS = ("actor", "obs_norm")  # all a sampler, evaluator or exporter needs
# What a learner takes every version: it keeps its own Polyak copy of the target critics after
# the first full snapshot, so 40% of the weights never travel per version.
LEARNER_GROUPS = ("actor", "critic", "log_alpha", "obs_norm")
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # the range CleanRL and SB3 use for SAC
NORM_CLIP = 5.0  # standardized inputs are clipped to +-5, as in the HER baselines


@dataclass(frozen=True)
class ModelSpec:
    obs_dim: int
    goal_dim: int
    act_dim: int
    hidden_sizes: tuple[int, ...] = (256, 256)

    @property
    def input_dim(self) -> int:
        return self.obs_dim + self.goal_dim

    def actor_layer_dims(self) -> list[tuple[int, int]]:
        """(in, out) of every actor Linear layer, input to output."""
        dims = [self.input_dim, *self.hidden_sizes, 2 * self.act_dim]
        return list(zip(dims[:-1], dims[1:], strict=True))

    def actor_size(self) -> int:
        return sum(i * o + o for i, o in self.actor_layer_dims())

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        data = json.loads(text)
        data["hidden_sizes"] = tuple(data["hidden_sizes"])
        return cls(**data)


class NumpyActor:
    """pi(a | s, g) = tanh(N(mu, sigma)) evaluated with numpy; mirrors SquashedGaussianActor."""

    def __init__(self, spec: ModelSpec, actor_flat: np.ndarray, obs_norm: np.ndarray) -> None:
        if actor_flat.shape != (spec.actor_size(),):
            raise ValueError(f"actor flat vector shape {actor_flat.shape}, expected ({spec.actor_size()},)")
        if obs_norm.shape != (2 * spec.input_dim,):
            raise ValueError(f"obs_norm flat vector shape {obs_norm.shape}, expected ({2 * spec.input_dim},)")
        self.spec = spec
        self.layers: list[tuple[np.ndarray, np.ndarray]] = []
        start = 0
        for fan_in, fan_out in spec.actor_layer_dims():
            w = actor_flat[start : start + fan_in * fan_out].reshape(fan_out, fan_in)
            start += fan_in * fan_out
            b = actor_flat[start : start + fan_out]
            start += fan_out
            self.layers.append((np.ascontiguousarray(w.T, np.float32), np.asarray(b, np.float32)))
        self.mean = np.asarray(obs_norm[: spec.input_dim], np.float32)
        self.std = np.asarray(obs_norm[spec.input_dim :], np.float32)

    def forward(self, obs_goal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pre-tanh mean and log_std for inputs [batch, input_dim]."""
        x = np.clip((obs_goal - self.mean) / self.std, -NORM_CLIP, NORM_CLIP)
        for i, (w, b) in enumerate(self.layers):
            x = x @ w + b
            if i < len(self.layers) - 1:
                x = np.maximum(x, 0.0)
        mean, log_std = np.split(x, 2, axis=-1)
        return mean, np.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)

    def deterministic(self, obs_goal: np.ndarray) -> np.ndarray:
        mean, _ = self.forward(obs_goal)
        return np.tanh(mean)

    def sample(self, obs_goal: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        mean, log_std = self.forward(obs_goal)
        return np.tanh(mean + np.exp(log_std) * rng.standard_normal(mean.shape).astype(np.float32))
