"""Config of the learning loop: the learners, their networks, and the aggregator that applies
their gradients. `foundation.config.RunConfig` composes these sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from foundation.config_algos import ALGOS, AlgorithmConfig, CrossQConfig, SACConfig, TQCConfig
from foundation.config_base import Check, ConfigError, config_field, one_of
from foundation.policy import MODEL_KINDS, ROUTERS
from foundation.wire import WIRE_DTYPES

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
        "n-step returns: samplers store each row with the discounted sum of the next n rewards under its "
        "(relabeled) goal and the observation n steps on, and the critics bootstrap with gamma^n "
        "(sampler/her.py); rows whose n steps would pass a truncated episode's end are not stored",
    )
    target_entropy: float | None = config_field(
        None, "the temperature's target entropy (sac, tqc, crossq); None = -action_dim"
    )
    torch_threads: int = config_field(
        1, "torch intra-op threads in the learner (2 made 0.75x the updates/s of 1 in a 2-core Push fleet: fleet_arms)"
    )
    own_cpu: bool = config_field(
        False,
        "local fleet (fleetrl train) with more CPUs than learners: each learner runs on a CPU of its "
        "own, every other role and Redis on the rest (fleet/launch/local_fleet.py learner_cpus)",
    )
    device: str = config_field("auto", "where the learner computes: 'cpu', 'cuda', or 'auto' (cuda when available)")
    autocast: str = config_field(
        "off",
        "'off', 'bf16': losses and their backward under torch.autocast bfloat16; weights, gradients and "
        "Adam stay float32. 'auto': bf16 on a CPU learner whose CPU has BF16 instructions (avx512_bf16, "
        "amx_bf16 or Arm bf16; without them bfloat16 is emulated and slower), else off",
    )
    compile: bool = config_field(
        False,
        "dense models: the losses, forward and backward, under torch.compile (inductor; "
        "compiled at the learner's first update); off: 1.12x the learner benchmark's updates, none in a FetchPush "
        "fleet (README)",
    )
    mix_once: bool = config_field(
        True,
        "a task-routed MoE mixes each layer's experts once per update and every pass of the losses reuses it "
        "(nets.models.one_mix_per_update: the same gradients); false: each pass mixes anew, as before",
    )
    fused_critics: bool = config_field(
        True,
        "a task-routed MoE's twin critics in one pass, each layer's two matmuls one (nets/twin.py: 1.06x "
        "its gradients per CPU-second; a dense pair measured slower fused and always runs apart); false: apart",
    )
    prefetch: bool = config_field(
        False,
        "sample the next batch in a background thread while the current gradient is computed (off: on "
        "2 CPU cores it cost the gradient more than it saved, benchmarks/learner_throughput.py)",
    )
    shared_memory: bool = config_field(
        True,
        "on the aggregator's host, weights and gradients go through /dev/shm segments, gRPC carrying "
        "only which version or push (foundation/shm.py); other hosts, or false: all bytes over gRPC",
    )
    buffer_refresh_sec: float = config_field(0.05, "how often the learner looks for new transitions in Redis")
    replay_sampling: str = config_field(
        "uniform",
        "how batches are drawn from the buffer: 'uniform'; 'recency' (a row's weight halves every "
        "recency_half_life transitions of age); 'version' (only rows collected by a policy at most "
        "max_policy_lag versions behind the learner's)",
    )
    recency_half_life: int = config_field(200_000, "'recency' sampling: transitions of age that halve a row's weight")
    task_sampling: str = config_field(
        "even",
        "a multi-task run's share of each task in a batch: 'even', or 'success' (by the evaluator's newest "
        "curve score: share = task_min_share + the rest in proportion to 1 - success, so a solved task "
        "keeps task_min_share and the unsolved ones get the learner), or 'focus' (task_min_share each, the "
        "rest to the first task in --tasks order still below target_success: tasks learned one after "
        "another); samplers' env steps follow the same shares (foundation/task_schedule.py)",
    )
    task_min_share: float = config_field(
        0.1, "'success' and 'focus' task sampling: the least share of a batch (and of env steps) any task keeps"
    )
    max_policy_lag: int = config_field(20_000, "'version' sampling: versions a row's policy may lag the learner's")
    gradient_wire_dtype: str = config_field(
        "float32",
        "how gradients travel to the aggregator: 'float32', or 'bfloat16' (rounded to 8 significant bits, "
        "half the bytes, as PyTorch DDP's bf16_compress_hook; the aggregator's weights and Adam stay float32): "
        "0.87x the aggregator's CPU per version, but FetchPush took more updates to 90% on 2 of 3 seeds",
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
    experts: int = config_field(
        32, "'moe': experts per hidden layer (training computes only the routed ones: cost grows with top_k, not this)"
    )
    top_k: int = config_field(2, "'moe': experts each input is routed to")
    shared_experts: int = config_field(
        0,
        "'moe': of an input's top_k experts, how many are always the layer's first ones whatever the gate says "
        "(DeepSeekMoE's shared experts); the other top_k - shared_experts are routed. With the task router, weights "
        "every task trains (the routed experts of a 4-task run share none): what one task learns can reach "
        "another, as in a dense network, at no extra cost per row (a task's k experts are mixed into one Linear). "
        "0: none. A multi-task run of a task-routed MoE that sets neither this nor model.top_k takes top_k 3 "
        "with 1 shared (fleet/cli/presets.py TASK_ROUTED_SHARED; 4 tasks, 3 seeds, docs/presets.md 'Multi-task')",
    )
    expert_width: int = config_field(
        128,
        "'moe': width of every expert (each MoE hidden layer; as many layers as learner.hidden_sizes); "
        "0 = learner.hidden_sizes. A row's k experts, mixed by its gates before the ReLU, are one Linear of "
        "this width: with 128, each task of the task router has a 128-wide network (the dense default: 256); "
        "2 x 128 = 256 is the FLOPs of the state router's k experts, not their width",
    )
    task_embed_dim: int = config_field(8, "'moe': width of the learned task embedding the gates see")
    router: str = config_field(
        "task",
        "'moe': what the gates see: 'state' (normalized state ++ task embedding) or 'task' (the embedding "
        "alone: each task keeps one routing, so `fleetrl export`'s frozen table is exact)",
    )
    task_norm: bool = config_field(
        True,
        "multi-task runs: standardize each task's inputs with its own statistics (one shared set mixes "
        "tasks whose coordinates differ, e.g. Fetch and Meta-World, and squashes each task's range)",
    )
    task_onehot: bool = config_field(
        True,
        "multi-task runs: the networks read the task one-hot at the end of the observation (MT-SAC's task "
        "input). false: only the per-task normalizer and a MoE's task router read it; the networks see zeros "
        "there. A one-hot input constant within a task is a second first-layer bias per task, which Adam moves "
        "as fast as the bias itself: FetchPush alone in a multi-task run learned with it off and did not with "
        "it on (docs/architecture.md). Off, a dense network tells tasks apart only by their observations",
    )
    task_alpha: bool = config_field(
        False,
        "multi-task runs: one SAC temperature per task (MT-SAC's), each task's entropy held to the target "
        "on its own rows; one shared temperature lets a solved task's near-deterministic policy keep an "
        "unsolved task's policy noisier than the target",
    )
    balance_coef: float = config_field(0.01, "'moe': weight of the routers' load-balancing loss")
    task_heads: bool = config_field(
        False,
        "'moe' with router 'task': one output layer per task (multi-head MT-SAC) in the actor and both critics, "
        "so tasks whose routers chose disjoint experts share no weight at all; one shared output layer "
        "carries a solved task's habits and value scale into the others (docs/architecture.md)",
    )
    gate_grad: bool = config_field(
        True,
        "'moe' with router 'task': the task losses train the gates (which k experts each task uses, and their "
        "mix). false: only the balancing loss moves them, so a task keeps the experts and mix it starts with "
        "unless it collides with another task's. Trained by the losses, the gates drift toward one expert as the "
        "critics' values grow, which turns each layer of the task's network toward another random matrix "
        "(docs/architecture.md, 'Routing that settles')",
    )
    router_decay: float = config_field(
        1.0,
        "'moe': lambda of router decay: the balancing loss is scaled by exp(-lambda * ||policy gradient||), "
        "so routing may specialize while the gradient is large",
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
        ]


@dataclass(frozen=True)
class AggregatorConfig:
    lr: float = config_field(1e-3, "Adam learning rate of actor, critics and temperature")
    lr_final: float = config_field(
        0.0,
        "the learning rate falls linearly from lr to this between versions lr_decay_start and lr_decay_end "
        "and stays there (a late, finer step for precise tasks); 0 = lr throughout",
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
        "... or once its first gradient is this old, with what has arrived (a slow or departed learner "
        "never stalls the others); 0 = wait for K",
    )
    staleness_power: float = config_field(
        1.0,
        "a step's gradients are averaged with weight batch_size / (1 + staleness)^p, staleness = versions "
        "between the gradient's weights and the step; 0 = by batch size only",
    )
    max_grad_norm: float = config_field(
        100.0,
        "the global L2 norm of a step's mean gradient (all groups) is clipped to this, so one wild push "
        "cannot poison Adam's moments; 0 = no clipping",
    )
    max_input_abs: float = config_field(
        1e6, "normalizer statistics implying an input beyond this magnitude are rejected (a learner's bad batch)"
    )
    expert_adam: str = config_field(
        "lazy",
        "MoE: 'lazy' steps Adam and the target critics' average only on experts a version's gradient "
        "touches (exact for experts never routed to, and for a task router whose tasks keep their experts; "
        "a dropped expert keeps its weights instead of drifting on old momentum), or 'dense' (every "
        "weight, every version); aggregator/sparse.py",
    )
    swa: str = config_field(
        "off",
        "actor weight averaging (aggregator/swa.py): 'layered' (a version joins only when the evaluator "
        "scored it at least as well as the average; routers over a short window, experts over a long one "
        "weighted by their activation), 'plain' (every scored version), or 'off'. On, the evaluator "
        "also scores the average (twice the curve episodes) and fleetrl export takes the better one",
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
