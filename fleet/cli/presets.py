"""Per-task defaults, chosen by measurement: what `fleetrl train --task X` starts from.

    config = preset_config("FetchPush-v4")                 # RunConfig with the preset applied
    config = with_overrides(config, ["learner.batch_size=512"])   # the user's overrides still win
    config = with_overrides(preset_for(user, overrides), overrides)   # what the CLI does: user = defaults + overrides

A preset is a set of `section.field` overrides on the built-in defaults (which are the
FetchReach preset). Each entry says why; the figures behind them are in
docs/presets.md and benchmarks/results/. A run of several tasks adds the multi-task recipe
(MULTITASK; MULTITASK_BATCH for a dense policy or a task-routed MoE; TASK_ROUTED_MOE and
TASK_ROUTED_SHARED for the latter). `fleetrl config --task X` (or `--tasks A,B`) prints the preset in force.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection
from typing import Any

from foundation.config import ModelConfig, RunConfig, with_overrides

# The harder Fetch tasks share one recipe: the object must first be touched by chance, and
# the sparse reward only then says anything. Why each value (runs in docs/presets.md):
#   random_action_prob 0.3  HER's epsilon exploration: SAC's temperature falls to ~1e-3 within
#                       8k updates on Push (measured), after which a Gaussian policy stops
#                       finding the object; uniform actions on 30% of steps keep finding it
#   gamma 0.95, batch 256, one env step per update: the settings of the one peer measured to
#                       leave chance on Push here (SBX SAC+HER: 0.2-0.4 from ~125k updates).
#                       gamma 0.98 with 2-3 env steps per update (batch 256 or 512) stayed at
#                       0.00 curve success for 20 and 30 minutes (docs/presets.md).
#   her_k_unmoved 0     an episode that never moved the object stores no HER copies (4 for one
#                       that moved it): its relabeled goals are free successes where the object
#                       already lies, so without them the episodes that moved it are a larger
#                       share of every batch. FetchPush, one core each (--mode sync): 1 copy
#                       reached 90% on 50 episodes at 89.7k updates (seed 0, 22.7 min), where 4
#                       copies were at chance after 200k updates (55 min); 0 copies reached it at
#                       49.8k and 46.4k updates (seeds 1 and 2, 13.1 and 13.0 min), seeds that
#                       with 1 copy had not in the 30-minute fleet runs (0.72 and 0.68).
_MANIPULATION: dict[str, Any] = {
    "learner.gamma": 0.95,
    "learner.batch_size": 256,
    "sampler.random_action_prob": 0.3,
    "sampler.max_env_steps_per_update": 1.0,
    "sampler.her_k_unmoved": 0,
}

# FetchPickAndPlace adds to that recipe (docs/presets.md, "random steps keep the gripper"):
#   random_keep_dims 1  a random step draws the arm's 3 dimensions and takes the gripper's from
#                       the policy, so a grasp survives the 30% of random steps a lift crosses.
#                       Without it the policy pushes and does not lift: 0.64 and 0.62 held-out at
#                       60 min (seed 0, two learners and one), air goals met 22%, object lifted on
#                       24% of them. (Push and Slide block the gripper: nothing there to keep.)
#   num_learners 2, grads_per_step 1, max_grad_staleness 2: the two-learner settings every
#                       measured arm of it used (with them alone, seed 0 plateaued at 0.64).
#   Together, 60-minute cap, one idle 2-core AMD host: 90% on 50 held-out episodes on seeds 0, 1
#                       and 2 in 18.4, 40.9 and 31.5 min (median 31.5; 191,850-301,450 env steps),
#                       the object lifted on 95% of the air goals (pickandplace-keep1-summary.json).
_PICK_AND_PLACE: dict[str, Any] = {
    **_MANIPULATION,
    "sampler.random_keep_dims": 1,
    "learner.num_learners": 2,
    "aggregator.grads_per_step": 1,
    "learner.max_grad_staleness": 2,
}

# FetchPush adds to that recipe, measured on its own (docs/presets.md, "FetchPush-v4, preset 7"):
#   batch_size 1024, max_env_steps_per_update 4: 4x the rows per gradient and 4 env steps per
#                       gradient, so as many env steps per row learned as preset 5's 1 per 256.
#   autocast "auto"     bfloat16 losses where the learner's CPU has BF16 instructions, else float32.
#   num_learners 2, grads_per_step 1, max_grad_staleness 2: both cores learn.
#   min_replay_transitions 2000: a first batch of 1024 rows from more than a few episodes.
#   Seeds 0-2, 15-minute cap, one idle 2-core AMD host with BF16 instructions: 90% on 50 held-out
#                       episodes in 5.0, 5.4 and 7.6 min (median 5.4) in bfloat16, and in 7.6, 9.6
#                       and 8.2 (median 8.2) in float32 (what a CPU without BF16 runs). Preset 5:
#                       12.3 min median (stop 32's host); on this kind of host one learner missed
#                       20 min on 2 seeds of 3. One learner in bfloat16: 5.8, 5.1, 5.8.
#   A multi-task run does not take the batch, precision, env steps and first batch (SINGLE_TASK_ONLY):
#                       the dense multi-task runs measured used preset 5's batch 256, float32 and 1
#                       env step per gradient (MULTITASK sets its own first batch); a task-routed
#                       MoE (since stop 47) and a dense policy (since stop 48) take FetchPush's three
#                       again with the multi-task recipe (MULTITASK_BATCH).
_PUSH_ALONE: dict[str, Any] = {
    "learner.batch_size": 1024,
    "sampler.max_env_steps_per_update": 4.0,
    "learner.autocast": "auto",
    "learner.num_learners": 2,
    "aggregator.grads_per_step": 1,
    "learner.max_grad_staleness": 2,
    "learner.min_replay_transitions": 2000,
}
SINGLE_TASK_ONLY = frozenset(
    {"learner.batch_size", "sampler.max_env_steps_per_update", "learner.autocast", "learner.min_replay_transitions"}
)

# FetchSlide takes FetchPush's whole recipe and adds (docs/presets.md, "FetchSlide-v4"):
#   randomization.enabled false  the nominal task, as the zoo and the SB3/SBX peers train: a slide's
#                       length follows the table's friction and the hit's speed, and a policy cannot
#                       see the friction before it hits. Randomized, the recipe scored 0.46 held-out
#                       at 60 min (preset 5: 0.44; seed 0).
#   gamma 0.98          1 - 1/T for 50-step episodes (the HER paper's): a puck succeeds 10-20 steps
#                       after the hit. On the nominal task, seed 0: 0.74 at 60 against 0.64 with 0.95.
#   both together       seeds 0-4, 60-minute cap, one idle 2-core AMD host with BF16
#                       instructions: 0.74, 0.76, 0.70, 0.60 and 0.68 held-out at the end (the
#                       live policy; seeds 3 and 4 kept a weight average beside it), median 0.70
#                       (randomized recipe 0.46). The price on randomized dynamics (fleetrl
#                       deploy-check drives the run's ranges even where it trained without
#                       them): seed 1's final policy 26/50 there against 38/50 nominal.
#   A multi-task run takes neither (SLIDE_ALONE_ONLY): they were measured for Slide alone.
_SLIDE_ALONE: dict[str, Any] = {
    "learner.gamma": 0.98,
    "sim.randomization.enabled": False,
}
SLIDE_ALONE_ONLY = frozenset(_SLIDE_ALONE)
# Every field a multi-task run does not take from a task's preset as the preset sets it.
ALONE_ONLY = SINGLE_TASK_ONLY | SLIDE_ALONE_ONLY
# ... and takes preset 5's value of those a manipulation preset sets (batch 256, 1 env step per
# gradient, gamma 0.95), not the built-in defaults' (3 env steps per gradient: Reach's, never
# measured there); the domain randomization stays the default (on).
_MULTITASK_BASE: dict[str, Any] = {k: v for k, v in _MANIPULATION.items() if k in ALONE_ONLY}

TASK_PRESETS: dict[str, dict[str, Any]] = {
    "FetchReach-v4": {},  # the built-in defaults: 90% in ~20 s here
    "FetchPush-v4": _MANIPULATION | _PUSH_ALONE,
    "FetchPickAndPlace-v4": dict(_PICK_AND_PLACE),
    "FetchSlide-v4": _MANIPULATION | _PUSH_ALONE | _SLIDE_ALONE,
}


# A run of several tasks: the recipe of every 4-task run (FetchReach, FetchPush, MetaWorld-reach,
# MetaWorld-push) that pushed; no run without it did (docs/presets.md, "Multi-task"):
#   task_sampling "focus"  each task keeps learner.task_min_share, the rest goes to the first task
#                       in --tasks order still below target_success. With "success" shares the
#                       never-solved MetaWorld-push took as much as FetchPush, which scored 0.00 on
#                       every curve score (MoE, 19 min; dense and MoE at 45 min: 0.30 and 0.18);
#                       with "focus" FetchPush reached 90% in the dense run and every MoE run.
#   task_alpha true     one SAC temperature per task: a solved task's near-deterministic actor
#                       otherwise holds the shared temperature where an unsolved task's policy
#                       stays noisier than its target (FetchReach + FetchPush: 0.1-0.2 at 42-45k
#                       updates against 0.00).
#   min_replay_transitions 2000 (or the batch, if larger): the first batch has rows of every task.
#   num_learners 2, grads_per_step 1, max_grad_staleness 2: two learners whose every gradient
#                       steps the optimizer alone (K=1) on weights at most 2 versions old. 4 tasks,
#                       45 min, seeds 0-2, one AMD host of 2 cores: the MoE's mean held-out success
#                       0.74, 0.73, 0.68 against 0.495, 0.660, 0.655 with one learner (48 against
#                       ~30 updates/s), dense's 0.705, 0.70, 0.70 against 0.625, 0.610, 0.660:
#                       better on all 6 seed pairs, FetchPush pushed on every seed of both arms.
MULTITASK: dict[str, Any] = {
    "learner.task_sampling": "focus",
    "model.task_alpha": True,
    "learner.min_replay_transitions": 2000,
    "learner.num_learners": 2,
    "aggregator.grads_per_step": 1,
    "learner.max_grad_staleness": 2,
}
# ... and with a task-routed MoE (model.kind "moe", model.router "task"), tasks share no weight:
#   task_onehot false   a one-hot constant within a task is a second first-layer bias; FetchPush
#                       alone through the multi-task path learned with it hidden (0.8 at 28k
#                       updates) and not with it read (0.0-0.1 through 25-35k).
#   task_heads true     one output layer per task: a shared one carried FetchReach's habit (the
#                       gripper to the goal) into FetchPush's policy.
#   gate_grad false     the task losses drove each task's gates to one expert within 4k updates,
#                       turning its layers toward another random matrix each time.
TASK_ROUTED_MOE: dict[str, Any] = {
    "model.task_onehot": False,
    "model.task_heads": True,
    "model.gate_grad": False,
}
# ... and its experts keep one shared per layer (TASK_ROUTED_SHARED, since stop 50): top_k 3, of
#   which expert 0 is in every task's routing and two are the task's own, at the same cost per row
#   (a task's k experts are mixed into one Linear). 4 tasks, 45 min, seeds 0-2, one idle AMD host
#   of 2 cores, with MULTITASK_BATCH: FetchPush 90% (curve) at 11.3, 14.6, 18.2 min against 13.2,
#   22.8, 24.6 without the shared expert (cost of sharing 0.92, 1.19, 1.48: <= 2 on every seed,
#   where 24.6 missed it), mean held-out success over the 4 tasks at 45 min 0.715, 0.725, 0.735
#   against 0.695, 0.74, 0.67 (dense: 0.73, 0.73, 0.74; shared minus dense -0.008, standard
#   error over the seeds 0.007). Held-out FetchPush at 45: 0.86, 0.90, 0.94 (without: 0.96,
#   0.98, 0.96). Only where the user left the routing alone (set neither model.top_k nor
#   model.shared_experts): a run that sets either keeps what it set, and `--set model.top_k=2`
#   runs the design's plain top-2.
TASK_ROUTED_SHARED: dict[str, Any] = {
    "model.top_k": 3,
    "model.shared_experts": 1,
}
# ... and a dense or task-routed MoE run learns at FetchPush's preset-7 batch (MULTITASK_BATCH:
#   batch 1024, 4 env steps per gradient, autocast "auto"). 4 tasks, 45 min, seeds 0-2, one idle
#   AMD host of 2 cores with BF16 instructions. The task-routed MoE, gates in float32 (stop 47):
#   FetchPush / FetchReach held-out at 45 min 0.96 / 1.00, 0.98 / 1.00, 0.96 / 1.00 (>= 0.9 on
#   every seed; at batch 256 FetchPush 0.74 on seed 2), FetchPush 90% (curve) at 13.2, 22.8, 24.6
#   min (40.9 on seed 2 at batch 256), mean over the 4 tasks 0.702 (0.717 at batch 256). The dense
#   policy (stop 48): means 0.73, 0.73, 0.74 against 0.705, 0.70, 0.70 at batch 256 (FetchPush
#   0.94, 0.92, 0.98 against 0.82, 0.88, 0.88), FetchPush 90% (curve) at 12.6, 15.9, 14.9 min.
#   A state-routed MoE keeps preset 5's batch (unmeasured with this one), and a CPU without BF16
#   instructions runs it in float32 (measured for FetchPush alone: median 8.2 min against 5.4).
MULTITASK_BATCH: dict[str, Any] = {
    "learner.batch_size": 1024,
    "sampler.max_env_steps_per_update": 4.0,
    "learner.autocast": "auto",
}


def preset_task(tasks: list[str]) -> str:
    """The task whose preset a run starts from: a multi-task run takes the first of its tasks
    with a non-empty preset, so `--tasks FetchReach-v4,FetchPush-v4` trains Push with the
    manipulation recipe (Reach's own preset is the defaults; the recipe leaves Reach's learning
    alone: its HER rule only touches episodes whose achieved goal never moved, and a Reach
    gripper always moves). A one-task run takes its task's."""
    return next((t for t in tasks if TASK_PRESETS.get(t)), tasks[0])


