"""Typed, frozen configuration: one dataclass per role, composed into `RunConfig`.

Only the CLI parses arguments; every library class takes one of these. Each field carries a
help line in its metadata (shown by `fleetrl train --help-config`). Cross-field checks run
once, in `RunConfig.validate()`, at launch.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import pathlib
import typing
from dataclasses import dataclass, field
from typing import Any

from foundation.errors import FleetrlError
from foundation.policy import MODEL_KINDS, ROUTERS
from foundation.wire import WIRE_DTYPES


def config_field(default: Any, help: str) -> Any:
    """A dataclass field with a help line; tuples and other immutables only."""
    return field(default=default, metadata={"help": help})


class ConfigError(FleetrlError, ValueError):
    """A configuration value is out of range; the message names the field and the limit."""

    label = "config error"


Check = tuple[bool, str, str]  # a section's check: (it passed, the field it names, the limit a message gives)


@dataclass(frozen=True)
class RandomizationConfig:
    """Domain randomization ranges. Scales multiply the model's nominal value."""

    enabled: bool = config_field(True, "apply the ranges below; False gives the nominal task")
    mass_scale: tuple[float, float] = config_field((0.8, 1.2), "per episode: object body mass scale")
    friction_scale: tuple[float, float] = config_field((0.8, 1.2), "per episode: geom sliding friction scale")
    damping_scale: tuple[float, float] = config_field((0.8, 1.2), "per episode: joint damping scale")
    weld_stiffness_scale: tuple[float, float] = config_field(
        (0.8, 1.2), "per episode: mocap weld stiffness scale (Fetch's arm follows the mocap weld)"
    )
    action_scale: tuple[float, float] = config_field((0.9, 1.1), "per episode: multiplier on the action")
    obs_noise_std: float = config_field(0.001, "per step: std of Gaussian noise added to observations")
    action_latency_steps: tuple[int, int] = config_field(
        (0, 0), "per episode: actions take effect k steps late, k drawn from this range"
    )


# The names sim/registry.py registers, in task_id order: what validate() accepts as sim.task.
# The config sits below the roles and imports none of them, so the names are kept here too;
# sim/registry.py refuses to import when its TASKS and this tuple differ.
TASK_NAMES = (
    "FetchReach-v4",
    "FetchPush-v4",
    "FetchPickAndPlace-v4",
    "FetchSlide-v4",
    "MetaWorld-reach-v3",
    "MetaWorld-push-v3",
)


@dataclass(frozen=True)
class SimConfig:
    task: str = config_field("FetchReach-v4", "task name from the sim registry (sim/registry.py)")
    tasks: tuple[str, ...] = config_field(
        (),
        "a multi-task run's tasks (sim/tasks.py: observations padded to one width plus a task one-hot); "
        "() = sim.task alone",
    )
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)
    control_hz: float = config_field(
        0.0, "decisions per simulated second (sim/rate.py: same seconds and hand speed); 0 = Fetch's own 25 Hz"
    )

    def checks(self) -> list[Check]:
        """(ok, field, limit) of every check on this section's fields; RunConfig.validate runs them."""
        return [
            (self.control_hz >= 0, "control_hz", ">= 0 (0 = the task's own rate)"),
        ]


