"""Config of the learning loop: the learners, their networks, and the aggregator that applies
their gradients. `foundation.config.RunConfig` composes these sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from foundation.config_algos import ALGOS, AlgorithmConfig, CrossQConfig, SACConfig, TQCConfig
from foundation.config_base import Check, ConfigError, config_field, one_of
from foundation.wire import WIRE_DTYPES

MODEL_KINDS = ("dense", "moe")
ROUTERS = ("state", "task")  # what a MoE gate sees: normalized state ++ task embedding, or the embedding
CRITIC_NORMS = ("none", "layer")  # model.critic_norm: "layer" puts a LayerNorm after every hidden Linear

REPLAY_SAMPLING = ("uniform", "recency", "version")
AUTOCAST = ("off", "bf16", "auto")  # learner.autocast
TASK_SAMPLING = ("even", "success", "focus")  # learner.task_sampling: foundation/task_schedule.py
SCORED_SAMPLING = ("success", "focus")  # the modes that follow the evaluator's curve scores
SWA_MODES = ("off", "plain", "layered")  # aggregator.swa: aggregator/swa.py
DEVICES = ("auto", "cpu", "cuda")  # learner.device


@dataclass(frozen=True)
class LearnerConfig:
    num_learners: int = config_field(1, "learner processes the local launcher starts")
    batch_size: int = config_field(256, "transitions per gradient")
    hidden_sizes: tuple[int, ...] = config_field((256, 256), "hidden layer widths of actor and critics")
    gamma: float = config_field(0.95, "discount; 0.95 with 50-step Fetch episodes as in the HER paper")
    min_replay_transitions: int = config_field(1000, "learner waits until the buffer holds this many")
    max_grad_staleness: int = config_field(1, "learner waits for fresher weights past this many versions behind")
    algo: str = config_field("sac", "the algorithm: one of sac, tqc, crossq; its settings are learner.<algo>")
    sac: SACConfig = field(default_factory=SACConfig)
    tqc: TQCConfig = field(default_factory=TQCConfig)
    crossq: CrossQConfig = field(default_factory=CrossQConfig)
    n_step: int = config_field(
        1,
        "n-step returns: rows carry n discounted rewards and the critics bootstrap with gamma^n",
    )
    demo_bc_coef: float = config_field(
        1.0,
        "weight of the Q-filtered behaviour cloning on demonstration rows; 0 = plain replay rows",
    )
    target_entropy: float | None = config_field(
        None, "the temperature's target entropy (sac, tqc, crossq); None = -action_dim"
    )
    torch_threads: int = config_field(1, "torch intra-op threads in the learner")
    own_cpu: bool = config_field(
        False,
        "fleetrl train: each learner on a CPU of its own, every other role and Redis on the rest",
    )
    device: str = config_field("auto", "where the learner computes: 'cpu', 'cuda', or 'auto' (cuda when available)")
    autocast: str = config_field(
        "off",
        "'off', 'bf16' (losses in bfloat16; weights and Adam float32), 'auto' (bf16 where the CPU has it)",
    )
    compile: bool = config_field(
        False,
        "dense models: the losses, forward and backward, under torch.compile (inductor)",
    )
    mix_once: bool = config_field(
        True,
        "task-routed MoE: mix each layer's experts once per update and reuse the mix in every pass",
    )
    fused_critics: bool = config_field(
        True,
        "task-routed MoE: both twin critics in one pass, each layer's two matmuls as one",
    )
    prefetch: bool = config_field(
        False,
        "sample the next batch in a background thread while the current gradient is computed",
    )
    shared_memory: bool = config_field(
        True,
        "on the aggregator's host, weights and gradients through /dev/shm instead of gRPC",
    )
    buffer_refresh_sec: float = config_field(0.05, "how often the learner looks for new transitions in Redis")
    replay_sampling: str = config_field(
        "uniform",
        "how batches are drawn: 'uniform', 'recency' (half-life weighting) or 'version' (max lag)",
    )
    recency_half_life: int = config_field(200_000, "'recency' sampling: transitions of age that halve a row's weight")
    task_sampling: str = config_field(
        "even",
        "a multi-task run's share of each task in a batch: 'even', 'success' or 'focus'",
    )
    task_min_share: float = config_field(
        0.1, "'success' and 'focus' task sampling: the least share of a batch (and of env steps) any task keeps"
    )
    max_policy_lag: int = config_field(20_000, "'version' sampling: versions a row's policy may lag the learner's")
    gradient_wire_dtype: str = config_field(
        "float32",
        "how gradients travel to the aggregator: 'float32' or 'bfloat16' (half the bytes)",
    )

    def checks(self) -> list[Check]:
        """(ok, field, limit) of every check on this section's fields; RunConfig.validate runs them."""
        return [
            (self.num_learners >= 1, "num_learners", ">= 1: no learner, no updates"),
            (self.batch_size >= 1, "batch_size", ">= 1"),
            (self.min_replay_transitions >= self.batch_size, "min_replay_transitions", ">= learner.batch_size"),
            (self.max_grad_staleness >= 0, "max_grad_staleness", ">= 0"),
            (self.device in DEVICES, "device", f"one of {one_of(DEVICES)}"),
            (
                self.gradient_wire_dtype in WIRE_DTYPES,
                "gradient_wire_dtype",
                f"one of {one_of(WIRE_DTYPES)} (foundation.wire.WIRE_DTYPES)",
            ),
            (
                self.replay_sampling in REPLAY_SAMPLING,
                "replay_sampling",
                "one of " + ", ".join(repr(name) for name in REPLAY_SAMPLING),
            ),
            (self.recency_half_life >= 1, "recency_half_life", ">= 1"),
            (self.task_sampling in TASK_SAMPLING, "task_sampling", f"one of {one_of(TASK_SAMPLING)}"),
            (self.autocast in AUTOCAST, "autocast", f"one of {one_of(AUTOCAST)}"),
            (0.0 <= self.task_min_share <= 1.0, "task_min_share", "in [0, 1]"),
            (self.max_policy_lag >= 0, "max_policy_lag", ">= 0"),
            (0.0 < self.gamma < 1.0, "gamma", "in (0, 1)"),
            (self.demo_bc_coef >= 0, "demo_bc_coef", ">= 0 (0 = demonstrations are plain replay rows)"),
            (1 <= self.n_step <= 10, "n_step", "in 1..10 (Fetch episodes are 50 steps)"),
            (self.algo in ALGOS, "algo", "one of " + ", ".join(ALGOS)),
            *self._algorithm_checks(),
        ]

    def algorithm(self) -> AlgorithmConfig:
        """The section of the algorithm learner.algo names (ConfigError for a name not in ALGOS)."""
        if self.algo not in ALGOS:
            raise ConfigError(f"learner.algo ({self.algo!r}) must be one of {', '.join(ALGOS)}", field="learner.algo")
        section: AlgorithmConfig = getattr(self, self.algo)
        return section

    def _algorithm_checks(self) -> list[Check]:
        """Every algorithm section's checks (named learner.<algo>.<field>), and what the named
        algorithm's critics rule out."""
        checks = [(ok, f"{name}.{f}", limit) for name in ALGOS for ok, f, limit in getattr(self, name).checks()]
        if self.algo in ALGOS and self.algorithm().critics().renorm:
            # the batch-renorm layers update their running statistics in place, which the compiled losses do not
            checks.append((not self.compile, "compile", f"false with algo {self.algo!r} (batch-renorm critics)"))
        return checks


