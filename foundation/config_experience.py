"""Config of the experience loop: the simulator, the samplers that act in it, and the buffer
that stores what they collect. `foundation.config.RunConfig` composes these sections.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from foundation.config_base import Check, config_field


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
    "MetaWorld-pick-place-v3",
    "MetaWorld-door-open-v3",
    "MetaWorld-drawer-open-v3",
    "MetaWorld-drawer-close-v3",
    "MetaWorld-button-press-topdown-v3",
    "MetaWorld-peg-insert-side-v3",
    "MetaWorld-window-open-v3",
    "MetaWorld-window-close-v3",
)
REWARDS = ("sparse", "shaped")  # sim.reward's values
# The Meta-World tasks (sim/metaworld.py), in task_id order.
METAWORLD_TASKS = tuple(name for name in TASK_NAMES if name.startswith("MetaWorld-"))
# The tasks with a shaped reward of their own (sim/metaworld.py): every Meta-World task.
SHAPED_TASKS = METAWORLD_TASKS
# The tasks with a scripted expert (sim/metaworld_experts.py, which checks this tuple): what
# sampler.demo_episodes can demonstrate. Every Meta-World task has one.
EXPERT_TASKS = METAWORLD_TASKS
# The tasks whose gripper can grasp their object (Reach has none; Push and Slide block the
# gripper): what sim.grasped_start can start with the object held (sim/grasped_start.py).
GRASP_TASKS = ("FetchPickAndPlace-v4",)


@dataclass(frozen=True)
class SimConfig:
    task: str = config_field(
        "FetchReach-v4", "task name from the sim registry (sim/registry.py); sim.tasks[0] when sim.tasks is set"
    )
    tasks: tuple[str, ...] = config_field(
        (),
        "a multi-task run's tasks, observations padded to one width plus a task one-hot; () = sim.task",
    )
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)
    control_hz: float = config_field(
        0.0,
        "decisions per simulated second at the task's own seconds and hand speed; 0 = the task's rate",
    )
    reward: str = config_field(
        "sparse",
        "'sparse': the goal reward with HER; 'shaped': a Meta-World task's own dense reward (sampler.her_k 0)",
    )
    grasped_start: float = config_field(
        0.0, "share of FetchPickAndPlace training episodes started with the object held"
    )

    def checks(self) -> list[Check]:
        """(ok, field, limit) of every check on this section's fields; RunConfig.validate runs them."""
        run_tasks = self.tasks or (self.task,)
        unshaped = [name for name in run_tasks if name not in SHAPED_TASKS]
        can_grasp = any(name in GRASP_TASKS for name in run_tasks)
        return [
            (
                not self.tasks or self.task == self.tasks[0],
                "task",
                f"sim.tasks[0] ({run_tasks[0]!r}) when sim.tasks is set: the run trains sim.tasks and is "
                "named and reported after sim.task; --tasks sets both",
            ),
            (self.control_hz >= 0, "control_hz", ">= 0 (0 = the task's own rate)"),
            (0.0 <= self.grasped_start <= 1.0, "grasped_start", "in [0, 1]"),
            (
                self.grasped_start == 0 or can_grasp,
                "grasped_start",
                f"0 for a run of {', '.join(run_tasks)}: only a task whose gripper can grasp "
                f"({', '.join(GRASP_TASKS)}) takes it",
            ),
            (self.reward in REWARDS, "reward", f"one of {REWARDS}"),
            (
                self.reward != "shaped" or not unshaped,
                "reward",
                f"'sparse' for a run with {', '.join(unshaped)}: only Meta-World tasks have a shaped reward of "
                "their own",
            ),
        ]


def tasks_overrides(tasks: Sequence[str]) -> list[str]:
    """The overrides of a run of `tasks`, as `--tasks` sets them: sim.tasks, and sim.task its first.

    with_overrides(RunConfig(), tasks_overrides(["FetchPush-v4", "FetchReach-v4"]))
    """
    return [f"sim.tasks={json.dumps(list(tasks))}", f"sim.task={json.dumps(tasks[0])}"]


@dataclass(frozen=True)
class BufferConfig:
    window_size_transitions: int = config_field(4096, "transitions per time window (the unit of eviction)")
    capacity_transitions: int = config_field(1_000_000, "transitions kept; the oldest window is dropped past this")
    max_batch_transitions: int = config_field(65_536, "largest TransitionBatch the ingest service accepts")
    key_prefix: str = config_field("fleetrl", "prefix of every Redis key this run writes")
    grpc_workers: int = config_field(4, "ingest service thread pool size")
    stalled_write_timeout_sec: float = config_field(
        30.0,
        "seconds before readers skip a reserved range still unwritten (its writer died)",
    )
    dedup_ttl_sec: int = config_field(
        3600, "a sampler incarnation's dedup record expires this long after its last push"
    )
    replicas_to_ack: int = config_field(
        0,
        "Redis replicas that must hold a batch (WAIT) before it is acked; 0 = the primaries",
    )
    replica_wait_ms: int = config_field(2000, "how long one WAIT for replicas may take before the push fails")
    samples_per_insert: float = config_field(
        0.0,
        "rows learners sample per row stored (flow control); 0 = derived from the replay ratio",
    )
    rate_tolerance_rows: int = config_field(
        0, "stored rows samplers may run ahead of (and learners behind) that ratio; 0 = the samplers' warm-up"
    )
    durable: bool = config_field(
        True, "fleetrl train keeps its Redis data in <run_dir>/redis, so --resume finds the buffer as it was"
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
        "HER copies per transition of an episode whose achieved goal never moved; -1 = her_k",
    )
    random_steps: int = config_field(500, "env steps per sampler with uniform random actions before the policy acts")
    demo_episodes: int = config_field(
        0,
        "Meta-World scripted-expert episodes per task stored at the start of a run, marked demo; 0 = none",
    )
    random_action_prob: float = config_field(
        0.0,
        "share of acting steps taken uniformly at random (HER's epsilon exploration)",
    )
    random_keep_dims: int = config_field(
        0,
        "trailing action dims a random step takes from the policy (1: the gripper keeps its grasp)",
    )
    random_action_repeat: int = config_field(
        1,
        "env steps a random step's action is held for (temporally extended epsilon); 1 = one",
    )
    push_timeout_sec: float = config_field(10.0, "deadline of one Push call; it is retried until acked")
    weights_interval_sec: float = config_field(0.2, "fetch new actor weights at most this often")
    max_env_steps_per_update: float = config_field(
        3.0,
        "the replay ratio: env steps collected per gradient of batch_size rows; 0 = no flow control",
    )
    pin_cpus: bool = config_field(True, "pin each worker to one CPU (round-robin over allowed CPUs)")
    mlock: bool = config_field(True, "mlockall the worker's memory; degrades with a warning when refused")
    seed: int = config_field(
        0, "base seed; each sampler mixes in its index and incarnation, so restarts never replay episodes"
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
            (self.demo_episodes >= 0, "demo_episodes", ">= 0 (0 = no demonstrations)"),
            (self.her_k_unmoved >= -1, "her_k_unmoved", ">= -1 (-1: her_k)"),
            (0.0 <= self.random_action_prob <= 1.0, "random_action_prob", "in [0, 1]"),
            (self.random_keep_dims >= 0, "random_keep_dims", ">= 0"),
            (self.random_action_repeat >= 1, "random_action_repeat", ">= 1"),
            (self.max_env_steps_per_update >= 0, "max_env_steps_per_update", ">= 0"),
        ]