def _as_overrides(preset: dict[str, Any]) -> list[str]:
    return [f"{key}={json.dumps(value)}" for key, value in preset.items()]


def task_preset(task: str, multitask: bool = False) -> dict[str, Any]:
    """`task`'s preset ({} for a task without one); in a multi-task run the fields measured for
    the task alone (ALONE_ONLY) take preset 5's values where it sets them (_MULTITASK_BASE),
    their defaults elsewhere."""
    preset = TASK_PRESETS.get(task, {})
    if not multitask:
        return dict(preset)
    shared = {k: v for k, v in preset.items() if k not in ALONE_ONLY}
    return shared | {k: v for k, v in _MULTITASK_BASE.items() if k in preset}


def preset_overrides(task: str, multitask: bool = False) -> list[str]:
    """The preset as `section.field=json` override strings ([] for a task without one)."""
    return _as_overrides(task_preset(task, multitask))


def _task_routed_moe(user: RunConfig) -> bool:
    return user.model.kind == "moe" and user.model.router == "task"


def multitask_overrides(user: RunConfig, user_set: Collection[str] = ()) -> list[str]:
    """The multi-task recipe for a run the user set up as `user` ([] for a one-task run): MULTITASK,
    and MULTITASK_BATCH for a dense policy or a MoE with the task router, which takes
    TASK_ROUTED_MOE too, and TASK_ROUTED_SHARED where the user left its routing alone: neither
    field named in `user_set` (the `section.field` names the user set) nor changed from the
    design's (a state-routed MoE: none of them, unmeasured)."""
    if len(user.sim.tasks) < 2:
        return []
    moe = _task_routed_moe(user)
    batch = moe or user.model.kind == "dense"
    recipe = MULTITASK | (TASK_ROUTED_MOE if moe else {}) | (MULTITASK_BATCH if batch else {})
    design = ModelConfig()
    routing_left = (user.model.top_k, user.model.shared_experts) == (design.top_k, design.shared_experts)
    if moe and routing_left and TASK_ROUTED_SHARED.keys().isdisjoint(user_set):
        recipe |= TASK_ROUTED_SHARED
    # never below the user's batch (a check refuses fewer rows than one batch)
    recipe["learner.min_replay_transitions"] = max(recipe["learner.min_replay_transitions"], user.learner.batch_size)
    return _as_overrides(recipe)