@dataclass(frozen=True)
class ModelConfig:
    """The networks' architecture beyond their widths (learner.hidden_sizes)."""

    kind: str = config_field(
        "dense", "'dense' MLPs, or 'moe': every hidden layer a mixture of experts gated on state and task"
    )
    experts: int = config_field(32, "'moe': experts per hidden layer (training computes only the routed ones)")
    top_k: int = config_field(2, "'moe': experts each input is routed to")
    shared_experts: int = config_field(
        0,
        "'moe': of an input's top_k experts, how many are always the layer's first ones; 0 = none",
    )
    expert_width: int = config_field(
        128,
        "'moe': width of every expert; 0 = learner.hidden_sizes",
    )
    task_embed_dim: int = config_field(8, "'moe': width of the learned task embedding the gates see")
    router: str = config_field(
        "task",
        "'moe': what the gates see: 'state' (state and task embedding) or 'task' (the embedding alone)",
    )
    task_norm: bool = config_field(
        True,
        "multi-task runs: standardize each task's inputs with its own statistics",
    )
    task_onehot: bool = config_field(
        True,
        "multi-task runs: the networks read the task one-hot (false: only normalizer and router do)",
    )
    task_alpha: bool = config_field(
        False,
        "multi-task runs: one SAC temperature per task, each held to the entropy target on its rows",
    )
    balance_coef: float = config_field(0.01, "'moe': weight of the routers' load-balancing loss")
    task_heads: bool = config_field(
        False,
        "'moe' with router 'task': one output layer per task in the actor and both critics",
    )
    gate_grad: bool = config_field(
        True,
        "'moe' with router 'task': the task losses train the gates (false: only the balancing loss)",
    )
    router_decay: float = config_field(
        1.0,
        "'moe': lambda of router decay: the balancing loss times exp(-lambda * ||policy gradient||)",
    )
    critic_norm: str = config_field(
        "none",
        "'layer': a LayerNorm after every hidden layer of both critics (RLPD's); 'none': plain",
    )

    def checks(self) -> list[Check]:
        """(ok, field, limit) of every check on this section's fields; RunConfig.validate runs them."""
        return [
            (self.kind in MODEL_KINDS, "kind", f"one of {one_of(MODEL_KINDS)}"),
            (self.experts >= 1, "experts", ">= 1"),
            (self.router in ROUTERS, "router", f"one of {one_of(ROUTERS)}"),
            (1 <= self.top_k <= self.experts, "top_k", "in 1..model.experts"),
            (0 <= self.shared_experts < self.top_k, "shared_experts", "in 0..model.top_k - 1"),
            (self.task_embed_dim >= 1, "task_embed_dim", ">= 1"),
            (self.expert_width >= 0, "expert_width", ">= 0 (0 = learner.hidden_sizes)"),
            (
                not self.task_heads or (self.kind == "moe" and self.router == "task"),
                "task_heads",
                "false unless model.kind is 'moe' with model.router 'task'",
            ),
            (
                self.gate_grad or (self.kind == "moe" and self.router == "task"),
                "gate_grad",
                "true unless model.kind is 'moe' with model.router 'task'",
            ),
            (self.critic_norm in CRITIC_NORMS, "critic_norm", f"one of {one_of(CRITIC_NORMS)}"),
        ]


