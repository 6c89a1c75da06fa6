"""The policy contract shared by every role: ModelSpec and a torch-free actor.

`ModelSpec` is the whole recipe to rebuild the networks on any host (it travels as JSON in
`Weights.layout`). `NumpyActor` runs the actor from its flat weight vectors with numpy alone:
samplers and the evaluator act with it, so they never import torch (3 s of start-up per
process on these hosts) and pay no per-op framework overhead at batch size 1.

Flat actor layout (the order torch's `parameters_to_vector` gives for nets/models.py):
    dense: for each Linear layer: weight [out, in] row-major, then bias [out]
    moe:   the task embedding [tasks, task_embed_dim]; for each hidden layer: expert weights
           [experts, out, in], expert biases [experts, out], gate weight [experts, gate_in],
           gate bias [experts]; then the output Linear as in dense
Layers: input (obs ++ goal) -> hidden_sizes (ReLU) -> 2 * act_dim (mean ++ log_std). A MoE
hidden layer is `experts` Linear layers mixed by a gate on the normalized input and the task's
embedding (gate_in = input_dim + task_embed_dim), or with router "task" on the embedding alone
(gate_in = task_embed_dim: routing constant within a task, which a frozen-routing export keeps
exactly): softmax over the gate's top_k logits, zero for the rest. Only the routed experts
are computed: with router "task" each task's experts are mixed into one Linear per layer (once
per task and weights), with router "state" each expert multiplies only the rows routed to it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from foundation.config_learning import CRITIC_NORMS, MODEL_KINDS, ROUTERS

if TYPE_CHECKING:
    from foundation.config import RunConfig

# Weight groups: one flat float32 vector each, versioned together by the aggregator.
GROUPS = ("actor", "critic", "critic_target", "log_alpha", "obs_norm")
GRADIENT_GROUPS = ("actor", "critic", "log_alpha")
ACTOR_GROUPS = ("actor", "obs_norm")  # all a sampler, evaluator or exporter needs
# What a learner takes every version: it keeps its own Polyak copy of the target critics after
# the first full snapshot, so 40% of the weights never travel per version.
LEARNER_GROUPS = ("actor", "critic", "log_alpha", "obs_norm")
SWA_GROUP = "actor_swa"  # served, not trained: the actor's weight average (aggregator/swa.py), for the evaluator
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # the range CleanRL and SB3 use for SAC
NORM_CLIP = 5.0  # standardized inputs are clipped to +-5, as in the HER baselines


@dataclass(frozen=True)
class ModelSpec:
    obs_dim: int
    goal_dim: int
    act_dim: int
    hidden_sizes: tuple[int, ...] = (256, 256)
    kind: str = "dense"  # or "moe": every hidden layer a mixture of experts
    experts: int = 8
    top_k: int = 2
    tasks: int = 1  # rows of the task embedding (the run's tasks)
    task_embed_dim: int = 8
    # A multi-task run's inputs standardized with each task's own statistics (rows picked by the
    # input's task one-hot), not one set over all: False in specs written before it existed.
    task_norm: bool = False
    router: str = "state"  # "task": gates see only the task embedding (absent in older specs: "state")
    # A multi-task run's SAC temperature, one per task (MT-SAC's): False in older specs (one shared).
    task_alpha: bool = False
    # The networks read the task one-hot (True, as in older specs); False: zeros in its place after
    # the normalizer, which still picks each task's row by it (model.task_onehot).
    task_onehot: bool = True
    # A MoE with the task router: one output layer per task (model.task_heads); False in older specs.
    task_heads: bool = False
    # Outputs per critic: 1 (a Q value), or learner.tqc.quantiles with algo 'tqc' (1 in older specs).
    critic_quantiles: int = 1
    # algo 'crossq': batch renormalization in both critics, on their input and after every hidden
    # layer (False in older specs). The actor never has it: samplers, evaluator and export are SAC's.
    critic_renorm: bool = False
    # "layer": a LayerNorm after every hidden Linear of both critics, before its ReLU (model.critic_norm;
    # "none" in older specs). The actor never has it.
    critic_norm: str = "none"
    # 'moe': the first `shared_experts` experts of every MoE layer are among every input's top_k
    # whatever the gate says (DeepSeekMoE's shared experts): with the task router, weights every
    # task trains. 0 in older specs.
    shared_experts: int = 0

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"model kind {self.kind!r}: expected one of {MODEL_KINDS}")
        if self.router not in ROUTERS:
            raise ValueError(f"router {self.router!r}: expected one of {ROUTERS}")
        if self.task_heads and (self.kind != "moe" or self.router != "task"):
            raise ValueError("task_heads needs a 'moe' model with the 'task' router")
        if self.critic_renorm and self.kind != "dense":
            raise ValueError("critic_renorm (algo 'crossq') needs a 'dense' model")
        if self.critic_norm not in CRITIC_NORMS:
            raise ValueError(f"critic_norm {self.critic_norm!r}: expected one of {CRITIC_NORMS}")
        if self.critic_norm != "none" and self.critic_renorm:
            raise ValueError("critic_norm must be 'none' with critic_renorm (algo 'crossq')")
        if self.kind == "moe" and not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k ({self.top_k}) must be in 1..experts ({self.experts})")
        if self.shared_experts < 0 or (
            self.shared_experts and (self.kind != "moe" or self.shared_experts >= self.top_k)
        ):
            raise ValueError(f"shared_experts ({self.shared_experts}) must be 0, or in 1..top_k - 1 on a 'moe' model")

    @property
    def input_dim(self) -> int:
        return self.obs_dim + self.goal_dim

    @property
    def norm_rows(self) -> int:
        """Rows of normalizer statistics: one per task with task_norm, else one."""
        return self.tasks if self.task_norm and self.tasks > 1 else 1

    @property
    def alpha_rows(self) -> int:
        """SAC temperatures: one per task with task_alpha, else one shared by every task."""
        return self.tasks if self.task_alpha and self.tasks > 1 else 1

    @property
    def one_hot(self) -> tuple[int, int] | None:
        """Where the task one-hot lies in the input (a multi-task run's obs ends with it)."""
        return (self.obs_dim - self.tasks, self.obs_dim) if self.tasks > 1 else None

    @property
    def hidden_one_hot(self) -> tuple[int, int] | None:
        """The one-hot columns the networks see as zeros (model.task_onehot false), or None."""
        return None if self.task_onehot else self.one_hot

    def norm_row(self, task: int) -> int:
        """The row of normalizer statistics that standardizes task `task`'s inputs."""
        return task if self.norm_rows > 1 else 0

    def split_norm(self, obs_norm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A flat obs_norm as (mean, std), each [norm_rows, input_dim]; ValueError on a wrong size."""
        rows, dim = self.norm_rows, self.input_dim
        if np.shape(obs_norm) != (2 * rows * dim,):
            raise ValueError(f"obs_norm flat vector shape {np.shape(obs_norm)}, expected ({2 * rows * dim},)")
        flat = np.asarray(obs_norm, np.float32)
        return flat[: rows * dim].reshape(rows, dim), flat[rows * dim :].reshape(rows, dim)

    @property
    def gate_dim(self) -> int:
        return self.task_embed_dim if self.router == "task" else self.input_dim + self.task_embed_dim

    def actor_layer_dims(self) -> list[tuple[int, int]]:
        """(in, out) of every actor layer, input to output (a MoE layer counted once)."""
        dims = [self.input_dim, *self.hidden_sizes, 2 * self.act_dim]
        return list(zip(dims[:-1], dims[1:], strict=True))

    def actor_size(self) -> int:
        layers = self.actor_layer_dims()
        if self.kind == "dense":
            return sum(i * o + o for i, o in layers)
        hidden = sum(self.experts * (i * o + o) + self.experts * (self.gate_dim + 1) for i, o in layers[:-1])
        i, o = layers[-1]
        return self.tasks * self.task_embed_dim + hidden + self.heads * (i * o + o)

    @property
    def heads(self) -> int:
        """Output layers of every network: one per task with task_heads, else one."""
        return self.tasks if self.task_heads else 1

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        """The spec a `to_json` wrote (a spec from before the MoE fields is a dense one)."""
        data = json.loads(text)
        data["hidden_sizes"] = tuple(data["hidden_sizes"])
        return cls(**data)


class TaskDims(Protocol):
    """What model_spec reads of a task (sim.registry.TaskSpec) or of a run's tasks (sim.tasks.TaskSet)."""

    @property
    def obs_dim(self) -> int: ...
    @property
    def goal_dim(self) -> int: ...
    @property
    def act_dim(self) -> int: ...


def model_spec(config: RunConfig, task: TaskDims) -> ModelSpec:
    """The networks a run trains for `task` (or a multi-task run's TaskSet, its padded width
    and one task embedding row per task): shapes, learner.hidden_sizes and model.* (a MoE's
    hidden layers model.expert_width wide, one per learner.hidden_sizes entry), with the critics
    learner.algo's section asks for."""
    m, critics = config.model, config.learner.algorithm().critics()
    hidden = tuple(config.learner.hidden_sizes)
    if m.kind == "moe" and m.expert_width:
        hidden = (m.expert_width,) * len(hidden)
    return ModelSpec(
        task.obs_dim,
        task.goal_dim,
        task.act_dim,
        hidden,
        kind=m.kind,
        experts=m.experts,
        top_k=m.top_k,
        tasks=len(getattr(task, "tasks", ())) or 1,
        task_embed_dim=m.task_embed_dim,
        task_norm=m.task_norm,
        router=m.router,
        task_alpha=m.task_alpha,
        task_onehot=m.task_onehot,
        task_heads=m.task_heads,
        critic_quantiles=critics.outputs,
        critic_renorm=critics.renorm,
        critic_norm=m.critic_norm,
        shared_experts=m.shared_experts if m.kind == "moe" else 0,
    )


def top_k_gates(logits: np.ndarray, k: int, shared: int = 0) -> np.ndarray:
    """Softmax over each row's k largest logits, 0 elsewhere (ties at the k-th may add more).
    With `shared`, experts 0..shared-1 are always among the k, and the other k - shared are the
    largest logits of the rest (nets/moe.py's route_top_k)."""
    chosen = np.ones(logits.shape, bool)  # experts 0..shared-1 always; the rest by rank
    rest = logits[..., shared:]
    kth = -np.partition(-rest, k - shared - 1, axis=-1)[..., k - shared - 1 : k - shared]
    chosen[..., shared:] = rest >= kth
    masked = np.where(chosen, logits, -np.inf)
    e = np.exp(masked - masked.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _routed_rows(x: np.ndarray, gates: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum_e gates[:, e] * (x @ w[e] + b[e]), each expert on only the rows routed to it."""
    out = np.zeros((len(x), w.shape[2]), np.float32)
    for e in np.flatnonzero(gates.any(axis=0)):
        rows = np.flatnonzero(gates[:, e])
        out[rows] += gates[rows, e, None] * (x[rows] @ w[e] + b[e])
    return out


class NumpyActor:
    """pi(a | s, g) = tanh(N(mu, sigma)) evaluated with numpy; mirrors SquashedGaussianActor."""

    def __init__(self, spec: ModelSpec, actor_flat: np.ndarray, obs_norm: np.ndarray) -> None:
        if actor_flat.shape != (spec.actor_size(),):
            raise ValueError(f"actor flat vector shape {actor_flat.shape}, expected ({spec.actor_size()},)")
        self.mean, self.std = spec.split_norm(obs_norm)  # [rows, input_dim]: a row per task with task_norm
        self.spec = spec
        self._mixed: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}  # router "task": per task
        self.heads: tuple[np.ndarray, np.ndarray] | None = None  # task_heads: (W [tasks, in, out], B)
        flat = np.asarray(actor_flat, np.float32)
        start = 0

        def take(*shape: int) -> np.ndarray:
            nonlocal start
            size = int(np.prod(shape))
            start += size
            return flat[start - size : start].reshape(shape)

        moe = spec.kind == "moe"
        self.embed = take(spec.tasks, spec.task_embed_dim) if moe else None
        self.layers: list[tuple[np.ndarray, np.ndarray]] = []  # dense: (w [in, out], b)
        self.moe: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # (W [E,in,out], B, Wg.T, bg)
        dims = spec.actor_layer_dims()
        for n, (fan_in, fan_out) in enumerate(dims):
            if moe and n < len(dims) - 1:
                w, b = take(spec.experts, fan_out, fan_in), take(spec.experts, fan_out)
                gw, gb = take(spec.experts, spec.gate_dim), take(spec.experts)
                self.moe.append((np.ascontiguousarray(w.transpose(0, 2, 1)), b, np.ascontiguousarray(gw.T), gb))
            elif n == len(dims) - 1 and spec.heads > 1:  # one output layer per task: [tasks, in, out]
                w, b = take(spec.heads, fan_out, fan_in), take(spec.heads, fan_out)
                self.heads = (np.ascontiguousarray(w.transpose(0, 2, 1)), b)
            else:
                w, b = take(fan_out, fan_in), take(fan_out)
                self.layers.append((np.ascontiguousarray(w.T), b))

    def forward(self, obs_goal: np.ndarray, task: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Pre-tanh mean and log_std for inputs [batch, input_dim] of task `task`."""
        row = self.spec.norm_row(task)
        x = np.clip((obs_goal - self.mean[row]) / self.std[row], -NORM_CLIP, NORM_CLIP)
        if self.spec.hidden_one_hot is not None:
            x[:, self.spec.hidden_one_hot[0] : self.spec.hidden_one_hot[1]] = 0.0
        if self.embed is not None and self.spec.router == "task":
            for w, b in self._task_layers(task):
                x = np.maximum(x @ w + b, 0.0)
        elif self.embed is not None:
            gate_in = np.concatenate([x, np.broadcast_to(self.embed[task], (len(x), self.spec.task_embed_dim))], -1)
            for w, b, gw, gb in self.moe:
                gates = top_k_gates(gate_in @ gw + gb, self.spec.top_k, self.spec.shared_experts)
                x = np.maximum(_routed_rows(x, gates, w, b), 0.0)
        for i, (w, b) in enumerate(self.layers):
            x = x @ w + b
            if i < len(self.layers) - 1:
                x = np.maximum(x, 0.0)
        if self.heads is not None:
            x = x @ self.heads[0][task] + self.heads[1][task]
        mean, log_std = np.split(x, 2, axis=-1)
        return mean, np.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)

    def _task_layers(self, task: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Router "task": each hidden layer's top_k experts of `task` mixed into one Linear, once
        per task (sum_j g_j (x W_j + b_j) = x sum_j g_j W_j + sum_j g_j b_j): the actor then
        costs a dense MLP of the experts' width per step."""
        if task not in self._mixed:
            assert self.embed is not None
            mixed = []
            for w, b, gw, gb in self.moe:
                logits = self.embed[task : task + 1] @ gw + gb
                gates = top_k_gates(logits, self.spec.top_k, self.spec.shared_experts)[0]
                used = np.flatnonzero(gates)
                mixed.append((np.einsum("e,eio->io", gates[used], w[used]), gates[used] @ b[used]))
            self._mixed[task] = mixed
        return self._mixed[task]

    def deterministic(self, obs_goal: np.ndarray, task: int = 0) -> np.ndarray:
        """tanh(mean): the policy's action without exploration."""
        mean, _ = self.forward(obs_goal, task)
        return np.tanh(mean)

    def sample(self, obs_goal: np.ndarray, rng: np.random.Generator, task: int = 0) -> np.ndarray:
        mean, log_std = self.forward(obs_goal, task)
        return np.tanh(mean + np.exp(log_std) * rng.standard_normal(mean.shape).astype(np.float32))