@dataclass(frozen=True)
class BufferConfig:
    window_size_transitions: int = config_field(4096, "transitions per time window (the unit of eviction)")
    capacity_transitions: int = config_field(1_000_000, "transitions kept; the oldest window is dropped past this")
    max_batch_transitions: int = config_field(65_536, "largest TransitionBatch the ingest service accepts")
    key_prefix: str = config_field("fleetrl", "prefix of every Redis key this run writes")
    grpc_workers: int = config_field(4, "ingest service thread pool size")
    stalled_write_timeout_sec: float = config_field(
        30.0,
        "a reserved range still unwritten after this long (its ingest and its sampler died) is skipped, "
        "so readers move on; a late retry of it is stored elsewhere",
    )
    dedup_ttl_sec: int = config_field(
        3600, "a sampler incarnation's dedup record expires this long after its last push"
    )
    replicas_to_ack: int = config_field(
        0,
        "Redis replicas that must hold a batch (WAIT) before it is acked: with replicas in the cluster, set "
        "it to 1 so a primary's crash loses no acked transition; 0 = ack once the primaries hold it",
    )
    replica_wait_ms: int = config_field(2000, "how long one WAIT for replicas may take before the push fails")
    samples_per_insert: float = config_field(
        0.0,
        "flow control (buffer/ratelimit.py): rows learners sample per row stored; 0 = learner.batch_size / "
        "(sampler.max_env_steps_per_update * (1 + her_k)), none when that is <= 0",
    )
    rate_tolerance_rows: int = config_field(
        0, "stored rows samplers may run ahead of (and learners behind) that ratio; 0 = the samplers' warm-up"
    )

    def checks(self) -> list[Check]:
        """(ok, field, limit) of every check on this section's fields; RunConfig.validate runs them."""
        return [
            (self.window_size_transitions >= 1, "window_size_transitions", ">= 1"),
            (self.stalled_write_timeout_sec > 0, "stalled_write_timeout_sec", "> 0"),
            (
                self.dedup_ttl_sec >= 60,
                "dedup_ttl_sec",
                ">= 60: a sampler retrying after its record expired would store its batch twice",
            ),
            (
                self.capacity_transitions >= 2 * self.window_size_transitions,
                "capacity_transitions",
                ">= 2 * window_size_transitions: eviction drops a whole window",
            ),
            (self.replicas_to_ack >= 0, "replicas_to_ack", ">= 0"),
            (self.replica_wait_ms >= 1, "replica_wait_ms", ">= 1"),
        ]


@dataclass(frozen=True)
class SamplerConfig:
    num_samplers: int = config_field(1, "sampler worker processes the local launcher starts")
    her_k: int = config_field(4, "HER 'future' relabeled copies stored per transition (0 disables HER)")
    her_k_unmoved: int = config_field(
        -1,
        "HER copies stored per transition of an episode whose achieved goal never left its first "
        "success region (FetchPush: the object never moved); fewer make the episodes that moved "
        "it a larger share of every batch; -1 = her_k",
    )
    random_steps: int = config_field(500, "env steps per sampler with uniform random actions before the policy acts")
    random_action_prob: float = config_field(
        0.0,
        "share of acting steps taken uniformly at random (HER's epsilon exploration): keeps exploring "
        "after SAC's temperature has fallen",
    )
    action_noise_std: float = config_field(
        0.2, "learner.algo 'ddpg': std of the Gaussian noise added to the actor's action (the HER paper's 0.2)"
    )
    push_timeout_sec: float = config_field(10.0, "deadline of one Push call; it is retried until acked")
    weights_interval_sec: float = config_field(0.2, "fetch new actor weights at most this often")
    max_env_steps_per_update: float = config_field(
        3.0,
        "the replay ratio: env steps collected per gradient of learner.batch_size rows, kept by the "
        "buffer's flow control (samplers wait when learners lag, learners when samplers do; the "
        "samplers' random_steps come first); 0 = no flow control",
    )
    pin_cpus: bool = config_field(True, "pin each worker to one CPU (round-robin over allowed CPUs)")
    mlock: bool = config_field(True, "mlockall the worker's memory; degrades with a warning when refused")
    seed: int = config_field(
        0, "base seed; each sampler process mixes in its index and incarnation, so restarts never replay episodes"
    )

    def checks(self) -> list[Check]:
        """(ok, field, limit) of every check on this section's fields; RunConfig.validate runs them."""
        return [
            (self.num_samplers >= 1, "num_samplers", ">= 1: no sampler, no data"),
            (
                self.weights_interval_sec >= 0,
                "weights_interval_sec",
                ">= 0: the aggregator refuses a negative interval and samplers would never get weights",
            ),
            (self.her_k >= 0, "her_k", ">= 0"),
            (self.action_noise_std >= 0, "action_noise_std", ">= 0"),
            (self.her_k_unmoved >= -1, "her_k_unmoved", ">= -1 (-1: her_k)"),
            (0.0 <= self.random_action_prob <= 1.0, "random_action_prob", "in [0, 1]"),
            (self.max_env_steps_per_update >= 0, "max_env_steps_per_update", ">= 0"),
        ]