def preset_for(user: RunConfig, overrides: Collection[str] = ()) -> RunConfig:
    """What a run starts from, chosen by what the user set (`user`: the built-in defaults with the
    user's `overrides`, `section.field=value` strings): its task's preset (preset_task) and, with
    several tasks, the multi-task recipe. The user's overrides go on top of it and win."""
    tasks = list(user.sim.tasks) or [user.sim.task]
    first = preset_task(tasks)
    extra = multitask_overrides(user, {o.split("=", 1)[0].strip() for o in overrides})
    config = preset_config(first, multitask=bool(extra))
    if not extra:
        return config
    added, contributors = _later_presets(tasks, first)
    recipe = "multi-task MoE" if _task_routed_moe(user) else "multi-task"
    label = " + ".join([*([config.preset] if config.preset else []), *contributors, recipe])
    return dataclasses.replace(with_overrides(config, [*added, *extra]), preset=label)


def _later_presets(tasks: list[str], first: str) -> tuple[list[str], list[str]]:
    """What the other tasks' presets add to the first's: the fields it does not set, the earlier
    task in --tasks order winning (FetchPickAndPlace's sampler.random_keep_dims joins Push's
    recipe in `--tasks FetchPush-v4,FetchReach-v4,FetchPickAndPlace-v4`; the gripper dimension it
    keeps is blocked, so ignored, in Reach and Push). Returns the overrides and the tasks that
    added something."""
    taken = task_preset(first, multitask=True)
    added: dict[str, Any] = {}
    contributors = []
    for task in tasks:  # the first task's fields are all taken: it adds nothing
        new = {k: v for k, v in task_preset(task, multitask=True).items() if k not in taken}
        if new:
            contributors.append(task)
            added |= new
            taken |= new
    return _as_overrides(added), contributors


def preset_config(task: str, base: RunConfig | None = None, multitask: bool = False) -> RunConfig:
    """`base` (default: built-in defaults) with `task` and its preset applied (`multitask`: as a
    multi-task run takes it, task_preset)."""
    config = dataclasses.replace(base or RunConfig(), preset=task if task in TASK_PRESETS else "")
    return with_overrides(config, [f"sim.task={json.dumps(task)}", *preset_overrides(task, multitask)])