@dataclass(frozen=True)
class AggregatorConfig:
    lr: float = config_field(1e-3, "Adam learning rate of actor, critics and temperature")
    lr_final: float = config_field(
        0.0,
        "learning rate reached linearly between lr_decay_start and lr_decay_end; 0 = lr throughout",
    )
    lr_decay_start: int = config_field(0, "the version where the fall to lr_final begins (with lr_final > 0)")
    lr_decay_end: int = config_field(0, "the version where the learning rate reaches lr_final (with lr_final > 0)")
    tau: float = config_field(0.05, "target critic Polyak factor per version")
    adam_beta1: float = config_field(
        0.9, "Adam's first-moment decay (CrossQ's recipe: 0.5; torch's default 0.9); the second stays 0.999"
    )
    init_log_alpha: float = config_field(-2.0, "initial log of the SAC temperature")
    grads_per_step: int = config_field(
        0, "K of K-of-M: a step closes once this many learners have a gradient pending; 0 = every learner (M)"
    )
    step_deadline_ms: float = config_field(
        100.0,
        "... or once its first gradient is this old, with what has arrived; 0 = wait for K",
    )
    staleness_power: float = config_field(
        1.0,
        "p: a gradient's weight in a step is batch_size / (1 + staleness)^p; 0 = by batch size",
    )
    max_grad_norm: float = config_field(
        100.0,
        "clip the global L2 norm of a step's mean gradient to this; 0 = no clipping",
    )
    max_input_abs: float = config_field(
        1e6, "normalizer statistics implying an input beyond this magnitude are rejected (a learner's bad batch)"
    )
    expert_adam: str = config_field(
        "lazy",
        "MoE: 'lazy' steps Adam only on experts a version touched, 'dense' on every weight",
    )
    swa: str = config_field(
        "off",
        "actor weight averaging: 'layered' (scored versions only), 'plain' (every scored one) or 'off'",
    )
    swa_router_window: int = config_field(3, "'layered' SWA: admitted versions the routers average over")
    swa_expert_window: int = config_field(15, "SWA: admitted versions experts (and a dense actor) average over")
    checkpoint_every_versions: int = config_field(500, "write a checkpoint every N versions")
    keep_checkpoints: int = config_field(3, "checkpoints kept on disk (the newest)")
    seed: int = config_field(0, "seed of the initial weights")

    def lr_at(self, version: int) -> float:
        """The learning rate of the step that makes version + 1: lr until lr_decay_start, then a
        straight line to lr_final at lr_decay_end, lr_final after (lr throughout when lr_final is 0).
        A function of the version alone, so a restored aggregator resumes on the same line."""
        if self.lr_final <= 0 or version <= self.lr_decay_start:
            return self.lr
        if version >= self.lr_decay_end:
            return self.lr_final
        share = (version - self.lr_decay_start) / (self.lr_decay_end - self.lr_decay_start)
        return self.lr + share * (self.lr_final - self.lr)

    def checks(self) -> list[Check]:
        """(ok, field, limit) of every check on this section's fields; RunConfig.validate runs them."""
        return [
            (0.0 < self.tau <= 1.0, "tau", "in (0, 1]"),
            (0.0 <= self.adam_beta1 < 1.0, "adam_beta1", "in [0, 1)"),
            (self.expert_adam in ("lazy", "dense"), "expert_adam", "one of 'lazy', 'dense'"),
            (self.lr > 0, "lr", "> 0"),
            (self.lr_final >= 0, "lr_final", ">= 0 (0 = lr throughout)"),
            (
                self.lr_final == 0 or 0 <= self.lr_decay_start < self.lr_decay_end,
                "lr_decay_end",
                "> aggregator.lr_decay_start >= 0 when aggregator.lr_final > 0",
            ),
            (self.max_grad_norm >= 0, "max_grad_norm", ">= 0 (0 = no clipping)"),
            (self.max_input_abs > 0, "max_input_abs", "> 0"),
            (self.checkpoint_every_versions >= 1, "checkpoint_every_versions", ">= 1"),
            (
                self.keep_checkpoints >= 1,
                "keep_checkpoints",
                ">= 1: a restarted aggregator resumes from the newest checkpoint",
            ),
            (
                self.grads_per_step >= 0,
                "grads_per_step",
                ">= 0 (0 = number of learners): the aggregator could not start",
            ),
            (self.step_deadline_ms >= 0, "step_deadline_ms", ">= 0 (0 = no deadline)"),
            (self.staleness_power >= 0, "staleness_power", ">= 0 (0 = no discount)"),
            (self.swa in SWA_MODES, "swa", f"{one_of(SWA_MODES[:-1])} or {SWA_MODES[-1]!r}"),
            (
                1 <= self.swa_router_window <= self.swa_expert_window,
                "swa_router_window",
                "in 1..aggregator.swa_expert_window",
            ),
        ]