REPLAY_SAMPLING = ("uniform", "recency", "version")
AUTOCAST = ("off", "bf16")  # learner.autocast
TASK_SAMPLING = ("even", "success")  # learner.task_sampling: learner/task_schedule.py
SWA_MODES = ("off", "plain", "layered")  # aggregator.swa: aggregator/swa.py
DEVICES = ("auto", "cpu", "cuda")  # learner.device
ALGOS = ("sac", "ddpg")


@dataclass(frozen=True)
class LearnerConfig:
    num_learners: int = config_field(1, "learner processes the local launcher starts")
    batch_size: int = config_field(256, "transitions per gradient")
    hidden_sizes: tuple[int, ...] = config_field((256, 256), "hidden layer widths of actor and critics")
    gamma: float = config_field(0.95, "discount; 0.95 with 50-step Fetch episodes as in the HER paper")
    min_replay_transitions: int = config_field(1000, "learner waits until the buffer holds this many")
    max_grad_staleness: int = config_field(1, "learner waits for fresher weights past this many versions behind")
    algo: str = config_field(
        "sac",
        "'sac', or 'ddpg' (the HER paper's: deterministic actor, one critic, action penalty, "
        "samplers add sampler.action_noise_std Gaussian noise); same networks and weight groups",
    )
    action_l2: float = config_field(1.0, "'ddpg': weight of the actor's penalty on the squared action")
    target_entropy: float | None = config_field(None, "SAC target entropy; None = -action_dim")
    torch_threads: int = config_field(
        1, "torch intra-op threads in the learner (2 made 0.75x the updates/s of 1 in a 2-core Push fleet: fleet_arms)"
    )
    device: str = config_field("auto", "where the learner computes: 'cpu', 'cuda', or 'auto' (cuda when available)")
    autocast: str = config_field(
        "off",
        "'off', or 'bf16': losses and their backward under torch.autocast bfloat16 (on CPUs with BF16 "
        "instructions); weights, gradients and Adam stay float32. An option until a learning comparison",
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
        "keeps task_min_share and the unsolved ones get the learner; learner/task_schedule.py)",
    )
    task_min_share: float = config_field(0.1, "'success' task sampling: the least share of a batch any task keeps")
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
            (self.device in DEVICES, "device", f"one of {_one_of(DEVICES)}"),
            (
                self.gradient_wire_dtype in WIRE_DTYPES,
                "gradient_wire_dtype",
                f"one of {_one_of(WIRE_DTYPES)} (foundation.wire.WIRE_DTYPES)",
            ),
            (
                self.replay_sampling in REPLAY_SAMPLING,
                "replay_sampling",
                "one of " + ", ".join(repr(name) for name in REPLAY_SAMPLING),
            ),
            (self.recency_half_life >= 1, "recency_half_life", ">= 1"),
            (self.task_sampling in TASK_SAMPLING, "task_sampling", f"one of {_one_of(TASK_SAMPLING)}"),
            (self.autocast in AUTOCAST, "autocast", f"one of {_one_of(AUTOCAST)}"),
            (0.0 <= self.task_min_share <= 1.0, "task_min_share", "in [0, 1]"),
            (self.max_policy_lag >= 0, "max_policy_lag", ">= 0"),
            (0.0 < self.gamma < 1.0, "gamma", "in (0, 1)"),
            (self.algo in ALGOS, "algo", f"one of {ALGOS}"),
        ]


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
    expert_width: int = config_field(
        128,
        "'moe': width of every expert (each MoE hidden layer; as many layers as learner.hidden_sizes); "
        "0 = learner.hidden_sizes. 128 with top_k 2 is the dense default's active width (2 x 128 = 256)",
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
    balance_coef: float = config_field(0.01, "'moe': weight of the routers' load-balancing loss")
    router_decay: float = config_field(
        1.0,
        "'moe': lambda of router decay: the balancing loss is scaled by exp(-lambda * ||policy gradient||), "
        "so routing may specialize while the gradient is large",
    )

    def checks(self) -> list[Check]:
        """(ok, field, limit) of every check on this section's fields; RunConfig.validate runs them."""
        return [
            (self.kind in MODEL_KINDS, "kind", f"one of {_one_of(MODEL_KINDS)}"),
            (self.experts >= 1, "experts", ">= 1"),
            (self.router in ROUTERS, "router", f"one of {_one_of(ROUTERS)}"),
            (1 <= self.top_k <= self.experts, "top_k", "in 1..model.experts"),
            (self.task_embed_dim >= 1, "task_embed_dim", ">= 1"),
            (self.expert_width >= 0, "expert_width", ">= 0 (0 = learner.hidden_sizes)"),
        ]


@dataclass(frozen=True)
class AggregatorConfig:
    lr: float = config_field(1e-3, "Adam learning rate of actor, critics and temperature")
    tau: float = config_field(0.05, "target critic Polyak factor per version")
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

    def checks(self) -> list[Check]:
        """(ok, field, limit) of every check on this section's fields; RunConfig.validate runs them."""
        return [
            (0.0 < self.tau <= 1.0, "tau", "in (0, 1]"),
            (self.lr > 0, "lr", "> 0"),
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
            (self.swa in SWA_MODES, "swa", f"{_one_of(SWA_MODES[:-1])} or {SWA_MODES[-1]!r}"),
            (
                1 <= self.swa_router_window <= self.swa_expert_window,
                "swa_router_window",
                "in 1..aggregator.swa_expert_window",
            ),
        ]


@dataclass(frozen=True)
class EvalConfig:
    episodes: int = config_field(
        50, "episodes of a full score, the only kind that can reach the target (ends early once out of reach)"
    )
    curve_episodes: int = config_field(
        10, "episodes of every curve score: a fixed budget, never cut short; a full score continues it"
    )
    final_episodes: int = config_field(
        50,
        "episodes of the final score: when a run ends short of its target, the launcher scores its last "
        "checkpoint on this many episodes, never cut short (summary.json final_success); 0 = none",
    )
    seed: int = config_field(1_000_000, "held-out seeds start here, far from every sampler's seeds")
    randomize: bool = config_field(False, "evaluate under domain randomization instead of the nominal task")
    min_interval_sec: float = config_field(
        2.0, "seconds between scores early in a run and once curve success is within reach of the target"
    )
    max_interval_sec: float = config_field(60.0, "seconds between scores at most, while success is far off")
    near_max_interval_sec: float = config_field(
        16.0,
        "near the target, each score that sets no new best curve success doubles the wait from "
        "min_interval_sec, up to this (within the two limits above): a plateau just short of the target is "
        "not scored every 2 s for an hour",
    )
    interval_run_fraction: float = config_field(
        0.1,
        "while curve success is below half the target, wait this fraction of the run's age between scores "
        "(within the two limits above): evaluation costs a bounded share of a long run",
    )
    stop_early: bool = config_field(
        True, "end a score once target_success is out of reach (it then covers fewer episodes)"
    )
    nice: int = config_field(5, "niceness of the evaluator process: it scores on spare CPU first")

    def checks(self) -> list[Check]:
        """(ok, field, limit) of every check on this section's fields; RunConfig.validate runs them."""
        return [
            (self.episodes >= 1, "episodes", ">= 1"),
            (self.final_episodes >= 0, "final_episodes", ">= 0"),
            (
                0 <= self.seed and self.seed + max(self.episodes, self.final_episodes) <= 2**21,
                "seed",
                "in [0, 2**21 - eval.episodes (or eval.final_episodes)]: training episodes draw their seeds "
                "from 2**21 up",
            ),
            (
                1 <= self.curve_episodes <= self.episodes,
                "curve_episodes",
                "in [1, eval.episodes]: a full score continues the curve score's episodes",
            ),
            (0 <= self.min_interval_sec <= self.max_interval_sec, "min_interval_sec", "in [0, eval.max_interval_sec]"),
            (self.near_max_interval_sec >= 0, "near_max_interval_sec", ">= 0"),
            (self.interval_run_fraction >= 0, "interval_run_fraction", ">= 0"),
        ]


@dataclass(frozen=True)
class WatchdogConfig:
    """How the watchdog (fleetrl train, fleetrl fleet up) supervises every role process."""

    heartbeat_timeout_sec: float = config_field(
        60.0, "a role whose heartbeat is this old is taken as hung (SIGSTOP, deadlock) and restarted"
    )
    max_restarts: int = config_field(3, "restart budget: this many restarts of one role in a burst ...")
    restart_refill_sec: float = config_field(600.0, "... and one more every this many seconds, up to max_restarts")
    backoff_first_sec: float = config_field(1.0, "the 2nd restart in a row waits this long, each next twice as long")
    backoff_max_sec: float = config_field(30.0, "longest wait before a restart")

    def checks(self) -> list[Check]:
        """(ok, field, limit) of every check on this section's fields; RunConfig.validate runs them."""
        return [
            (self.heartbeat_timeout_sec >= 3, "heartbeat_timeout_sec", ">= 3 (beats: 1-2 s)"),
            (self.max_restarts >= 0, "max_restarts", ">= 0"),
            (
                0 <= self.backoff_first_sec <= self.backoff_max_sec,
                "backoff_first_sec",
                "in [0, watchdog.backoff_max_sec]",
            ),
        ]


@dataclass(frozen=True)
class SecurityConfig:
    """Who may talk to the fleet. Secrets themselves never go into a config file: only paths."""

    enabled: bool = config_field(
        True, "false: no token, no Redis password, no TLS (a trusted single-user machine; benchmarks compare)"
    )
    token_file: str = config_field(
        "", "file holding the fleet token every RPC must carry; '' = the FLEETRL_TOKEN environment variable"
    )
    tls_cert: str = config_field("", "PEM server certificate (with tls_key): services serve TLS; see fleetrl certs")
    tls_key: str = config_field("", "PEM private key of tls_cert")
    tls_ca: str = config_field("", "PEM CA: clients verify services against it (and services verify clients)")
    tls_client_auth: bool = config_field(False, "services require client certificates signed by tls_ca")
    redis_user: str = config_field("fleetrl", "Redis ACL user of the run (the nodes fleetrl starts create it)")
    redis_password_file: str = config_field(
        "", "file holding the Redis password; '' = the FLEETRL_REDIS_PASSWORD environment variable"
    )


_CHECKED_SECTIONS = ("sim", "buffer", "sampler", "learner", "model", "aggregator", "eval", "watchdog")


@dataclass(frozen=True)
class RunConfig:
    run_id: str = config_field("run", "names the run's Redis keys and its run directory")
    run_dir: str = config_field("runs/run", "where config, checkpoints, TensorBoard events and summary go")
    target_success: float = config_field(0.9, "stop when the evaluator reports at least this success rate")
    max_wall_sec: float = config_field(600.0, "stop after this many seconds whatever the success")
    max_env_steps: int = config_field(0, "stop after this many env steps; 0 = no limit")
    preset: str = config_field("", "task preset applied under the overrides (fleet/presets.py); '' = none")
    sim: SimConfig = field(default_factory=SimConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    aggregator: AggregatorConfig = field(default_factory=AggregatorConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)

    def validate(self) -> RunConfig:
        """Every section's checks (each beside its fields), then the run's own; run once at
        launch. Returns self so calls can chain."""
        checks = [
            (ok, f"{name}.{field_name}", limit)
            for name in _CHECKED_SECTIONS
            for ok, field_name, limit in getattr(self, name).checks()
        ]
        checks.append((0.0 <= self.target_success <= 1.0, "target_success", "in [0, 1]"))
        checks.append(
            (
                self.learner.task_min_share * max(len(self.sim.tasks), 1) <= 1.0,
                "learner.task_min_share",
                "in [0, 1 / the run's tasks]: every task's least share must fit in one batch",
            )
        )
        for ok, name, limit in checks:
            if not ok:
                raise ConfigError(f"{name} ({_get(self, name)!r}) must be {limit}", field=name)
        self._check_task()
        return self

    def _check_task(self) -> None:
        if self.sim.task not in TASK_NAMES:
            raise ConfigError(
                f"sim.task ({self.sim.task!r}) must be a registered task{_suggest(self.sim.task, TASK_NAMES)}",
                field="sim.task",
            )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        return _from_dict(cls, json.loads(text))

    @classmethod
    def load(cls, path: str | pathlib.Path) -> RunConfig:
        return cls.from_json(pathlib.Path(path).read_text())


def _one_of(names: tuple[str, ...]) -> str:
    """'a', 'b', 'c': the names as a message lists them."""
    return ", ".join(repr(name) for name in names)


def _suggest(value: str, choices: Any) -> str:
    """'; did you mean X? valid: A, B, C' for a value outside `choices`."""
    names = sorted(choices)
    close = difflib.get_close_matches(value, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} valid: {', '.join(names)}"


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _from_dict(cls: Any, data: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    names = {f.name for f in dataclasses.fields(cls)}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"unknown config field {cls.__name__}.{key}{_suggest(key, names)}")
        kwargs[key] = _coerce(hints[key], value, f"{cls.__name__}.{key}")
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """Turn a JSON value (or an override string parsed as JSON) into the field's type."""
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be an object, got {value!r}")
        return _from_dict(tp, value)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, where) for v in value)
        if len(value) != len(args):
            raise ConfigError(f"{where} must be a list of {len(args)} items, got {value!r}")
        return tuple(_coerce(t, v, where) for t, v in zip(args, value, strict=True))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)][0]
        return _coerce(inner, value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    return value


def with_overrides(config: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply `section.field=value` overrides (value parsed as JSON, else taken as a string)."""
    data = dataclasses.asdict(config)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.field=value")
        dotted, raw = item.split("=", 1)
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            if part not in node or not isinstance(node[part], dict):
                sections = [k for k, v in node.items() if isinstance(v, dict)]
                raise ConfigError(f"unknown config section {dotted!r}{_suggest(part, sections)}")
            node = node[part]
        if parts[-1] not in node:
            raise ConfigError(f"unknown config field {dotted!r}{_suggest(parts[-1], node)}")
        node[parts[-1]] = value
    return _from_dict(RunConfig, data)


def help_lines(config: Any = None, prefix: str = "") -> list[str]:
    """One `name = value  # help` line per field of `config` (default: the built-in defaults),
    nested sections flattened; a value that differs from the built-in default is marked."""
    config = RunConfig() if config is None else config
    lines = []
    for f in dataclasses.fields(config):
        name = prefix + f.name
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            lines.extend(help_lines(value, name + "."))
        else:
            mark = "" if value == f.default else f"  [default {f.default!r}]"
            lines.append(f"{name} = {value!r}{mark}  # {f.metadata.get('help', '')}")
    return lines
